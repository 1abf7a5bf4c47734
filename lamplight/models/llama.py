"""The `llama` architecture (Llama 2/3, Mistral, SmolLM2 ... as converted by llama.cpp)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..engine.kv_cache import KVCache
from ..gguf.file import GGUFFile
from .base import CausalLM, WeightSource, read_common_config
from .batch import ForwardBatch
from .layers import DecoderBlock, Rotary, paged_attention


class LlamaModel(CausalLM):
    def __init__(self, gguf: GGUFFile):
        config = read_common_config(gguf)
        super().__init__(config)
        w = WeightSource(gguf)
        self.load_decoder(w, DecoderBlock)
        freq_factors = w.dense("rope_freqs.weight") if w.has("rope_freqs.weight") else None
        n_rot = int(gguf.arch_value("rope.dimension_count", config.head_dim_k))
        base = float(gguf.arch_value("rope.freq_base", 10000.0))
        self.rope = Rotary(n_rot, base, config.n_ctx_train, neox=False, freq_factors=freq_factors)
        self.scale = config.head_dim_k**-0.5

    def rope_for_layer(self, layer: int) -> Rotary:
        return self.rope

    def compute(self, batch: ForwardBatch, kv: KVCache) -> torch.Tensor:
        cfg = self.config
        h = self.embed(batch)
        angles = self.rope.angles(batch.positions)
        n_tokens = h.shape[0]
        n_qk_heads = cfg.n_heads + cfg.n_kv_heads
        for i, blk in enumerate(self.blocks):
            x = blk.attn_norm(h)
            qkv = blk.qkv(x)  # [T, (heads + 2 * kv heads) * head_dim]: Q, K, V side by side
            # Q and K rotate by the same angles: one rotation for both heads.
            qk = self.rope(qkv[:, : n_qk_heads * cfg.head_dim_k].view(n_tokens, n_qk_heads, cfg.head_dim_k), angles)
            q, k = qk[:, : cfg.n_heads], qk[:, cfg.n_heads :]
            v = qkv[:, n_qk_heads * cfg.head_dim_k :].view(n_tokens, cfg.n_kv_heads, cfg.head_dim_v)
            h = h + blk.wo(paged_attention(q, k, v, i, kv, batch, self.scale))
            x = blk.ffn_norm(h)
            gate, up = blk.gate_up(x).split(blk.gate_up.sizes, dim=-1)
            h = h + blk.down(F.silu(gate) * up)
        h = self.output_norm(h[batch.logit_rows])
        return self.head(h)
