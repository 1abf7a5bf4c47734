"""OpenAI-compatible endpoints: /v1/chat/completions, /v1/completions, /v1/models."""

from __future__ import annotations

import time

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response

from .completion_flow import answer_completion
from .json_io import json_response, read_json_object
from .model_info import embedder_meta, model_meta
from .params import Endpoint
from .state import ServerState

router = APIRouter()


def server_state(request: Request) -> ServerState:
    return request.app.state.lamplight


@router.post("/v1/chat/completions")
@router.post("/chat/completions")
async def chat_completions(request: Request) -> Response:
    body = await read_json_object(request)
    return await answer_completion(request, server_state(request), body, Endpoint.CHAT)


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    body = await read_json_object(request)
    return await answer_completion(request, server_state(request), body, Endpoint.COMPLETIONS)


@router.get("/v1/models")
@router.get("/models")
async def models(request: Request) -> Response:
    state = server_state(request)
    state.require_loaded()
    name = state.model_name
    return json_response({
        "models": [_ollama_entry(name, state.media is not None)],
        "object": "list",
        "data": [{
            "id": name,
            "aliases": state.aliases,
            "tags": list(state.settings.tags),  # --tags
            "object": "model",
            "created": int(time.time()),
            "owned_by": "llamacpp",
            "meta": model_meta(state.model, state.engine.n_ctx_slot) if state.engine is not None
            else embedder_meta(state.embedder),
        }],
    })


def _ollama_entry(name: str, multimodal: bool) -> dict:
    return {
        "name": name,
        "model": name,
        "modified_at": "",
        "size": "",
        "digest": "",
        "type": "model",
        "description": "",
        "tags": [""],
        "capabilities": ["completion", "multimodal"] if multimodal else ["completion"],
        "parameters": "",
        "details": {"parent_model": "", "format": "gguf", "family": "", "families": [""],
                    "parameter_size": "", "quantization_level": ""},
    }
