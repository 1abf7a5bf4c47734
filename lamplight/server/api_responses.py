"""OpenAI's Responses API, stateless, as one conversion onto the chat pipeline:
POST /v1/responses (a Response object, or its SSE events with `stream`),
POST /v1/responses/input_tokens, and POST /v1/chat/completions/input_tokens for a chat body.

A Responses request becomes a /v1/chat/completions body (api_responses_request.py), the chat
pipeline runs it (chat_bridge.py: template, tools, reasoning split, grammars, sampling), and
its chat.completion result or chunks become Responses shapes (api_responses_output.py,
api_responses_stream.py). Nothing is stored: a response cannot be fetched or deleted later.

Errors on these paths are llama-server's error JSON (`code` the HTTP status, as on every
lamplight path; the official client reads `message` and `type`) with OpenAI's `param` added:
the field a 400 names, else null.
"""

from __future__ import annotations

import re
from typing import AsyncIterator

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from .api_responses_output import ResponseShell
from .api_responses_request import read_responses_request
from .api_responses_stream import ResponseEvents
from .chat_bridge import SILENT, ChatStreamRun, StreamedAnswer, api_events, chat_result, prompt_tokens, stream_chat
from .errors import ApiError, register_error_shape
from .json_io import dumps, json_response, read_json_object
from .routes_openai import server_state
from .sse import PING
from .state import ServerState

router = APIRouter()

RESPONSES_PATHS = ("/v1/responses", "/v1/chat/completions/input_tokens")
_NAMED_FIELD = re.compile(r"Field '([^']*)': ")  # how errors.field_error names the field


@router.post("/v1/responses")
async def create_response(request: Request) -> Response:
    state = server_state(request)
    asked = read_responses_request(await read_json_object(request))
    if asked.stream:
        run = await stream_chat(request, state, asked.chat_body)
        events = ResponseEvents(ResponseShell(asked.echo, asked.echo["model"] or state.model_name))
        return StreamedAnswer(_event_stream(run, events, state), run.run)
    result = await chat_result(request, state, asked.chat_body)
    shell = ResponseShell(asked.echo, asked.echo["model"] or state.model_name)
    reasoning_tokens = await _count_tokens(state, result["choices"][0]["message"].get("reasoning_content"))
    return json_response(shell.from_chat(result, reasoning_tokens))


@router.post("/v1/responses/input_tokens")
async def count_response_input_tokens(request: Request) -> Response:
    asked = read_responses_request(await read_json_object(request))
    return await _input_tokens(server_state(request), asked.chat_body)


@router.post("/v1/chat/completions/input_tokens")
async def count_chat_input_tokens(request: Request) -> Response:
    return await _input_tokens(server_state(request), await read_json_object(request))


@router.get("/v1/responses/{response_id}")
@router.delete("/v1/responses/{response_id}")
async def stored_response(request: Request, response_id: str) -> Response:
    raise ApiError(404, f"response {response_id!r} is not stored: this server is stateless and stores no responses")


async def _input_tokens(state: ServerState, chat_body: dict) -> Response:
    """The prompt's tokens, prepared exactly as the chat reply's would be (so they equal its
    usage.prompt_tokens): template, tools, thinking settings."""
    return json_response({"object": "response.input_tokens", "input_tokens": await prompt_tokens(state, chat_body)})


async def _count_tokens(state: ServerState, text: str | None) -> int:
    if not text:
        return 0
    tokenizer = state.model.tokenizer
    return len(await run_in_threadpool(tokenizer.encode, text, add_special=False, parse_special=False))


async def _event_stream(run: ChatStreamRun, events: ResponseEvents, state: ServerState) -> AsyncIterator[bytes]:
    async def finish() -> list:
        return events.finish(await _count_tokens(state, events.reasoning))

    async for event in api_events(run, events, finish):
        yield PING if event is SILENT else _sse(event)


def _sse(event: dict) -> bytes:
    return f"event: {event['type']}\ndata: {dumps(event)}\n\n".encode("utf-8", "replace")


def _error_with_param(exc: ApiError) -> Response:
    body = exc.body()
    named = _NAMED_FIELD.match(exc.message)
    body["error"]["param"] = exc.extra.get("param") or (named.group(1) if named else None)
    return json_response(body, status_code=exc.code)


register_error_shape(RESPONSES_PATHS, _error_with_param)
