"""Server-sent events: `data: <json>\n\n` per payload, `:` comment pings while the stream is silent,
and generation cancelled whenever the stream ends early (client gone, error)."""

from __future__ import annotations

import asyncio
from typing import AsyncIterator

from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from lamplight.engine.types import ErrorEvent

from .errors import ApiError
from .generation import ClientDisconnected, GenerationRun, wait_for_disconnect
from .json_io import dumps
from .stream_formats import Payload, StreamFormat

PING = b":\n\n"
SILENT = object()  # a stream item: the engine said nothing for a ping interval


def sse_bytes(payload: Payload) -> bytes:
    text = payload if isinstance(payload, str) else dumps(payload)
    return f"data: {text}\n\n".encode("utf-8", "replace")


def _error_payload(event: ErrorEvent) -> dict:
    return {"error": {"code": event.code, "message": event.message, "type": event.type}}


class StreamedAnswer(StreamingResponse):
    """A StreamingResponse that cancels its generation however the response ends (any API's
    stream: SSE here, NDJSON for Ollama's)."""

    def __init__(self, content: AsyncIterator[bytes], run: GenerationRun, media_type: str = "text/event-stream"):
        super().__init__(content, media_type=media_type,
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.run = run

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.run.cancel()



async def stream_response(request: Request, run: GenerationRun, fmt: StreamFormat,
                          ping_interval: float) -> StreamedAnswer:
    """Wait for the first event before answering, so an early failure is a plain HTTP error.

    If the engine stays silent longer than a ping interval (a long queue or prompt), the stream
    starts anyway so that pings keep the connection alive; later errors go in the stream.
    """
    first = await first_event(request, run, ping_interval)
    return StreamedAnswer(_sse_body(stream_items(run, fmt, ping_interval, first)), run)


async def first_event(request: Request, run: GenerationRun, ping_interval: float | None):
    """The run's first event, SILENT if none came within the ping interval; an error event
    before anything was sent is raised as the ApiError it is (and the run cancelled)."""
    first = await _first_event(request, run, ping_interval)
    if first is not SILENT and first is not None and isinstance(first[1], ErrorEvent):
        run.cancel()
        event = first[1]
        raise ApiError(event.code, event.message, event.type)
    return first


async def _first_event(request: Request, run: GenerationRun, timeout: float):
    wait = asyncio.ensure_future(run.next_event(timeout))
    gone = asyncio.ensure_future(wait_for_disconnect(request))
    try:
        done, _ = await asyncio.wait({wait, gone}, return_when=asyncio.FIRST_COMPLETED)
        if wait not in done:
            raise ClientDisconnected()
        try:
            return wait.result()
        except TimeoutError:
            return SILENT
    finally:
        gone.cancel()
        if not wait.done():
            wait.cancel()
            run.cancel()


async def stream_items(run: GenerationRun, fmt: StreamFormat, ping_interval: float | None,
                       first) -> AsyncIterator[Payload | ErrorEvent | object]:
    """The stream's payloads as `fmt` shapes them, SILENT whenever the engine stayed silent a
    ping interval, and an ErrorEvent (the last item) if the generation failed."""
    item = first
    while True:
        if item is SILENT:
            yield SILENT
        elif item is None:
            break
        else:
            index, event = item
            if isinstance(event, ErrorEvent):
                yield event
                return
            for payload in fmt.on_event(index, event):
                yield payload
        try:
            item = await run.next_event(ping_interval)
        except TimeoutError:
            item = SILENT
    for payload in fmt.on_end():
        yield payload


async def _sse_body(items: AsyncIterator) -> AsyncIterator[bytes]:
    async for item in items:
        if item is SILENT:
            yield PING
        elif isinstance(item, ErrorEvent):
            yield sse_bytes(_error_payload(item))  # no [DONE] after an error
        else:
            yield sse_bytes(item)
