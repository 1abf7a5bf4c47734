"""Strict, typed reading of request fields: `null` means "use the default", a wrong type or an
out-of-range value is a 400 naming the field (llama.cpp HEAD's declarative schema, minus its
silent clamping), and fields nobody asks about are ignored."""

from __future__ import annotations

import math
import re
from typing import Any

from .errors import ApiError, field_error

INT32_MAX = 2**31 - 1
INT32_MIN = -(2**31)
# Sampling runs in float32: a larger finite double (1e308) would become inf there, and inf cannot
# be echoed in JSON. So a number field holds what float32 holds.
FLOAT32_MAX = 3.4028234663852886e38


def _fmt(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(value)


def _range_text(kind: str, minimum: float | None, maximum: float | None) -> str:
    if minimum is not None and maximum is not None:
        return f"must be {kind} in [{_fmt(minimum)}, {_fmt(maximum)}]"
    if minimum is not None:
        return f"must be {kind} >= {_fmt(minimum)}"
    if maximum is not None:
        return f"must be {kind} <= {_fmt(maximum)}"
    return f"must be {kind}"


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


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
               maximum: float | None = None) -> float:
        value = self.body.get(name)
        if value is None:
            return default
        expected = _range_text("a number", minimum, maximum)
        if not is_number(value) or not math.isfinite(value):
            raise field_error(name, f"{expected}, got {value!r}")
        if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
            raise field_error(name, f"{expected}, got {_fmt(value)}")
        if abs(value) > FLOAT32_MAX:
            raise field_error(name, f"must be a number within float32's range (|x| <= {FLOAT32_MAX:.7g}), got {value!r}")
        return float(value)

    def positive_number(self, name: str, default: float) -> float:
        value = self.number(name, default)
        if value <= 0:
            raise field_error(name, f"must be a number > 0, got {_fmt(value)}")
        return value

    def integer(self, name: str, default: int, minimum: int | None = None,
                maximum: int | None = None) -> int:
        """An integer; without stated bounds, one that fits int32 (as llama.cpp's fields do)."""
        value = self.body.get(name)
        if value is None:
            return default
        expected = _range_text("an integer", minimum, maximum)
        # JSON has one number type: 4.0 from a JavaScript client is the integer 4.
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not is_number(value) or not isinstance(value, int):
            raise field_error(name, f"{expected}, got {value!r}")
        if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
            raise field_error(name, f"{expected}, got {value}")
        if (maximum is None and value > INT32_MAX) or (minimum is None and value < INT32_MIN):
            raise field_error(name, f"{expected} that fits int32 [{INT32_MIN}, {INT32_MAX}], got {value}")
        return value

    def boolean(self, name: str, default: bool) -> bool:
        value = self.body.get(name)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise field_error(name, f"must be a boolean, got {value!r}")
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
