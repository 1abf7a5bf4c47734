"""Strict, typed reading of request fields: `null` means "use the default", a wrong type or an
out-of-range value is a 400 naming the field (llama.cpp HEAD's declarative schema, minus its
silent clamping), and fields nobody asks about are ignored."""

from __future__ import annotations

import re
from typing import Any, Callable

from lamplight.sampling.values import INT32_MAX, INT32_MIN, check_boolean, check_integer, check_number, is_number

from .errors import ApiError, field_error

__all__ = ["INT32_MAX", "INT32_MIN", "Fields", "is_number", "value_error_as_field_error"]


def _checked(name: str, check: Callable[..., None], value: Any, **bounds: Any) -> None:
    try:
        check(value, **bounds)
    except ValueError as exc:
        raise field_error(name, str(exc)) from None


class Fields:
    """Typed accessors over one request body."""

    def __init__(self, body: dict):
        self.body = body

    def given(self, name: str) -> bool:
        return self.body.get(name) is not None

    def first_given(self, *names: str) -> str | None:
        return next((name for name in names if self.given(name)), None)

    def raw(self, name: str, default: Any = None) -> Any:
        value = self.body.get(name)
        return default if value is None else value

    def number(self, name: str, default: float, minimum: float | None = None,
               maximum: float | None = None, above: float | None = None) -> float:
        """A number that float32 holds, in [minimum, maximum] and > `above` where given."""
        value = self.body.get(name)
        if value is None:
            return default
        _checked(name, check_number, value, minimum=minimum, maximum=maximum, above=above)
        return float(value)

    def integer(self, name: str, default: int, minimum: int | None = None,
                maximum: int | None = None) -> int:
        """An integer; without stated bounds, one that fits int32 (as llama.cpp's fields do)."""
        value = self.body.get(name)
        if value is None:
            return default
        # JSON has one number type: 4.0 from a JavaScript client is the integer 4.
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        _checked(name, check_integer, value, minimum=minimum, maximum=maximum)
        return value

    def boolean(self, name: str, default: bool) -> bool:
        value = self.body.get(name)
        if value is None:
            return default
        _checked(name, check_boolean, value)
        return value

    def string(self, name: str, default: str) -> str:
        value = self.body.get(name)
        if value is None:
            return default
        if not isinstance(value, str):
            raise field_error(name, f"must be a string, got {value!r}")
        return value

    def string_list(self, name: str, default: list[str], allow_single: bool = False,
                    non_empty: bool = False) -> list[str]:
        value = self.body.get(name)
        if value is None:
            return list(default)
        if allow_single and isinstance(value, str):
            return [value]
        expected = "a string or an array of strings" if allow_single else "an array of strings"
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise field_error(name, f"must be {expected}")
        if non_empty and not value:
            raise field_error(name, f"must be a non-empty {expected.removeprefix('an ')}")
        return value

    def object(self, name: str) -> dict | None:
        value = self.body.get(name)
        if value is not None and not isinstance(value, dict):
            raise field_error(name, f"must be an object, got {value!r}")
        return value

    def array(self, name: str) -> list | None:
        value = self.body.get(name)
        if value is not None and not isinstance(value, list):
            raise field_error(name, f"must be an array, got {value!r}")
        return value


def value_error_as_field_error(exc: ValueError) -> ApiError:
    """Turn the sampling module's ValueError("<field>[detail]: <reason>") into our 400."""
    match = _FIELD_MESSAGE.match(str(exc))
    if match is None:
        return ApiError(400, str(exc))
    name, detail, reason = match.groups()
    return field_error(name, f"{detail}: {reason}" if detail else reason)


_FIELD_MESSAGE = re.compile(r"([a-z_][a-z0-9_]*)(\[[^\]]*\])?: (.*)", re.S)
