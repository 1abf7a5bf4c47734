"""The `gemma3` architecture (Gemma 3 text models as converted by llama.cpp).

Differences from llama: embeddings scaled by sqrt(n_embd); RMSNorm on Q and K per head; a
norm after attention and after the MLP as well as before; GeGLU (tanh-approximated GELU);
NEOX-layout RoPE; local layers attend to a sliding window with RoPE base 10000 while every
sixth layer is global with the file's base; queries scaled by 1/sqrt(head_dim). The converter
already folded Gemma's "1 + weight" norm convention into the stored norm weights.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..engine.kv_cache import KVCache
from ..gguf.file import GGUFFile
from .base import CausalLM, WeightSource, read_common_config
from .batch import ForwardBatch
from .layers import DecoderBlock, RMSNorm, Rotary, paged_attention

GLOBAL_LAYER_PERIOD = 6  # layers 5, 11, 17, ... attend globally (llama.cpp: swa pattern 6)
LOCAL_ROPE_BASE = 10000.0


class Gemma3Block(DecoderBlock):
    def __init__(self, w: WeightSource, i: int, eps: float):
        super().__init__(w, i, eps)
        p = self.prefix
        self.q_norm = RMSNorm(w.dense(p + "attn_q_norm.weight"), eps)
        self.k_norm = RMSNorm(w.dense(p + "attn_k_norm.weight"), eps)
        self.post_attn_norm = RMSNorm(w.dense(p + "post_attention_norm.weight"), eps)
        self.post_ffn_norm = RMSNorm(w.dense(p + "post_ffw_norm.weight"), eps)
        self.is_global = (i + 1) % GLOBAL_LAYER_PERIOD == 0


class Gemma3Model(CausalLM):
    def __init__(self, gguf: GGUFFile):
        config = read_common_config(gguf)
        super().__init__(config)
        w = WeightSource(gguf)
        self.load_decoder(w, Gemma3Block)
        self.window = int(gguf.arch_value("attention.sliding_window", 4096))
        n_rot = int(gguf.arch_value("rope.dimension_count", config.head_dim_k))
        global_base = float(gguf.arch_value("rope.freq_base", 1_000_000.0))
        self.rope_global = Rotary(n_rot, global_base, config.n_ctx_train, neox=True)
        self.rope_local = Rotary(n_rot, LOCAL_ROPE_BASE, config.n_ctx_train, neox=True)
        self.embd_scale = math.sqrt(config.n_embd)
        self.softcap = gguf.arch_value("final_logit_softcapping")
        self.scale = config.head_dim_k**-0.5

    def rope_for_layer(self, layer: int) -> Rotary:
        return self.rope_global if self.blocks[layer].is_global else self.rope_local

    def compute(self, batch: ForwardBatch, kv: KVCache) -> torch.Tensor:
        cfg = self.config
        h = self.embed(batch) * self.embd_scale
        angles = {rope: rope.angles(batch.positions) for rope in (self.rope_global, self.rope_local)}
        for i, blk in enumerate(self.blocks):
            rope = self.rope_global if blk.is_global else self.rope_local
            x = blk.attn_norm(h)
            q, k, v = blk.qkv(x).split(blk.qkv.sizes, dim=-1)
            q = rope(blk.q_norm(q.view(-1, cfg.n_heads, cfg.head_dim_k)), angles[rope])
            k = rope(blk.k_norm(k.view(-1, cfg.n_kv_heads, cfg.head_dim_k)), angles[rope])
            v = v.view(-1, cfg.n_kv_heads, cfg.head_dim_v)
            window = None if blk.is_global else self.window
            attn = paged_attention(q, k, v, i, kv, batch, self.scale, window)
            h = h + blk.post_attn_norm(blk.wo(attn))
            x = blk.ffn_norm(h)
            gate, up = blk.gate_up(x).split(blk.gate_up.sizes, dim=-1)
            mlp = blk.down(F.gelu(gate, approximate="tanh") * up)
            h = h + blk.post_ffn_norm(mlp)
        h = self.output_norm(h[batch.logit_rows])
        logits = self.head(h)
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits
