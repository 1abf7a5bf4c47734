"""The `gemma4` architecture (Gemma 4 text models as converted by llama.cpp; dense layers).

Beyond gemma3: per-layer embeddings (a slice of per_layer_token_embd per layer, mixed with a
projection of the scaled token embedding, added through each layer's inp_gate/proj branch);
the last attention.shared_kv_layers layers keep no K/V and attend over the cache of the last
earlier layer of their kind; sliding and full layers have their own head sizes
(key_length_swa / key_length) and KV head counts (per-layer head_count_kv); V is RMS-normalised
without weight, and is the raw K projection in layers without attn_v; attention scale 1;
layer_output_scale multiplies the whole residual stream after each layer. Rope: sliding layers
NEOX over rope.dimension_count_swa dims with base rope.freq_base_swa; full layers NEOX over the
head with rope_freqs ("proportional" rope: factors of 1e30 freeze the later pairs). GeGLU with
ggml's fp16 GELU table; final logits soft-capped. MoE layers (26B-A4B) are not covered.
"""

from __future__ import annotations

import math

from ..gguf.file import GGUFFile
from .config import ModelConfig
from .options import DecoderOptions, read_rope, sliding_pattern


def options(gguf: GGUFFile, config: ModelConfig) -> DecoderOptions:
    head_k_swa = int(gguf.arch_value("attention.key_length_swa", config.head_dim_k))
    head_v_swa = int(gguf.arch_value("attention.value_length_swa", head_k_swa))
    return DecoderOptions(
        neox_rope=True,
        rope_scaling=read_rope(gguf, config),
        scaled_rope_on_sliding=False,
        sliding_rope_base=float(gguf.arch_value("rope.freq_base_swa", 10000.0)),
        sliding_rope_dims=int(gguf.arch_value("rope.dimension_count_swa", head_k_swa)),
        sliding_head_dims=(head_k_swa, head_v_swa),
        activation="gelu_tanh_fp16",
        embd_scale=math.sqrt(config.n_embd),
        final_softcap=float(gguf.arch_value("final_logit_softcapping", 0.0) or 0.0) or None,
        attn_scale=1.0,
        sliding_layers=sliding_pattern(gguf, config.n_layers),
        window=int(gguf.arch_value("attention.sliding_window", 0)),
        shared_kv_layers=int(gguf.arch_value("attention.shared_kv_layers", 0)),
        value_norm=True,
        attn_v_optional=True,
    )
