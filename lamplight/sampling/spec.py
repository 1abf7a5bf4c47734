"""One declaration per sampling field: its kind and range, llama-server's default where it differs
from llama.cpp's, and how generation_settings and /props echo it (the `lamplight serve` flag that
sets a field's server-wide default is spelled in lamplight.serve_flags.SAMPLING_SPELLINGS).

SamplingParams' fields carry their FieldSpec in `dataclasses.field(metadata=...)`, made by the
helpers below (`number`, `integer`, `boolean`, `listed`). Everything that reads, checks or shows a
sampling field iterates `sampling_fields()` instead of naming the fields again:
SamplingParams.validate, the HTTP reader (lamplight.server.params), the echo
(lamplight.server.generation_settings) and the CLI's default flags (lamplight.serve_flags).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from .values import check_boolean, check_integer, check_number

_SPEC = "lamplight.sampling.spec"  # the metadata key
_NONE = object()  # no server default of its own


def f32(value: float) -> float:
    """As llama-server echoes a float field: through float32 (0.95 -> 0.949999988079071)."""
    return float(np.float32(value))


def _same(value: Any) -> Any:
    return value


_KIND_CHECKS: dict[str, Callable[..., None]] = {
    "number": check_number,
    "integer": check_integer,
    "boolean": lambda value: check_boolean(value),
}


@dataclass(frozen=True)
class FieldSpec:
    kind: str  # "number", "integer", "boolean"; "list" values are checked by `validator`
    minimum: float | None = None
    maximum: float | None = None
    above: float | None = None  # a lower bound the value must exceed (repeat_penalty > 0)
    validator: Callable[[Any], None] | None = None  # "list": raises ValueError(reason)
    echo: Callable[[Any], Any] = _same  # the value as generation_settings shows it
    in_props: bool = True  # also in /props' default_generation_settings
    server_default: Any = _NONE  # llama-server's default, where it differs from llama.cpp's
    aliases: tuple[str, ...] = ()  # other request field names for it

    def bounds(self) -> dict[str, float]:
        """The range as keyword arguments of the kind's reader (lamplight.server.fields.Fields)."""
        bounds = {"minimum": self.minimum, "maximum": self.maximum, "above": self.above}
        return {name: bound for name, bound in bounds.items() if bound is not None}

    def check(self, value: Any) -> None:
        """ValueError(reason) for a value this field cannot hold."""
        if self.validator is not None:
            self.validator(value)
        else:
            _KIND_CHECKS[self.kind](value, **self.bounds())


def _declare(spec: FieldSpec, default: Any) -> Any:
    return dataclasses.field(default=default, metadata={_SPEC: spec})


def number(default: float, *, minimum: float | None = None, maximum: float | None = None,
           above: float | None = None, **options: Any) -> Any:
    """A float field (echoed through float32)."""
    return _declare(FieldSpec("number", minimum, maximum, above, echo=f32, **options), default)


def integer(default: int, *, minimum: int | None = None, maximum: int | None = None, **options: Any) -> Any:
    """An integer field; without a bound on a side, int32 bounds it there."""
    return _declare(FieldSpec("integer", minimum, maximum, **options), default)


def boolean(default: bool, **options: Any) -> Any:
    return _declare(FieldSpec("boolean", **options), default)


def listed(default: Sequence, validator: Callable[[Any], None], *, echo: Callable[[Any], Any] = list,
           **options: Any) -> Any:
    """A list field: each instance gets its own copy of `default`; `validator` checks a value."""
    spec = FieldSpec("list", validator=validator, echo=echo, **options)
    return dataclasses.field(default_factory=lambda: list(default), metadata={_SPEC: spec})


def sampling_fields(params: Any) -> Iterator[tuple[str, FieldSpec]]:
    """(name, spec) of every field of a SamplingParams (class or instance), in declaration order."""
    for field in dataclasses.fields(params):
        yield field.name, field.metadata[_SPEC]


def field_default(params_class: type, name: str) -> Any:
    """The library default (llama.cpp's) of one field."""
    field = next(f for f in dataclasses.fields(params_class) if f.name == name)
    return field.default_factory() if field.default is dataclasses.MISSING else field.default


def server_defaults(params_class: type) -> dict[str, Any]:
    """The fields whose llama-server default differs from the library's, with llama-server's."""
    return {name: spec.server_default for name, spec in sampling_fields(params_class)
            if spec.server_default is not _NONE}


def server_default(params_class: type, name: str) -> Any:
    """What a server request gets for `name` unless a flag or the request says otherwise."""
    return server_defaults(params_class).get(name, field_default(params_class, name))


def check_fields(params: Any) -> None:
    """ValueError("<field>: <reason>") for the first field holding a bad value."""
    for name, spec in sampling_fields(params):
        try:
            spec.check(getattr(params, name))
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from None


def echo_fields(params: Any, **values: Any) -> dict[str, Any]:
    """Every field as generation_settings echoes it, in declaration order; `values` replace
    fields' values first (the logit_bias the server really applies, with its bans)."""
    return {name: spec.echo(values.get(name, getattr(params, name))) for name, spec in sampling_fields(params)}


def props_hidden(params: Any) -> tuple[str, ...]:
    """The echoed fields /props leaves out of default_generation_settings.params."""
    return tuple(name for name, spec in sampling_fields(params) if not spec.in_props)
