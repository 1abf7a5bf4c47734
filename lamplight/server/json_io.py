"""Reading JSON request bodies strictly and writing JSON the way llama-server does (UTF-8, compact)."""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import Response


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def encode(value: Any) -> bytes:
    # "replace": a lone surrogate from a request's JSON ("\ud800") cannot be written as UTF-8.
    return dumps(value).encode("utf-8", "replace")


def json_response(value: Any, status_code: int = 200) -> Response:
    return Response(encode(value), status_code=status_code,
                    media_type="application/json; charset=utf-8")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


async def read_json(request: Request, expected: str = "a JSON object") -> Any:
    """The request body as any JSON value; an empty or malformed body is a 400."""
    from .errors import invalid_request

    raw = await request.body()
    if not raw.strip():
        raise invalid_request(f"the request body is empty: expected {expected}")
    try:
        return json.loads(raw, parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        raise invalid_request(f"the request body is not valid JSON: {exc}") from None


async def read_json_object(request: Request) -> dict:
    """The request body as a JSON object; anything else is a 400, never a 422 or 500."""
    from .errors import invalid_request

    body = await read_json(request)
    if not isinstance(body, dict):
        raise invalid_request("the request body must be a JSON object")
    return body
