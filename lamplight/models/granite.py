"""The `granite` architecture (IBM Granite 3): llama's graph with four scales from the file:
embeddings times embedding_scale, each branch's output times residual_scale, attention.scale in
place of 1/sqrt(head_dim), logits divided by logit_scale. NORM rope.

`granitehybrid` (Granite 4.0-H): the same scales over a stack of Mamba2 layers (those whose
head_count_kv entry is 0) and GQA attention layers without Q/K norms; rope.scaling.finetuned
false means no positional encoding at all (Granite-4.0-H), true or absent NORM rope. Dense
SwiGLU FFN on every layer (H-Micro); the MoE + shared-expert variant is not covered."""

from __future__ import annotations

import dataclasses

from ..gguf.file import GGUFFile
from .config import ModelConfig
from .lfm2 import recurrent_where_no_kv
from .options import DecoderOptions, read_rope, scale_key
from .qwen35 import read_ssm


def options(gguf: GGUFFile, config: ModelConfig) -> DecoderOptions:
    return DecoderOptions(
        neox_rope=False,
        rope_scaling=read_rope(gguf, config),
        embd_scale=scale_key(gguf, "embedding_scale"),
        residual_scale=scale_key(gguf, "residual_scale"),
        attn_scale=scale_key(gguf, "attention.scale", 0.0) or None,
        logit_scale=scale_key(gguf, "logit_scale"),
    )


def hybrid_options(gguf: GGUFFile, config: ModelConfig) -> DecoderOptions:
    """granite's scales, over Mamba2 layers where a layer has no KV heads."""
    rope = bool(gguf.arch_value("rope.scaling.finetuned", True))
    return dataclasses.replace(
        options(gguf, config),
        layer_kinds=recurrent_where_no_kv(config, "mamba2"),
        ssm=read_ssm(gguf),
        no_rope_layers=() if rope else (True,) * config.n_layers,
    )
