"""The `mistral3` architecture (Mistral Small 3.x / Ministral 3 text): llama's graph (NORM
rope) with YaRN, an optional attention.scale, and llama 4's attention temperature on the
queries. llama.cpp's mistral3 graph passes attn_factor = 1 / (1 + 0.1 ln factor) to rope, which
cancels YaRN's magnitude: the rotations keep unit length."""

from __future__ import annotations

import math

from ..gguf.file import GGUFError, GGUFFile
from .config import ModelConfig
from .options import DecoderOptions, QueryTemperature, read_rope, scale_key


def options(gguf: GGUFFile, config: ModelConfig) -> DecoderOptions:
    scaling = read_rope(gguf, config)
    scaling = scaling.with_attn_factor(1.0 / (1.0 + 0.1 * math.log(1.0 / scaling.freq_scale)))
    return DecoderOptions(
        neox_rope=False,
        rope_scaling=scaling,
        attn_scale=scale_key(gguf, "attention.scale", 0.0) or None,
        query_temperature=_temperature(gguf, scaling.n_ctx_orig),
    )


def _temperature(gguf: GGUFFile, n_ctx_orig: int) -> QueryTemperature | None:
    """llama.cpp: attention.temperature_scale, over steps of the YaRN original context length."""
    scale = float(gguf.arch_value("attention.temperature_scale", 0.0) or 0.0)
    if scale == 0.0:
        return None
    length = int(gguf.arch_value("attention.temperature_length", 0) or n_ctx_orig)
    if length <= 0:
        raise GGUFError(f"{gguf.path}: attention.temperature_scale needs rope.scaling.original_context_length")
    return QueryTemperature(scale, length)
