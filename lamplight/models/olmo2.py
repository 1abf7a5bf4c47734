"""The `olmo2` architecture (OLMo 2, and OLMo 3 with sliding windows): no norms before the
branches, RMSNorm after attention and after the FFN, Q/K RMSNorm over the whole projections,
NEOX rope. OLMo 3's sliding-window layers rotate with the plain rope; YaRN (if the file has
it) applies to the full-attention layers only, as in llama.cpp."""

from __future__ import annotations

from ..gguf.file import GGUFFile
from .config import ModelConfig
from .options import DecoderOptions, read_rope, sliding_pattern

# llama.cpp's default when the file gives a window but no pattern: 3 sliding layers, then 1 full.
DEFAULT_SWA_PERIOD = 4


def options(gguf: GGUFFile, config: ModelConfig) -> DecoderOptions:
    return DecoderOptions(
        neox_rope=True,
        rope_scaling=read_rope(gguf, config),
        scaled_rope_on_sliding=False,
        sliding_layers=sliding_pattern(gguf, config.n_layers, default_period=DEFAULT_SWA_PERIOD),
        window=int(gguf.arch_value("attention.sliding_window", 0)),
    )
