"""Server status and control endpoints: /health, /props, /slots (+ save/restore/erase),
/lora-adapters, /metrics."""

from __future__ import annotations

import functools
import os

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from lamplight.engine.types import EngineError

from .errors import ApiError, from_engine_error, invalid_request, not_supported
from .fields import Fields
from .generation_settings import props_default_params
from .json_io import json_response, read_json, read_json_object
from .media_sources import media_marker
from .memory import memory_budget
from .metrics import CONTENT_TYPE
from .model_info import ftype_name, token_text
from .params import default_sampling, parse_lora_entries
from .routes_openai import server_state

router = APIRouter()


@router.get("/health")
@router.get("/v1/health")
async def health(request: Request) -> Response:
    server_state(request).require_loaded()  # the middleware already answers 503 while loading
    return json_response({"status": "ok"})


@router.get("/props")
async def props(request: Request) -> Response:
    state = server_state(request)
    state.require_loaded()
    if state.engine is None:
        return json_response(_embedding_only_props(state))
    settings, model, engine = state.settings, state.model, state.engine
    return json_response({
        "default_generation_settings": {
            "params": props_default_params(default_sampling(settings), settings.n_predict, settings.n_keep,
                                           getattr(engine, "loras", []), engine),
            "n_ctx": engine.n_ctx_slot,
        },
        "total_slots": engine.n_parallel,
        # lamplight's own: what computes the model, and the resident budget by purpose.
        "lamplight": {"kernels": getattr(model, "kernels", None), "memory_mib": memory_budget(model, engine)},
        **_model_props(state),
    })


def _embedding_only_props(state) -> dict:
    """A model that only embeds has no engine: its context is the embedder's (one input's), one
    slot computes (llama-server lists its -np slots, all of which embed), no KV cache."""
    settings = state.settings
    return {
        "default_generation_settings": {
            "params": props_default_params(default_sampling(settings), settings.n_predict, settings.n_keep),
            "n_ctx": state.embedder.n_ctx,
        },
        "total_slots": 1,
        "lamplight": {"kernels": getattr(state.model, "kernels", None)},
        **_model_props(state),
    }


def _model_props(state) -> dict:
    """The fields of /props that describe the model and the server, whatever it computes."""
    settings, model = state.settings, state.model
    template, tokenizer = model.chat_template, model.tokenizer
    return {
        "model_alias": state.model_name,
        "model_ftype": ftype_name(model.file_type),
        "model_path": str(model.path),
        "modalities": {"vision": state.media is not None, "video": False, "audio": False},
        "media_marker": state.media.marker if state.media is not None else media_marker(),
        "endpoint_slots": settings.slots_endpoint,
        "endpoint_props": settings.props,
        "endpoint_metrics": settings.metrics,
        "ui": settings.webui and settings.static_path is None,
        "ui_settings": {},
        "chat_template": template.source if template is not None else "",
        "chat_template_caps": _template_caps(template),
        "bos_token": token_text(tokenizer, tokenizer.bos_id),
        "eos_token": token_text(tokenizer, tokenizer.eos_id),
        "build_info": settings.build_info,
        "is_sleeping": False,
        "cors_proxy_enabled": False,
    }


def _template_caps(template) -> dict:
    supports_tools = bool(getattr(template, "supports_tools", False))
    caps = getattr(template, "caps", None)  # probed by rendering (lamplight.chat.caps)
    return {
        "supports_object_arguments": bool(caps and caps.supports_object_arguments),
        "supports_parallel_tool_calls": bool(caps and caps.supports_parallel_tool_calls),
        "supports_preserve_reasoning": False,
        "supports_reasoning_effort": False,
        "supports_string_content": True,
        "supports_system_role": bool(caps is None or caps.supports_system_role),
        "supports_tool_calls": bool(caps and caps.supports_tool_calls),
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


@router.post("/slots/{id_slot}")
async def slot_action(request: Request, id_slot: str) -> Response:
    """`?action=save|restore` with `{"filename": ...}` in --slot-save-path, or `?action=erase`."""
    state = server_state(request)
    directory = state.settings.slot_save_path
    if not directory:
        raise not_supported("This server does not support slots action. Start it with `--slot-save-path`")
    state.require_ready()
    try:
        slot_id = int(id_slot)
    except ValueError:
        raise invalid_request("Invalid slot ID") from None
    action = request.query_params.get("action", "")
    engine = state.engine
    try:
        if action == "erase":
            result = await run_in_threadpool(engine.erase_slot, slot_id)
            return json_response({"id_slot": slot_id, "n_erased": result["n_erased"]})
        if action not in ("save", "restore"):
            raise invalid_request(f"Invalid action {action!r}: use save, restore or erase")
        filename = await _slot_filename(request)
        path = _slot_file_path(directory, filename)
        if action == "save":
            result = await run_in_threadpool(engine.save_slot, slot_id, path)
            return json_response({"id_slot": slot_id, "filename": filename, "n_saved": result["n_saved"],
                                  "n_written": result["n_written"], "timings": {"save_ms": result["ms"]}})
        result = await run_in_threadpool(engine.restore_slot, slot_id, path)
        return json_response({"id_slot": slot_id, "filename": filename, "n_restored": result["n_restored"],
                              "n_read": os.path.getsize(path), "timings": {"restore_ms": result["ms"]}})
    except EngineError as exc:  # a busy or unknown slot, a file that cannot be read
        raise from_engine_error(exc) from None


async def _slot_filename(request: Request) -> str:
    body = await read_json_object(request)
    filename = Fields(body).string("filename", "")
    if not filename:
        raise invalid_request('"filename" is required')
    return filename


def _slot_file_path(directory: str, filename: str) -> str:
    from lamplight.engine.slot_files import slot_file_path

    try:
        return slot_file_path(directory, filename)
    except EngineError as exc:
        raise invalid_request(f"Invalid filename: {exc}") from None


@router.get("/lora-adapters")
async def lora_adapters(request: Request) -> Response:
    state = server_state(request)
    state.require_ready()
    return json_response([{**adapter, **_adapter_info(adapter["path"])} for adapter in state.engine.lora_json()])


@functools.lru_cache(maxsize=64)
def _adapter_info(path: str) -> dict:
    """llama-server's `task_name` and `prompt_prefix` (from the adapter's metadata, usually empty)."""
    try:
        from lamplight.gguf.file import GGUFFile

        meta = GGUFFile(path).metadata
    except Exception:  # the adapter loaded at start-up; never fail a listing over its metadata
        meta = {}
    return {"task_name": str(meta.get("adapter.lora.task_name", "")),
            "prompt_prefix": str(meta.get("adapter.lora.prompt_prefix", ""))}


@router.post("/lora-adapters")
async def set_lora_adapters(request: Request) -> Response:
    """Body `[{"id": 0, "scale": 0.5}, ...]`: the scales of requests that name none; unlisted -> 0."""
    state = server_state(request)
    state.require_ready()
    body = await read_json(request, 'an array of {"id", "scale"} objects')
    if not isinstance(body, list):
        raise invalid_request("Request body must be an array")
    entries = parse_lora_entries(body, "lora")
    try:
        state.engine.set_lora_scales(entries)
    except EngineError as exc:
        raise from_engine_error(exc) from None
    return json_response({"success": True})


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    state = server_state(request)
    if not state.settings.metrics:
        raise not_supported("This server does not support metrics endpoint. Start it with `--metrics`")
    return Response(state.metrics.render(), media_type=CONTENT_TYPE,
                    headers={"Process-Start-Time-Unix": str(state.metrics.start_time)})
