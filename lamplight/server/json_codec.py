"""JSON text <-> values the way llama-server writes and reads them: UTF-8, compact, strict.

Below errors.py (its answers are written with `json_response`); reading a request body, where a
refusal becomes a 400, is json_io.py's, above errors.py.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from starlette.responses import Response

DEFAULT_MAX_DEPTH = 64
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def dumps(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except ValueError:
        # A non-finite float that validation let through: written as null (as llama-server's JSON
        # library does) rather than failing the whole answer.
        return json.dumps(_finite_floats(value), ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _finite_floats(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite_floats(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_floats(item) for item in value]
    return value


def encode(value: Any) -> bytes:
    # "replace": a lone surrogate ("\ud800") cannot be written as UTF-8.
    return dumps(value).encode("utf-8", "replace")


def json_response(value: Any, status_code: int = 200) -> Response:
    return Response(encode(value), status_code=status_code,
                    media_type="application/json; charset=utf-8")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


class BodyError(ValueError):
    """Why a body was refused (the message of the 400)."""


def parse_body(raw: bytes, max_depth: int = DEFAULT_MAX_DEPTH) -> Any:
    """JSON text -> value. Refused: invalid JSON, NaN/Infinity, nesting deeper than `max_depth`,
    and strings with a lone UTF-16 surrogate ("\\ud800": no text, as llama-server's parser says)."""
    try:
        value = json.loads(raw, parse_constant=_reject_constant)
    except RecursionError:
        raise BodyError(f"the request body is nested too deeply (the limit is {max_depth} levels)") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise BodyError(f"the request body is not valid JSON: {exc}") from None
    _check_value(value, max_depth, check_strings=_SURROGATE_ESCAPE.search(raw) is not None)
    return value


def _check_value(value: Any, max_depth: int, check_strings: bool) -> None:
    """Depth and strings, walked without recursion (the value may be nested deeply)."""
    stack: list[tuple[Any, str, int]] = [(value, "", 1)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, dict):
            children = item.items()
        elif isinstance(item, list):
            children = enumerate(item)
        else:
            if check_strings and isinstance(item, str) and _SURROGATE.search(item):
                raise BodyError(f"{_where(path)}: a string holds a lone UTF-16 surrogate, which is not text")
            continue
        if depth > max_depth:
            raise BodyError(f"the request body is nested too deeply (the limit is {max_depth} levels)")
        for key, child in children:
            if check_strings and isinstance(key, str) and _SURROGATE.search(key):
                raise BodyError(f"{_where(path)}: a key holds a lone UTF-16 surrogate, which is not text")
            if isinstance(child, (dict, list)) or (check_strings and isinstance(child, str)):
                stack.append((child, _child_path(path, key), depth + 1))


def _child_path(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def _where(path: str) -> str:
    return f"Field '{path}'" if path else "the request body"
