"""The `granite` architecture (IBM Granite 3): llama's graph with four scales from the file:
embeddings times embedding_scale, each branch's output times residual_scale, attention.scale in
place of 1/sqrt(head_dim), logits divided by logit_scale. NORM rope."""

from __future__ import annotations

from ..gguf.file import GGUFFile
from .config import ModelConfig
from .options import DecoderOptions, read_rope, scale_key


def options(gguf: GGUFFile, config: ModelConfig) -> DecoderOptions:
    return DecoderOptions(
        neox_rope=False,
        rope_scaling=read_rope(gguf, config),
        embd_scale=scale_key(gguf, "embedding_scale"),
        residual_scale=scale_key(gguf, "residual_scale"),
        attn_scale=scale_key(gguf, "attention.scale", 0.0) or None,
        logit_scale=scale_key(gguf, "logit_scale"),
    )
