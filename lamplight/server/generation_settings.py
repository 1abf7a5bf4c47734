"""`generation_settings` (native responses) and `/props` default params, key for key as llama-server.

The sampling fields are echoed as their entries in lamplight.sampling.spec say (floats through
float32 as in llama.cpp: 0.95 is echoed as 0.949999988079071), in SamplingParams' field order,
which is llama-server's. Its other keys are written here, each after the sampling field it
follows in llama-server's list.
"""

from __future__ import annotations

import math
from typing import Iterable

from lamplight.sampling.params import SamplingParams
from lamplight.sampling.spec import echo_fields, f32, props_hidden

# Keys /props leaves out of default_generation_settings.params, besides the sampling fields whose
# entry says so (dry_sequence_breakers, logit_bias).
_NOT_IN_PROPS = ("stop", "grammar", "grammar_lazy", "grammar_triggers", "preserved_tokens")


def generation_settings(sampling: SamplingParams, *, n_predict: int, stop: list[str], n_keep: int,
                        n_discard: int, stream: bool, timings_per_token: bool,
                        eog_ids: Iterable[int] = (), lora_scales: Iterable[float] = (),
                        reasoning_format: str = "deepseek", grammar: str = "", speculative_types: str = "none") -> dict:
    bias = list(sampling.logit_bias)
    if sampling.ignore_eos:
        bias += [(token, -math.inf) for token in sorted(eog_ids)]
    following = _keys_after_fields(n_predict=n_predict, stop=stop, n_keep=n_keep, n_discard=n_discard, stream=stream,
                                   timings_per_token=timings_per_token, lora_scales=lora_scales,
                                   reasoning_format=reasoning_format, grammar=grammar,
                                   speculative_types=speculative_types)
    settings = {}
    for key, value in echo_fields(sampling, logit_bias=bias).items():
        settings[key] = value
        settings.update(following.get(key, {}))
    return settings


def _keys_after_fields(*, n_predict: int, stop: list[str], n_keep: int, n_discard: int, stream: bool,
                       timings_per_token: bool, lora_scales: Iterable[float], reasoning_format: str,
                       grammar: str, speculative_types: str) -> dict[str, dict]:
    """llama-server's keys that are not sampling fields, by the sampling field they follow."""
    return {
        "mirostat_eta": {
            "adaptive_target": -1.0,  # adaptive-p is not implemented
            "adaptive_decay": f32(0.9),
            "stop": list(stop),
            "max_tokens": n_predict,
            "n_predict": n_predict,
            "n_keep": n_keep,
            "n_discard": n_discard,
        },
        "ignore_eos": {"stream": stream},
        "min_keep": {
            "grammar": grammar,
            "grammar_lazy": False,
            "grammar_triggers": [],
            "preserved_tokens": [],
            "chat_format": "Content-only",
            "reasoning_format": reasoning_format,
            "reasoning_in_content": False,
            "generation_prompt": "",
        },
        "samplers": {"speculative.types": speculative_types, "timings_per_token": timings_per_token},
        "post_sampling_probs": {
            "backend_sampling": False,
            "lora": [{"id": i, "scale": f32(scale)} for i, scale in enumerate(lora_scales)],
        },
    }


def lora_scales(requested: list[tuple[int, float]] | None, adapters: list) -> list[float]:
    """Every loaded adapter's scale for a request: as asked (unlisted ones 0), else the server's."""
    if requested is None:
        return [adapter.scale for adapter in adapters]
    asked = dict(requested)
    return [asked.get(i, 0.0) for i in range(len(adapters))]


def speculative_types(engine, request=None) -> str:
    """`speculative.types` of a request with these speculative fields (None: the server's)."""
    describe = getattr(engine, "speculative_types", None)
    return describe(request) if describe is not None else "none"


def props_default_params(sampling: SamplingParams, n_predict: int, n_keep: int,
                         adapters: list = (), engine=None) -> dict:
    settings = generation_settings(sampling, n_predict=n_predict, stop=[], n_keep=n_keep, n_discard=0,
                                   stream=False, timings_per_token=False,
                                   lora_scales=lora_scales(None, list(adapters)), reasoning_format="none",
                                   speculative_types=speculative_types(engine))
    for key in (*_NOT_IN_PROPS, *props_hidden(sampling)):
        del settings[key]
    return settings
