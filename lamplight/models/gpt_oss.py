"""The `gpt-oss` architecture: Q/K/V and output biases, a learned sink logit per head in every
attention softmax, even layers on a sliding window (llama.cpp fixes the pattern at 2), YaRN
NEOX rope, and a MoE FFN: router with bias, top-k of the router logits, softmax over the k
selected, experts with biases and the clamped SwiGLU (alpha 1.702, limit 7), in MXFP4. Its
FFN input norm is stored as post_attention_norm."""

from __future__ import annotations

from ..gguf.file import GGUFFile
from .config import ModelConfig
from .options import DecoderOptions, MoEOptions, read_rope, sliding_pattern

SWA_PERIOD = 2


def options(gguf: GGUFFile, config: ModelConfig) -> DecoderOptions:
    moe = MoEOptions(
        n_used=int(gguf.require_arch_value("expert_used_count")),
        gating="softmax_selected",
        normalize=False,
        activation="swiglu_oai",
    )
    return DecoderOptions(
        neox_rope=True,
        rope_scaling=read_rope(gguf, config),
        sliding_layers=sliding_pattern(gguf, config.n_layers, period=SWA_PERIOD),
        window=int(gguf.arch_value("attention.sliding_window", 0)),
        ffn_norm_tensor="post_attention_norm.weight",
        moe=moe,
    )
