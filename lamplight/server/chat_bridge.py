"""Other APIs on the chat pipeline: one generation path for every dialect.

An API's module (Anthropic Messages, OpenAI Responses, Ollama) turns its request into a chat
body, exactly what /v1/chat/completions takes; this runs it as that route would (template,
tools in the family's format, reasoning, grammars, the sampler chain) and hands back OpenAI's
shapes: the chat.completion object, or its chat.completion.chunk payloads while they stream. The
API's module turns those into its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from lamplight.engine.types import ErrorEvent, FinalEvent

from .completion_flow import json_result, ping_interval, prepare_completion, start_completion, stream_format
from .generation import GenerationRun, collect_unless_disconnected
from .params import Endpoint
from .response_context import ResponseContext
from .sse import SILENT, StreamedAnswer, first_event, stream_items
from .state import ServerState
from .stream_formats import DONE

__all__ = ["SILENT", "ChatReply", "ChatStreamRun", "StreamedAnswer", "api_events", "chat_reply", "chat_result",
           "prompt_tokens", "stream_chat"]


async def chat_result(request: Request, state: ServerState, chat_body: dict) -> dict:
    """The chat.completion object for `chat_body` (not streamed)."""
    return (await chat_reply(request, state, chat_body)).result


@dataclass
class ChatReply:
    """A finished chat reply: the chat.completion object, and how each choice ended (the engine's
    FinalEvents: `stopping_word` names the stop string that ended it, which OpenAI's shape omits)."""

    result: dict
    finals: dict[int, FinalEvent]


async def chat_reply(request: Request, state: ServerState, chat_body: dict) -> ChatReply:
    body = {**chat_body, "stream": False}
    ctx, run = await start_completion(request, state, body, Endpoint.CHAT)
    finals = await collect_unless_disconnected(request, run)
    return ChatReply(json_result(Endpoint.CHAT, ctx, finals), finals)


@dataclass
class ChatStreamRun:
    """A started streamed chat reply. Iterate `items` for: chat.completion.chunk dicts (the last
    one carries `usage`), SILENT while the engine is silent for a ping interval (the API's
    keep-alive, if it has one), and an ErrorEvent as the last item if the generation failed.
    Answer with StreamedAnswer(bytes, run), which cancels the generation however it ends."""

    run: GenerationRun
    ctx: ResponseContext
    items: AsyncIterator[Any]
    # Each choice's FinalEvent, filled in as the stream goes (before that choice's finish chunk).
    finals: dict[int, FinalEvent] = field(default_factory=dict)


async def stream_chat(request: Request, state: ServerState, chat_body: dict) -> ChatStreamRun:
    """Start streaming `chat_body`'s reply. A failure before the first event (a full queue, a
    prompt too long) is raised here as the ApiError it is, before the API has sent anything."""
    body = {**chat_body, "stream": True, "stream_options": {"include_usage": True}}
    ctx, run = await start_completion(request, state, body, Endpoint.CHAT)
    ping = ping_interval(state)
    first = await first_event(request, run, ping)
    fmt = stream_format(Endpoint.CHAT, ctx)
    return ChatStreamRun(run, ctx, _without_done(stream_items(run, fmt, ping, first)), fmt.finals)


async def _without_done(items: AsyncIterator[Any]) -> AsyncIterator[Any]:
    async for item in items:
        if item != DONE:
            yield item


async def api_events(run: ChatStreamRun, events: Any, finish: Callable[[], Awaitable[list]]) -> AsyncIterator[Any]:
    """An API's stream events over a chat stream: `events.start()`, then `events.on_chunk(chunk)`
    per chunk and SILENT as it comes (the API's keep-alive), `events.fail(error)` as the end if the
    generation failed, else what `await finish()` gives last."""
    for event in events.start():
        yield event
    async for item in run.items:
        if item is SILENT:
            yield SILENT
        elif isinstance(item, ErrorEvent):
            for event in events.fail(item):
                yield event
            return
        else:
            for event in events.on_chunk(item):
                yield event
    for event in await finish():
        yield event


async def prompt_tokens(state: ServerState, chat_body: dict) -> int:
    """How many tokens `chat_body`'s prompt has, prepared exactly as its reply's would be
    (template, tools, thinking settings): its usage.prompt_tokens."""
    state.require_ready()
    prepared = await run_in_threadpool(prepare_completion, state, chat_body, Endpoint.CHAT)
    return len(prepared.prompts[0])
