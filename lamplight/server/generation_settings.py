"""`generation_settings` (native responses) and `/props` default params, key for key as llama-server.

Floats go through float32 as in llama.cpp (0.95 is echoed as 0.949999988079071).
"""

from __future__ import annotations

import math
from typing import Iterable

import numpy as np

from lamplight.sampling.params import RANDOM_SEED, SamplingParams

# Keys /props leaves out of default_generation_settings.params.
_NOT_IN_PROPS = ("dry_sequence_breakers", "stop", "logit_bias", "grammar", "grammar_lazy",
                 "grammar_triggers", "preserved_tokens")


def f32(value: float) -> float:
    return float(np.float32(value))


def _echo_seed(seed: int) -> int:
    return RANDOM_SEED if seed == -1 else seed


def logit_bias_json(bias: Iterable[tuple[int, float]]) -> list[dict]:
    return [{"bias": None if math.isinf(b) else f32(b), "token": token} for token, b in bias]


def generation_settings(sampling: SamplingParams, *, n_predict: int, stop: list[str], n_keep: int,
                        n_discard: int, stream: bool, timings_per_token: bool,
                        eog_ids: Iterable[int] = (), lora_scales: Iterable[float] = (),
                        reasoning_format: str = "deepseek", grammar: str = "") -> dict:
    bias = list(sampling.logit_bias)
    if sampling.ignore_eos:
        bias += [(token, -math.inf) for token in sorted(eog_ids)]
    return {
        "seed": _echo_seed(sampling.seed),
        "temperature": f32(sampling.temperature),
        "dynatemp_range": f32(sampling.dynatemp_range),
        "dynatemp_exponent": f32(sampling.dynatemp_exponent),
        "top_k": sampling.top_k,
        "top_p": f32(sampling.top_p),
        "min_p": f32(sampling.min_p),
        "top_n_sigma": f32(sampling.top_n_sigma),
        "xtc_probability": f32(sampling.xtc_probability),
        "xtc_threshold": f32(sampling.xtc_threshold),
        "typical_p": f32(sampling.typical_p),
        "repeat_last_n": sampling.repeat_last_n,
        "repeat_penalty": f32(sampling.repeat_penalty),
        "presence_penalty": f32(sampling.presence_penalty),
        "frequency_penalty": f32(sampling.frequency_penalty),
        "dry_multiplier": f32(sampling.dry_multiplier),
        "dry_base": f32(sampling.dry_base),
        "dry_allowed_length": sampling.dry_allowed_length,
        "dry_penalty_last_n": sampling.dry_penalty_last_n,
        "dry_sequence_breakers": list(sampling.dry_sequence_breakers),
        "mirostat": sampling.mirostat,
        "mirostat_tau": f32(sampling.mirostat_tau),
        "mirostat_eta": f32(sampling.mirostat_eta),
        "adaptive_target": -1.0,  # adaptive-p is not implemented
        "adaptive_decay": f32(0.9),
        "stop": list(stop),
        "max_tokens": n_predict,
        "n_predict": n_predict,
        "n_keep": n_keep,
        "n_discard": n_discard,
        "ignore_eos": sampling.ignore_eos,
        "stream": stream,
        "logit_bias": logit_bias_json(bias),
        "n_probs": sampling.n_probs,
        "min_keep": sampling.min_keep,
        "grammar": grammar,
        "grammar_lazy": False,
        "grammar_triggers": [],
        "preserved_tokens": [],
        "chat_format": "Content-only",
        "reasoning_format": reasoning_format,
        "reasoning_in_content": False,
        "generation_prompt": "",
        "samplers": list(sampling.samplers),
        "speculative.types": "none",
        "timings_per_token": timings_per_token,
        "post_sampling_probs": sampling.post_sampling_probs,
        "backend_sampling": False,
        "lora": [{"id": i, "scale": f32(scale)} for i, scale in enumerate(lora_scales)],
    }


def lora_scales(requested: list[tuple[int, float]] | None, adapters: list) -> list[float]:
    """Every loaded adapter's scale for a request: as asked (unlisted ones 0), else the server's."""
    if requested is None:
        return [adapter.scale for adapter in adapters]
    asked = dict(requested)
    return [asked.get(i, 0.0) for i in range(len(adapters))]


def props_default_params(sampling: SamplingParams, n_predict: int, n_keep: int,
                         adapters: list = ()) -> dict:
    settings = generation_settings(sampling, n_predict=n_predict, stop=[], n_keep=n_keep, n_discard=0,
                                   stream=False, timings_per_token=False,
                                   lora_scales=lora_scales(None, list(adapters)), reasoning_format="none")
    for key in _NOT_IN_PROPS:
        del settings[key]
    return settings
