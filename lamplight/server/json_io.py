"""Reading JSON request bodies strictly: an empty, malformed or too deeply nested one is a 400.

Above errors.py, which writes its answers with json_codec.py; the routes' `dumps` and
`json_response` are imported from here as well.
"""

from __future__ import annotations

from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from .errors import invalid_request
from .json_codec import DEFAULT_MAX_DEPTH, BodyError, dumps, json_response, parse_body

__all__ = ["dumps", "json_response", "read_json", "read_json_object"]

_PARSE_IN_THREAD_BYTES = 256 * 1024  # bigger bodies are parsed off the event loop


async def read_json(request: Request, expected: str = "a JSON object") -> Any:
    """The request body as any JSON value; an empty, malformed or too deeply nested body is a 400."""
    raw = await request.body()
    if not raw.strip():
        raise invalid_request(f"the request body is empty: expected {expected}")
    state = getattr(request.app.state, "lamplight", None)
    max_depth = state.settings.limits.max_json_depth if state is not None else DEFAULT_MAX_DEPTH
    try:
        if len(raw) > _PARSE_IN_THREAD_BYTES:
            return await run_in_threadpool(parse_body, raw, max_depth)
        return parse_body(raw, max_depth)
    except BodyError as exc:
        raise invalid_request(str(exc)) from None


async def read_json_object(request: Request) -> dict:
    """The request body as a JSON object; anything else is a 400, never a 422 or 500."""
    body = await read_json(request)
    if not isinstance(body, dict):
        raise invalid_request("the request body must be a JSON object")
    return body
