"""Per-request sampling parameters, with llama.cpp's defaults and strict validation."""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, field

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

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
FLOAT32_MAX = 3.4028234663852886e38

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
    `typ`); a string holds one letter per sampler (`edskypmxt`).
    """
    if isinstance(value, str):
        return [_sampler_from_char(char) for char in value]
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"samplers: expected a list of names or a string of letters, got {type(value).__name__}")
    return [_sampler_from_name(name) for name in value]


def _sampler_from_char(char: str) -> str:
    if char in _CHAR_NAMES:
        return _CHAR_NAMES[char]
    if char in _UNSUPPORTED:
        raise ValueError(f"samplers: sampler letter {char!r} is not supported by lamplight")
    raise ValueError(f"samplers: unknown sampler letter {char!r} (known: {''.join(_CHAR_NAMES)})")


def _sampler_from_name(name: object) -> str:
    if not isinstance(name, str):
        raise ValueError(f"samplers: expected sampler names as strings, got {name!r}")
    key = name.strip().lower()
    if key in _NAME_ALIASES:
        return _NAME_ALIASES[key]
    if key in _UNSUPPORTED:
        raise ValueError(f"samplers: sampler {name!r} is not supported by lamplight")
    raise ValueError(f"samplers: unknown sampler {name!r} (known: {', '.join(DEFAULT_SAMPLERS)})")


def effective_seed(seed: int) -> int:
    """The seed a request really uses: -1 / 0xFFFFFFFF become a fresh random 32-bit seed.

    Call it once per request (all choices of one request share it) and keep the result.
    """
    if seed in (-1, RANDOM_SEED):
        return secrets.randbits(32)
    return seed


@dataclass
class SamplingParams:
    """Every llama.cpp sampling field, with llama.cpp's defaults (server semantics doc 2.3)."""

    temperature: float = 0.8
    dynatemp_range: float = 0.0
    dynatemp_exponent: float = 1.0
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    typical_p: float = 1.0
    top_n_sigma: float = -1.0
    min_keep: int = 0
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    repeat_last_n: int = 64
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = -1
    dry_sequence_breakers: list[str] = field(default_factory=lambda: list(DEFAULT_DRY_SEQUENCE_BREAKERS))
    mirostat: int = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    samplers: list[str] = field(default_factory=lambda: list(DEFAULT_SAMPLERS))
    logit_bias: list[tuple[int, float]] = field(default_factory=list)
    ignore_eos: bool = False
    seed: int = -1
    n_probs: int = 0
    post_sampling_probs: bool = False

    def validate(self) -> None:
        """Raise ValueError("<field>: <reason>") for the first bad value.

        Where llama.cpp silently clamps or replaces a value, lamplight rejects it instead.
        """
        _finite(self, "temperature", minimum=0.0)
        _finite(self, "dynatemp_range", minimum=0.0)
        _finite(self, "dynatemp_exponent", minimum=0.0)
        _integer(self, "top_k")  # <= 0 disables it, as in llama.cpp
        _finite(self, "top_p", minimum=0.0, maximum=1.0)
        _finite(self, "min_p", minimum=0.0, maximum=1.0)
        _finite(self, "typical_p", minimum=0.0, maximum=1.0)
        _finite(self, "top_n_sigma")  # <= 0 disables it
        _integer(self, "min_keep", minimum=0)
        _finite(self, "xtc_probability", minimum=0.0, maximum=1.0)
        _finite(self, "xtc_threshold", minimum=0.0, maximum=1.0)  # > 0.5 disables XTC
        _integer(self, "repeat_last_n", minimum=-1)
        _finite(self, "repeat_penalty")
        if self.repeat_penalty <= 0:
            raise ValueError(f"repeat_penalty: must be greater than 0, got {self.repeat_penalty}")
        _finite(self, "presence_penalty")
        _finite(self, "frequency_penalty")
        _finite(self, "dry_multiplier", minimum=0.0)
        _finite(self, "dry_base", minimum=1.0)
        _integer(self, "dry_allowed_length", minimum=0)
        _integer(self, "dry_penalty_last_n", minimum=-1)
        self._validate_breakers()
        _integer(self, "mirostat")
        if self.mirostat not in (0, 1, 2):
            raise ValueError(f"mirostat: must be 0, 1 or 2, got {self.mirostat}")
        _finite(self, "mirostat_tau", minimum=0.0)
        _finite(self, "mirostat_eta", minimum=0.0)
        parse_samplers(self.samplers)
        self._validate_logit_bias()
        _boolean(self, "ignore_eos")
        _integer(self, "seed", minimum=-1, maximum=RANDOM_SEED)
        _integer(self, "n_probs", minimum=0)
        _boolean(self, "post_sampling_probs")

    def _validate_breakers(self) -> None:
        breakers = self.dry_sequence_breakers
        if not isinstance(breakers, (list, tuple)) or not breakers:
            raise ValueError("dry_sequence_breakers: must be a non-empty array of strings")
        for breaker in breakers:
            if not isinstance(breaker, str) or not breaker:
                raise ValueError(f"dry_sequence_breakers: every breaker must be a non-empty string, got {breaker!r}")

    def _validate_logit_bias(self) -> None:
        if not isinstance(self.logit_bias, (list, tuple)):
            raise ValueError("logit_bias: must be a list of (token_id, bias) pairs")
        for entry in self.logit_bias:
            if not (isinstance(entry, (list, tuple)) and len(entry) == 2):
                raise ValueError(f"logit_bias: expected (token_id, bias) pairs, got {entry!r}")
            token, bias = entry
            if isinstance(token, bool) or not isinstance(token, int):
                raise ValueError(f"logit_bias: token ids must be integers, got {token!r}")
            if isinstance(bias, bool) or not isinstance(bias, (int, float)):
                raise ValueError(f"logit_bias: bias for token {token} must be a number, got {bias!r}")
            if math.isnan(bias) or bias == math.inf or (math.isfinite(bias) and abs(bias) > FLOAT32_MAX):
                raise ValueError(f"logit_bias: bias for token {token} must be finite in float32 or -inf, got {bias!r}")


def _finite(params: SamplingParams, name: str, minimum: float | None = None, maximum: float | None = None) -> None:
    """A number that stays finite in float32, the precision sampling runs in."""
    value = getattr(params, name)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name}: must be a number, got {value!r}")
    if not math.isfinite(value) or abs(value) > FLOAT32_MAX:
        raise ValueError(f"{name}: must be finite in float32 (|x| <= {FLOAT32_MAX:.7g}), got {value}")
    _in_range(name, value, minimum, maximum)


def _integer(params: SamplingParams, name: str, minimum: int | None = None, maximum: int | None = None) -> None:
    """An integer in [minimum, maximum]; where a bound is not given, within int32 (as llama.cpp's
    fields are; a larger value would overflow the int64 tensors the samplers build)."""
    value = getattr(params, name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}: must be an integer, got {value!r}")
    _in_range(name, value, INT32_MIN if minimum is None else minimum, INT32_MAX if maximum is None else maximum)


def _boolean(params: SamplingParams, name: str) -> None:
    value = getattr(params, name)
    if not isinstance(value, bool):
        raise ValueError(f"{name}: must be true or false, got {value!r}")


def _in_range(name: str, value: float, minimum: float | None, maximum: float | None) -> None:
    if minimum is not None and value < minimum:
        raise ValueError(f"{name}: must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name}: must be <= {maximum}, got {value}")
