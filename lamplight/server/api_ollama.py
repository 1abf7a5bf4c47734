"""Ollama's API as one conversion layer onto lamplight's pipelines, for the tools that speak only
Ollama (editor plugins, Open WebUI's Ollama mode, `codex --oss`).

POST /api/chat and /api/generate (NDJSON lines, streamed by default, or one object with
`stream: false`) become a /v1/chat/completions body run by the chat pipeline (chat_bridge.py), or
for /api/generate with `raw` a /completion body and with `suffix` an /infill body
(api_ollama_request.py); the answers become Ollama's (api_ollama_reply.py). GET /api/tags,
POST /api/show, GET /api/ps describe the one served model (api_ollama_models.py), POST /api/pull
downloads a Hub GGUF into the cache without swapping it in (api_ollama_pull.py), GET
/api/version is lamplight's version, POST /api/embed and /api/embeddings use the served
embedder (api_ollama_embed.py; 501 without one). A request may name any model: the served one
answers, as on /v1/chat/completions. The model-store endpoints (create, copy, delete, push,
blobs) answer 501. Every error under /api, whichever layer refuses the request (API key, body
limits, loading, the handler), is Ollama's `{"error": "message"}` with lamplight's HTTP status.

GET and HEAD `/` answer "Ollama is running" (what Ollama's clients probe) only when no chat page
is served there; with the web UI on, `/` stays the chat page (a 200 as well).
"""

from __future__ import annotations

import functools
import time
from typing import Any, AsyncIterator, Callable

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse

from lamplight import __version__
from lamplight.engine.types import ErrorEvent

from . import api_ollama_embed as embed_lines
from .api_ollama_models import ps_entry, show, tags_entry
from .api_ollama_pull import hub_spec, pull_lines, pull_once
from .api_ollama_reply import ChatLines, RawGenerateStream, chat_reply, error_line, load_reply, raw_reply
from .api_ollama_request import ModelFacts, chat_body, generate_plan, keep_alive_seconds
from .chat_bridge import SILENT, StreamedAnswer, stream_chat
from .chat_bridge import chat_reply as run_chat
from .completion_flow import ping_interval, start_completion
from .errors import ApiError, not_supported, register_error_shape
from .fields import Fields
from .generation import collect_unless_disconnected
from .infill import fim_tokens
from .json_io import dumps, json_response, read_json_object
from .params import Endpoint
from .routes_native import infill_prompts
from .routes_openai import server_state
from .sse import first_event, stream_items
from .state import ServerState
from .webui import static_file_path, static_response

router = APIRouter()

OLLAMA_PATHS = ("/api",)
NDJSON = "application/x-ndjson"
RUNNING = "Ollama is running"


def _ollama_error(exc: ApiError) -> Response:
    return json_response({"error": exc.message}, status_code=exc.code)


register_error_shape(OLLAMA_PATHS, _ollama_error)


def _model_facts(state: ServerState) -> ModelFacts:
    state.require_ready()
    return ModelFacts(state.model_name, bool(getattr(state.model.chat_template, "supports_thinking", False)),
                      state.engine.n_ctx_slot)


def _wants_stream(body: dict) -> bool:
    return Fields(body).boolean("stream", True)  # Ollama streams unless told not to


# -- generation ---------------------------------------------------------------------------------

# Set on answers to a request with `keep_alive`: in router mode (lamplight/router/proxy.py) the
# router sets the model's unload timer from it (0: unload once idle, negative: never).
UNLOAD_AFTER_HEADER = "X-Lamplight-Unload-After"


def _keep_alive(handler):
    """The handler's answer, carrying the request's `keep_alive` in seconds for the router."""
    @functools.wraps(handler)
    async def answer(request: Request) -> Response:
        response = await handler(request)
        body = await read_json_object(request)
        seconds = keep_alive_seconds(body.get("keep_alive"))
        if seconds is not None:
            response.headers[UNLOAD_AFTER_HEADER] = f"{seconds:g}"
        return response
    return answer


@router.post("/api/chat")
@_keep_alive
async def chat(request: Request) -> Response:
    started = time.monotonic_ns()
    body = await read_json_object(request)
    state = server_state(request)
    stream = _wants_stream(body)
    converted = chat_body(body, _model_facts(state))
    if not converted["messages"]:
        return json_response(load_reply(state.model_name, generate=False))
    return await _chat_answer(request, state, converted, stream, started, generate=False)


@router.post("/api/generate")
@_keep_alive
async def generate(request: Request) -> Response:
    started = time.monotonic_ns()
    body = await read_json_object(request)
    state = server_state(request)
    stream = _wants_stream(body)
    plan = generate_plan(body, _model_facts(state))
    if plan.load_only:
        return json_response(load_reply(state.model_name, generate=True))
    if plan.mode == "chat":
        return await _chat_answer(request, state, plan.body, stream, started, generate=True)
    return await _raw_answer(request, state, plan.body, stream, started, infill=plan.mode == "infill")


async def _chat_answer(request: Request, state: ServerState, body: dict, stream: bool, started: int,
                       generate: bool) -> Response:
    if not stream:
        reply = await run_chat(request, state, body)
        return json_response(chat_reply(reply.result, reply.finals[0], started, generate))
    run = await stream_chat(request, state, body)
    lines = ChatLines(run.finals, started, generate)
    return StreamedAnswer(_ndjson(run.items, lines.on_chunk), run.run, media_type=NDJSON)


async def _raw_answer(request: Request, state: ServerState, body: dict, stream: bool, started: int,
                      infill: bool) -> Response:
    """/completion's pipeline (with /infill's prompt for `suffix`); only raw replies carry `context`."""
    if infill:
        fim_tokens(state.model.tokenizer)  # a model without FIM tokens: 400 before anything else
    ctx, run = await start_completion(request, state, {**body, "stream": stream}, Endpoint.NATIVE,
                                      build_prompts=infill_prompts if infill else None)
    if not stream:
        finals = await collect_unless_disconnected(request, run)
        return json_response(raw_reply(ctx, finals[0], started, with_context=not infill))
    ping = ping_interval(state)
    first = await first_event(request, run, ping)
    items = stream_items(run, RawGenerateStream(ctx, started, with_context=not infill), ping, first)
    return StreamedAnswer(_ndjson(items, lambda line: [line]), run, media_type=NDJSON)


async def _ndjson(items: AsyncIterator[Any], lines_of: Callable[[Any], list[dict]]) -> AsyncIterator[bytes]:
    """One JSON object a line; NDJSON has no keep-alive, so silences send nothing; a failure is a
    last `{"error": ...}` line (the official clients raise it)."""
    async for item in items:
        if item is SILENT:
            continue
        if isinstance(item, ErrorEvent):
            yield _line_bytes(error_line(item.message))
            return
        for line in lines_of(item):
            yield _line_bytes(line)


def _line_bytes(line: dict) -> bytes:
    return (dumps(line) + "\n").encode("utf-8", "replace")


# -- the model ----------------------------------------------------------------------------------

@router.api_route("/api/tags", methods=["GET", "HEAD"])  # HEAD: how Ollama's clients probe
async def tags(request: Request) -> Response:
    state = server_state(request)
    state.require_ready()
    return json_response({"models": [tags_entry(state)]})


@router.post("/api/show")
async def show_model(request: Request) -> Response:
    body = await read_json_object(request)
    for name in ("model", "name"):  # any name: the served model is shown
        Fields(body).string(name, "")
    Fields(body).boolean("verbose", False)
    state = server_state(request)
    state.require_ready()
    return json_response(show(state))


@router.get("/api/ps")
async def running(request: Request) -> Response:
    state = server_state(request)
    state.require_ready()
    return json_response({"models": [ps_entry(state)]})


@router.api_route("/api/version", methods=["GET", "HEAD"])
async def version(request: Request) -> Response:
    return json_response({"version": __version__})


@router.post("/api/pull")
async def pull(request: Request) -> Response:
    body = await read_json_object(request)
    fields = Fields(body)
    spec = hub_spec(fields.string("model", "") or fields.string("name", ""))
    fields.boolean("insecure", False)
    served = server_state(request).model_name
    if not _wants_stream(body):
        return json_response(await pull_once(spec, served))
    return StreamingResponse(_ndjson(pull_lines(spec, served), lambda line: [line]), media_type=NDJSON)


@router.post("/api/embed")
@_keep_alive
async def embed(request: Request) -> Response:
    return json_response(await embed_lines.embed(server_state(request), await read_json_object(request)))


@router.post("/api/embeddings")
async def embeddings(request: Request) -> Response:
    return json_response(await embed_lines.embeddings_legacy(server_state(request), await read_json_object(request)))


@router.post("/api/create")
@router.post("/api/copy")
@router.post("/api/push")
@router.delete("/api/delete")
@router.api_route("/api/blobs/{digest}", methods=["HEAD", "POST"])
async def model_store(request: Request) -> Response:
    raise not_supported(f"{request.url.path} is not supported: lamplight serves the one GGUF it was started with "
                        "(lamplight serve -m FILE or -hf USER/REPO[:QUANT])")


# -- the probe ----------------------------------------------------------------------------------

@router.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
async def root(request: Request) -> Response:
    if static_file_path(server_state(request).settings, "/") is not None:
        return static_response(request, "/")  # the chat page keeps `/`
    return PlainTextResponse(RUNNING)
