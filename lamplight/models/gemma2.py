"""The `gemma2` architecture: embeddings scaled by sqrt(n_embd), norms before and after each
branch, GeGLU, attention logits soft-capped, final logits soft-capped, even layers attending
to a sliding window (llama.cpp fixes the pattern at 2), NEOX rope. The converter folded
Gemma's "1 + weight" into the stored norm weights."""

from __future__ import annotations

import math

from ..gguf.file import GGUFFile
from .config import ModelConfig
from .options import DecoderOptions, read_rope, sliding_pattern

SWA_PERIOD = 2
# llama.cpp scales queries by 1/sqrt(n_embd / n_head) instead of 1/sqrt(head_dim) for the model
# type it recognises as Gemma 2 27B, by its 46 layers (Gemma 2's query_pre_attn_scalar).
GEMMA2_27B_LAYERS = 46


def options(gguf: GGUFFile, config: ModelConfig) -> DecoderOptions:
    return DecoderOptions(
        neox_rope=True,
        rope_scaling=read_rope(gguf, config),
        activation="gelu_tanh_fp16",
        embd_scale=math.sqrt(config.n_embd),
        attn_softcap=float(gguf.arch_value("attn_logit_softcapping", 0.0)) or None,
        final_softcap=float(gguf.arch_value("final_logit_softcapping", 0.0)) or None,
        attn_scale=(config.n_embd // config.n_heads) ** -0.5 if config.n_layers == GEMMA2_27B_LAYERS else None,
        sliding_layers=sliding_pattern(gguf, config.n_layers, period=SWA_PERIOD),
        window=int(gguf.arch_value("attention.sliding_window", 0)),
    )
