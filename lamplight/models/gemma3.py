"""The `gemma3` architecture (Gemma 3 text models as converted by llama.cpp).

Differences from llama: embeddings scaled by sqrt(n_embd); RMSNorm on Q and K per head; a
norm after attention and after the MLP as well as before (read from the tensors); GeGLU
(tanh-approximated GELU); NEOX rope; local layers attend to a sliding window with rope base
10000 and no scaling, while every sixth layer is global with the file's base and scaling (as
llama.cpp: rope_freq_base_train_swa 10000, rope_freq_scale_train_swa 1); queries scaled by
1/sqrt(head_dim), except for the 27B (62 layers), which llama.cpp scales by
1/sqrt(n_embd / n_head). The converter already folded Gemma's "1 + weight" norm convention into
the stored norm weights.
"""

from __future__ import annotations

import math

from ..gguf.file import GGUFFile
from .config import ModelConfig
from .options import DecoderOptions, read_rope, sliding_pattern

GLOBAL_LAYER_PERIOD = 6  # layers 5, 11, 17, ... attend globally (llama.cpp: swa pattern 6)
LOCAL_ROPE_BASE = 10000.0
DEFAULT_WINDOW = 4096
GEMMA3_27B_LAYERS = 62


def options(gguf: GGUFFile, config: ModelConfig) -> DecoderOptions:
    window = int(gguf.arch_value("attention.sliding_window", DEFAULT_WINDOW))
    return DecoderOptions(
        neox_rope=True,
        rope_scaling=read_rope(gguf, config),
        scaled_rope_on_sliding=False,
        sliding_rope_base=LOCAL_ROPE_BASE,
        activation="gelu_tanh",
        embd_scale=math.sqrt(config.n_embd),
        final_softcap=float(gguf.arch_value("final_logit_softcapping", 0.0) or 0.0) or None,
        attn_scale=(config.n_embd // config.n_heads) ** -0.5 if config.n_layers == GEMMA3_27B_LAYERS else None,
        sliding_layers=sliding_pattern(gguf, config.n_layers, period=GLOBAL_LAYER_PERIOD, default_window=DEFAULT_WINDOW),
        window=window,
    )
