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
_SILENT = object()


def sse_bytes(payload: Payload) -> bytes:
    text = payload if isinstance(payload, str) else dumps(payload)
    return f"data: {text}\n\n".encode("utf-8", "replace")


def _error_payload(event: ErrorEvent) -> dict:
    return {"error": {"code": event.code, "message": event.message, "type": event.type}}


class SSEResponse(StreamingResponse):
    """A StreamingResponse that cancels its generation however the response ends."""

    def __init__(self, content: AsyncIterator[bytes], run: GenerationRun):
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.run = run

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.run.cancel()


async def stream_response(request: Request, run: GenerationRun, fmt: StreamFormat,
                          ping_interval: float) -> SSEResponse:
    """Wait for the first event before answering, so an early failure is a plain HTTP error.

    If the engine stays silent longer than a ping interval (a long queue or prompt), the stream
    starts anyway so that pings keep the connection alive; later errors go in the stream.
    """
    first = await _first_event(request, run, ping_interval)
    if first is not _SILENT and first is not None and isinstance(first[1], ErrorEvent):
        run.cancel()
        event = first[1]
        raise ApiError(event.code, event.message, event.type)
    return SSEResponse(_sse_body(run, fmt, ping_interval, first), run)


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
            return _SILENT
    finally:
        gone.cancel()
        if not wait.done():
            wait.cancel()
            run.cancel()


async def _sse_body(run: GenerationRun, fmt: StreamFormat, ping_interval: float, first) -> AsyncIterator[bytes]:
    item = first
    while True:
        if item is _SILENT:
            yield PING
        elif item is None:
            break
        else:
            index, event = item
            if isinstance(event, ErrorEvent):
                yield sse_bytes(_error_payload(event))  # no [DONE] after an error
                return
            for payload in fmt.on_event(index, event):
                yield sse_bytes(payload)
        try:
            item = await run.next_event(ping_interval)
        except TimeoutError:
            item = _SILENT
    for payload in fmt.on_end():
        yield sse_bytes(payload)
