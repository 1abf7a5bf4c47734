"""The rules for a typed value (a number, an integer, a boolean) and their messages, written once:
SamplingParams.validate and the HTTP reader (lamplight.server.fields) both use them.

Each check raises ValueError(reason), the reason without the field's name: the caller knows the
name and says it its own way ("temperature: ..." for a library user, a 400 "Field 'temperature':
..." for a request)."""

from __future__ import annotations

import math
from typing import Any

# llama.cpp's integer fields are int32; a larger value would overflow the int64 tensors the
# samplers build from them.
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
# Sampling runs in float32: a larger finite double (1e308) would become inf there, and inf cannot
# be echoed in JSON. So a number holds what float32 holds.
FLOAT32_MAX = 3.4028234663852886e38


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def format_number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(value)


def range_text(kind: str, minimum: float | None, maximum: float | None) -> str:
    """"must be a number in [0, 1]", "must be an integer >= -1", "must be a boolean"..."""
    if minimum is not None and maximum is not None:
        return f"must be {kind} in [{format_number(minimum)}, {format_number(maximum)}]"
    if minimum is not None:
        return f"must be {kind} >= {format_number(minimum)}"
    if maximum is not None:
        return f"must be {kind} <= {format_number(maximum)}"
    return f"must be {kind}"


def check_number(value: Any, minimum: float | None = None, maximum: float | None = None,
                 above: float | None = None) -> None:
    """A finite number in [minimum, maximum] (and > `above`), within float32's range."""
    expected = range_text("a number", minimum, maximum)
    if not is_number(value) or not math.isfinite(value):
        raise ValueError(f"{expected}, got {value!r}")
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise ValueError(f"{expected}, got {format_number(value)}")
    if abs(value) > FLOAT32_MAX:
        raise ValueError(f"must be a number within float32's range (|x| <= {FLOAT32_MAX:.7g}), got {value!r}")
    if above is not None and value <= above:
        raise ValueError(f"must be a number > {format_number(above)}, got {format_number(value)}")


def check_integer(value: Any, minimum: int | None = None, maximum: int | None = None) -> None:
    """An integer in [minimum, maximum]; where a bound is not given, within int32."""
    expected = range_text("an integer", minimum, maximum)
    if not is_number(value) or not isinstance(value, int):
        raise ValueError(f"{expected}, got {value!r}")
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise ValueError(f"{expected}, got {value}")
    if (maximum is None and value > INT32_MAX) or (minimum is None and value < INT32_MIN):
        raise ValueError(f"{expected} that fits int32 [{INT32_MIN}, {INT32_MAX}], got {value}")


def check_boolean(value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"must be a boolean, got {value!r}")
