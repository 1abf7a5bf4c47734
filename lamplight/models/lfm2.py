"""The `lfm2` architecture (LiquidAI LFM2 / LFM2.5): gated short convolutions and GQA attention.

A layer is a short-conv layer iff its attention.head_count_kv entry is 0: in_proj gives
[B; C; X], y = out_proj(C * causal_conv(B * X)) with shortconv.l_cache taps, no bias, no
activation (lamplight.models.recurrent). Attention layers: per-head Q/K RMSNorm, NEOX rope over
the whole head. The final norm is stored as token_embd_norm.weight.
"""

from __future__ import annotations

from ..gguf.file import GGUFFile
from .config import ModelConfig
from .options import DecoderOptions, SSMOptions, read_rope


def recurrent_where_no_kv(config: ModelConfig, kind: str) -> tuple[str, ...]:
    """Layer kinds where a 0 in the per-layer head_count_kv marks a recurrent layer (lfm2, granitehybrid)."""
    heads = config.layer_kv_heads or (config.n_kv_heads,) * config.n_layers
    return tuple(kind if n == 0 else "attention" for n in heads)


def options(gguf: GGUFFile, config: ModelConfig) -> DecoderOptions:
    return DecoderOptions(
        neox_rope=True,
        rope_scaling=read_rope(gguf, config),
        layer_kinds=recurrent_where_no_kv(config, "shortconv"),
        ssm=SSMOptions(conv_kernel=int(gguf.require_arch_value("shortconv.l_cache"))),
        output_norm_tensor="token_embd_norm.weight",
    )
