"""The sampling field table (lamplight.sampling.spec): each SamplingParams field declared once drives
the library's validation, the HTTP reader, the generation_settings echo and the CLI's default flags."""

from __future__ import annotations

import dataclasses
import math

import pytest

from lamplight.sampling.params import SamplingParams
from lamplight.sampling.spec import (FieldSpec, check_fields, echo_fields, f32, field_default, number,
                                     sampling_fields, server_defaults)
from lamplight.server.errors import ApiError
from lamplight.server.fields import Fields
from lamplight.server.params import read_sampling_field

SCALARS = [(name, spec) for name, spec in sampling_fields(SamplingParams) if spec.kind in ("number", "integer")]


def _out_of_range(spec: FieldSpec) -> list:
    """Values just past each bound the entry states (or int32's, for an unbounded integer)."""
    values = []
    if spec.minimum is not None:
        values.append(spec.minimum - 1)
    if spec.maximum is not None:
        values.append(spec.maximum + 1)
    if spec.above is not None:
        values.append(spec.above)
    if spec.kind == "integer" and spec.maximum is None:
        values.append(2**31)
    if spec.kind == "number":
        values.append(1e308)  # past float32
    return values


def http_reason(name: str, value) -> str:
    spec = dict(sampling_fields(SamplingParams))[name]
    with pytest.raises(ApiError) as info:
        read_sampling_field(Fields({name: value}), name, spec, field_default(SamplingParams, name))
    prefix = f"Field '{name}': "
    assert info.value.code == 400 and info.value.message.startswith(prefix)
    return info.value.message.removeprefix(prefix)


@pytest.mark.parametrize("name, spec", SCALARS, ids=[name for name, _ in SCALARS])
def test_library_and_http_refuse_the_same_values_with_the_same_reason(name, spec):
    for value in [*_out_of_range(spec), "x", True]:
        params = dataclasses.replace(SamplingParams(), **{name: value})
        with pytest.raises(ValueError, match=rf"^{name}: ") as info:
            params.validate()
        assert str(info.value).removeprefix(f"{name}: ") == http_reason(name, value)


@pytest.mark.parametrize("name, spec", SCALARS, ids=[name for name, _ in SCALARS])
def test_each_stated_bound_is_accepted(name, spec):
    for bound in (spec.minimum, spec.maximum):
        if bound is not None:
            dataclasses.replace(SamplingParams(), **{name: bound}).validate()
            assert read_sampling_field(Fields({name: bound}), name, spec, 0) == bound


def test_every_field_is_declared_with_a_valid_default():
    assert all(isinstance(spec, FieldSpec) for _, spec in sampling_fields(SamplingParams))
    SamplingParams(**server_defaults(SamplingParams)).validate()
    assert server_defaults(SamplingParams) == {"dry_penalty_last_n": 64}  # llama-server's own


def test_parameters_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        SamplingParams().temperature = 0.1  # type: ignore[misc]


def test_echo_follows_the_table():
    params = SamplingParams(top_p=0.95, seed=-1, logit_bias=[(3, -math.inf), (4, 0.1)], ignore_eos=True)
    echo = echo_fields(params)
    assert list(echo) == [name for name, _ in sampling_fields(SamplingParams)]
    assert echo["top_p"] == f32(0.95) != 0.95 and echo["seed"] == 0xFFFFFFFF and echo["top_k"] == 40
    assert echo["logit_bias"] == [{"bias": None, "token": 3}, {"bias": f32(0.1), "token": 4}]
    assert echo_fields(params, logit_bias=[])["logit_bias"] == []
    assert echo["ignore_eos"] is True and echo["samplers"] == list(params.samplers)


def test_a_new_field_is_one_declaration():
    """What a hypothetical sampler field gets from its entry alone: validation, echo, reading."""

    @dataclasses.dataclass(frozen=True)
    class WithTopA:
        top_a: float = number(0.0, minimum=0, maximum=1, aliases=("top-a",))

    with pytest.raises(ValueError, match=r"^top_a: must be a number in \[0, 1\], got 2$"):
        check_fields(WithTopA(top_a=2))
    assert echo_fields(WithTopA(top_a=0.3)) == {"top_a": f32(0.3)}
    (name, spec), = sampling_fields(WithTopA)
    assert read_sampling_field(Fields({"top-a": 0.5}), name, spec, 0.0) == 0.5  # under its alias
    assert read_sampling_field(Fields({}), name, spec, 0.25) == 0.25
    with pytest.raises(ApiError, match=r"Field 'top-a': must be a number in \[0, 1\]"):
        read_sampling_field(Fields({"top-a": 7}), name, spec, 0.0)
