"""Per-request sampling parameters, with llama.cpp's defaults and strict validation."""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass
from typing import Iterable

from .spec import boolean, check_fields, f32, integer, listed, number
from .values import FLOAT32_MAX, is_number

# llama.cpp's default `samplers` list (common/common.h, CLI `--sampling-seq edskypmxt`).
DEFAULT_SAMPLERS: tuple[str, ...] = (
    "penalties",
    "dry",
    "top_n_sigma",
    "top_k",
    "typ_p",
    "top_p",
    "min_p",
    "xtc",
    "temperature",
)
DEFAULT_DRY_SEQUENCE_BREAKERS: tuple[str, ...] = ("\n", ":", '"', "*")

# Seed value that asks for a random seed (llama.cpp's LLAMA_DEFAULT_SEED, also written as -1).
RANDOM_SEED = 0xFFFFFFFF

_CHAR_NAMES = {
    "e": "penalties",
    "d": "dry",
    "s": "top_n_sigma",
    "k": "top_k",
    "y": "typ_p",
    "p": "top_p",
    "m": "min_p",
    "x": "xtc",
    "t": "temperature",
}
# llama.cpp knows these too; lamplight does not implement them, so naming one is an error.
_UNSUPPORTED = {"infill", "adaptive_p", "adaptive-p", "adaptivep", "i", "a"}


def _name_aliases() -> dict[str, str]:
    aliases: dict[str, str] = {}
    for name in DEFAULT_SAMPLERS:
        aliases[name] = name
        aliases[name.replace("_", "-")] = name  # kebab-case
        aliases[name.replace("_", "")] = name  # no underscore
    aliases.update(
        {"nucleus": "top_p", "temp": "temperature", "typ": "typ_p", "typical": "typ_p", "typical-p": "typ_p"}
    )
    return aliases


_NAME_ALIASES = _name_aliases()


def parse_samplers(value: list[str] | tuple[str, ...] | str) -> list[str]:
    """The `samplers` request field as canonical names, in order (repeats are kept: applied twice).

    A list holds names (case-insensitive; aliases such as `top-k`, `topk`, `nucleus`, `temp`,
    `typ`); a string holds one letter per sampler (`edskypmxt`). ValueError("samplers: ...").
    """
    try:
        return _canonical_samplers(value)
    except ValueError as exc:
        raise ValueError(f"samplers: {exc}") from None


def _canonical_samplers(value: object) -> list[str]:
    if isinstance(value, str):
        return [_sampler_from_char(char) for char in value]
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"expected a list of names or a string of letters, got {type(value).__name__}")
    return [_sampler_from_name(name) for name in value]


def _sampler_from_char(char: str) -> str:
    if char in _CHAR_NAMES:
        return _CHAR_NAMES[char]
    if char in _UNSUPPORTED:
        raise ValueError(f"sampler letter {char!r} is not supported by lamplight")
    raise ValueError(f"unknown sampler letter {char!r} (known: {''.join(_CHAR_NAMES)})")


def _sampler_from_name(name: object) -> str:
    if not isinstance(name, str):
        raise ValueError(f"expected sampler names as strings, got {name!r}")
    key = name.strip().lower()
    if key in _NAME_ALIASES:
        return _NAME_ALIASES[key]
    if key in _UNSUPPORTED:
        raise ValueError(f"sampler {name!r} is not supported by lamplight")
    raise ValueError(f"unknown sampler {name!r} (known: {', '.join(DEFAULT_SAMPLERS)})")


def effective_seed(seed: int) -> int:
    """The seed a request really uses: -1 / 0xFFFFFFFF become a fresh random 32-bit seed.

    Call it once per request (all choices of one request share it) and keep the result.
    """
    if seed in (-1, RANDOM_SEED):
        return secrets.randbits(32)
    return seed


def _check_breakers(breakers: object) -> None:
    if not isinstance(breakers, (list, tuple)) or not breakers:
        raise ValueError("must be a non-empty array of strings")
    for breaker in breakers:
        if not isinstance(breaker, str) or not breaker:
            raise ValueError(f"every breaker must be a non-empty string, got {breaker!r}")


def _check_logit_bias(entries: object) -> None:
    if not isinstance(entries, (list, tuple)):
        raise ValueError("must be a list of (token_id, bias) pairs")
    for entry in entries:
        if not (isinstance(entry, (list, tuple)) and len(entry) == 2):
            raise ValueError(f"expected (token_id, bias) pairs, got {entry!r}")
        token, bias = entry
        if isinstance(token, bool) or not isinstance(token, int):
            raise ValueError(f"token ids must be integers, got {token!r}")
        if not is_number(bias):
            raise ValueError(f"bias for token {token} must be a number, got {bias!r}")
        if math.isnan(bias) or bias == math.inf or (math.isfinite(bias) and abs(bias) > FLOAT32_MAX):
            raise ValueError(f"bias for token {token} must be finite in float32 or -inf, got {bias!r}")


def _echo_seed(seed: int) -> int:
    return RANDOM_SEED if seed == -1 else seed


def logit_bias_json(bias: Iterable[tuple[int, float]]) -> list[dict]:
    """As llama-server echoes logit_bias: a ban (-inf) is a null bias."""
    return [{"bias": None if math.isinf(b) else f32(b), "token": token} for token, b in bias]


@dataclass(frozen=True)
class SamplingParams:
    """Every llama.cpp sampling field, with llama.cpp's defaults (server semantics doc 2.3).

    Each field declares its own range and echo (lamplight.sampling.spec; its serve flag is in
    lamplight.serve_flags.SAMPLING_SPELLINGS), in the order
    llama-server's generation_settings lists them. Where llama.cpp silently clamps or replaces a
    value, validate() rejects it instead.
    """

    seed: int = integer(-1, minimum=-1, maximum=RANDOM_SEED, echo=_echo_seed)
    temperature: float = number(0.8, minimum=0)
    dynatemp_range: float = number(0.0, minimum=0)
    dynatemp_exponent: float = number(1.0, minimum=0)
    top_k: int = integer(40)  # <= 0 disables it, as in llama.cpp
    top_p: float = number(0.95, minimum=0, maximum=1)
    min_p: float = number(0.05, minimum=0, maximum=1)
    top_n_sigma: float = number(-1.0)  # <= 0 disables it
    xtc_probability: float = number(0.0, minimum=0, maximum=1)
    xtc_threshold: float = number(0.1, minimum=0, maximum=1)  # > 0.5 disables XTC
    typical_p: float = number(1.0, minimum=0, maximum=1)
    repeat_last_n: int = integer(64, minimum=-1)
    repeat_penalty: float = number(1.0, above=0)
    presence_penalty: float = number(0.0)
    frequency_penalty: float = number(0.0)
    dry_multiplier: float = number(0.0, minimum=0)
    dry_base: float = number(1.75, minimum=1)
    dry_allowed_length: int = integer(2, minimum=0)
    dry_penalty_last_n: int = integer(-1, minimum=-1, server_default=64)
    dry_sequence_breakers: list[str] = listed(DEFAULT_DRY_SEQUENCE_BREAKERS, _check_breakers, in_props=False)
    mirostat: int = integer(0, minimum=0, maximum=2)
    mirostat_tau: float = number(5.0, minimum=0)
    mirostat_eta: float = number(0.1, minimum=0)
    ignore_eos: bool = boolean(False)
    logit_bias: list[tuple[int, float]] = listed((), _check_logit_bias, echo=logit_bias_json, in_props=False)
    n_probs: int = integer(0, minimum=0)
    min_keep: int = integer(0, minimum=0)
    samplers: list[str] = listed(DEFAULT_SAMPLERS, _canonical_samplers)
    post_sampling_probs: bool = boolean(False)

    def validate(self) -> None:
        """Raise ValueError("<field>: <reason>") for the first bad value."""
        check_fields(self)
