"""Server status endpoints: /health, /props, /slots, /metrics."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response

from .errors import ApiError, not_supported
from .generation_settings import props_default_params
from .json_io import json_response
from .metrics import CONTENT_TYPE
from .model_info import ftype_name, token_text
from .params import default_sampling
from .routes_openai import server_state

router = APIRouter()


@router.get("/health")
@router.get("/v1/health")
async def health(request: Request) -> Response:
    server_state(request).require_ready()  # the middleware already answers 503 while loading
    return json_response({"status": "ok"})


@router.get("/props")
async def props(request: Request) -> Response:
    state = server_state(request)
    state.require_ready()
    settings, model, engine = state.settings, state.model, state.engine
    template, tokenizer = model.chat_template, model.tokenizer
    return json_response({
        "default_generation_settings": {
            "params": props_default_params(default_sampling(settings), settings.n_predict, settings.n_keep,
                                           getattr(engine, "loras", [])),
            "n_ctx": engine.n_ctx_slot,
        },
        "total_slots": engine.n_parallel,
        "model_alias": state.model_name,
        "model_ftype": ftype_name(model.gguf.metadata),
        "model_path": str(model.path),
        "modalities": {"vision": False, "video": False, "audio": False},
        "media_marker": "<__media__>",
        "endpoint_slots": settings.slots_endpoint,
        "endpoint_props": False,
        "endpoint_metrics": settings.metrics,
        "ui": False,
        "ui_settings": {},
        "chat_template": template.source,
        "chat_template_caps": _template_caps(template),
        "bos_token": token_text(tokenizer, tokenizer.bos_id),
        "eos_token": token_text(tokenizer, tokenizer.eos_id),
        "build_info": settings.build_info,
        "is_sleeping": False,
        "cors_proxy_enabled": False,
    })


def _template_caps(template) -> dict:
    supports_tools = bool(getattr(template, "supports_tools", False))
    return {
        "supports_object_arguments": False,
        "supports_parallel_tool_calls": False,
        "supports_preserve_reasoning": False,
        "supports_reasoning_effort": False,
        "supports_string_content": True,
        "supports_system_role": True,
        "supports_tool_calls": supports_tools,
        "supports_tools": supports_tools,
        "supports_typed_content": False,
    }


@router.post("/props")
async def set_props(request: Request) -> Response:
    raise not_supported("This server does not support changing global properties. Start it with `--props`")


@router.get("/slots")
async def slots(request: Request) -> Response:
    state = server_state(request)
    if not state.settings.slots_endpoint:
        raise not_supported("This server does not support slots endpoint. Start it with `--slots`")
    state.require_ready()
    slots_json = state.engine.slots_json()
    if request.query_params.get("fail_on_no_slot") not in (None, "", "0", "false"):
        if all(slot.get("is_processing") for slot in slots_json):
            raise ApiError(503, "no slot available")
    return json_response(slots_json)


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    state = server_state(request)
    if not state.settings.metrics:
        raise not_supported("This server does not support metrics endpoint. Start it with `--metrics`")
    return Response(state.metrics.render(), media_type=CONTENT_TYPE,
                    headers={"Process-Start-Time-Unix": str(state.metrics.start_time)})
