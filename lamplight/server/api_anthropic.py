"""Anthropic's Messages API as one conversion onto the chat pipeline: POST /v1/messages (a
message, or its SSE events with `stream`) and POST /v1/messages/count_tokens.

A Messages request becomes a /v1/chat/completions body (api_anthropic_request.py), the chat
pipeline runs it (chat_bridge.py: template, tools in the family's format, reasoning split,
grammars, sampling), and its chat.completion result or chunks become Anthropic's shapes
(api_anthropic_reply.py, api_anthropic_stream.py). The key comes as `x-api-key` or a bearer
token (the middleware reads both); `anthropic-version` and `anthropic-beta` are not needed and
are ignored. Every error on these paths, whichever layer refuses the request, is Anthropic's
error JSON with lamplight's HTTP status.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import AsyncIterator, Iterator

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response

from .api_anthropic_reply import error_response, message_id, message_json
from .api_anthropic_request import MessagesRequest, read_messages_request, with_anthropic_names
from .api_anthropic_stream import MessageEvents
from .chat_bridge import SILENT, ChatStreamRun, StreamedAnswer, api_events, chat_reply, prompt_tokens, stream_chat
from .errors import ApiError, register_error_shape
from .json_io import dumps, json_response, read_json_object
from .routes_openai import server_state

router = APIRouter()

MESSAGES_PATHS = ("/v1/messages",)  # and below: /v1/messages/count_tokens
PING_EVENT = b'event: ping\ndata: {"type":"ping"}\n\n'


@router.post("/v1/messages")
async def create_message(request: Request) -> Response:
    state = server_state(request)
    with _anthropic_field_names():
        asked = read_messages_request(await read_json_object(request))
        model = asked.model or state.model_name
        if asked.stream:
            return await _streamed(request, asked, model)
        reply = await chat_reply(request, state, asked.chat_body)
    return json_response(message_json(reply.result, reply.finals.get(0), model, asked.show_thinking))


@router.post("/v1/messages/count_tokens")
async def count_tokens(request: Request) -> Response:
    """The prompt's tokens, prepared exactly as the reply's would be (the same template, tools
    and thinking settings), so they are its usage's input_tokens + cache_read_input_tokens."""
    state = server_state(request)
    with _anthropic_field_names():
        asked = read_messages_request(await read_json_object(request), counting=True)
        count = await prompt_tokens(state, asked.chat_body)
    return json_response({"input_tokens": count})


@contextmanager
def _anthropic_field_names() -> Iterator[None]:
    try:
        yield
    except ApiError as exc:
        raise with_anthropic_names(exc) from None


async def _streamed(request: Request, asked: MessagesRequest, model: str) -> StreamedAnswer:
    run = await stream_chat(request, server_state(request), asked.chat_body)
    events = MessageEvents(message_id(run.ctx.id), model, len(run.ctx.prompts[0]), asked.show_thinking)
    return StreamedAnswer(_event_stream(run, events), run.run)


async def _event_stream(run: ChatStreamRun, events: MessageEvents) -> AsyncIterator[bytes]:
    async def finish() -> list:
        return events.finish(run.finals.get(0))

    async for event in api_events(run, events, finish):
        yield PING_EVENT if event is SILENT else _sse(event)


def _sse(event: dict) -> bytes:
    return f"event: {event['type']}\ndata: {dumps(event)}\n\n".encode("utf-8", "replace")


register_error_shape(MESSAGES_PATHS, error_response)
