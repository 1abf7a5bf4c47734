"""The `phi3` architecture (Phi-3, Phi-4-mini): fused attn_qkv, fused ffn_up holding [gate; up],
NEOX rope over rope.dimension_count dims (partial rotary where that is less than the head).
llama.cpp ignores phi3's attention.sliding_window (full attention), and so does lamplight.
LongRoPE files (rope_factors_long/short) are refused at load (see Decoder)."""

from __future__ import annotations

from ..gguf.file import GGUFFile
from .config import ModelConfig
from .options import DecoderOptions, read_rope


def options(gguf: GGUFFile, config: ModelConfig) -> DecoderOptions:
    return DecoderOptions(neox_rope=True, rope_scaling=read_rope(gguf, config))
