"""The paged KV pool: every attention layer's keys and values, stored per token index.

Storage is flat per layer and head-major: `k[layer]` has shape
[n_kv_heads, num_tokens, head_dim], so a token's K/V lives at the same index of every head.
Head-major storage lets one gather of a batch's keys come out as [n_kv_heads * batch, context,
head_dim], the layout batched matmuls take as is. Which indices belong to which sequence (blocks,
block tables, sharing) is the engine's business (lamplight.engine.kv_cache); models and runners
only read and write indices they are given.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class KVLayout:
    num_layers: int
    n_kv_heads: int
    head_dim_k: int
    head_dim_v: int

    def bytes_per_token(self, k_dtype: torch.dtype = torch.float32, v_dtype: torch.dtype | None = None) -> int:
        bits = self.head_dim_k * torch.finfo(k_dtype).bits + self.head_dim_v * torch.finfo(v_dtype or k_dtype).bits
        return self.n_kv_heads * self.num_layers * bits // 8


class KVPool:
    def __init__(self, layout: KVLayout, num_tokens: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu", v_dtype: torch.dtype | None = None):
        self.layout = layout
        self.num_tokens = num_tokens
        shape_k = (layout.n_kv_heads, num_tokens, layout.head_dim_k)
        shape_v = (layout.n_kv_heads, num_tokens, layout.head_dim_v)
        self.k = [torch.zeros(shape_k, dtype=dtype, device=device) for _ in range(layout.num_layers)]
        self.v = [torch.zeros(shape_v, dtype=v_dtype or dtype, device=device) for _ in range(layout.num_layers)]

    @property
    def device(self) -> torch.device:
        return self.k[0].device

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store K/V of tokens ([T, n_kv_heads, head_dim]) at pool indices `slots` ([T])."""
        self.k[layer].index_copy_(1, slots, k.transpose(0, 1).to(self.k[layer].dtype))
        self.v[layer].index_copy_(1, slots, v.transpose(0, 1).to(self.v[layer].dtype))

    def read(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K/V at pool indices `slots`, token-major: [T, n_kv_heads, head_dim]."""
        return self.k[layer][:, slots].transpose(0, 1), self.v[layer][:, slots].transpose(0, 1)

    def gather(self, layer: int, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K/V at pool indices `index` ([B, C]), head-major: [n_kv_heads, B, C, head_dim]."""
        flat = index.reshape(-1)
        k = self.k[layer].index_select(1, flat)
        v = self.v[layer].index_select(1, flat)
        return k.view(k.shape[0], *index.shape, k.shape[-1]), v.view(v.shape[0], *index.shape, v.shape[-1])

    def copy_tokens(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy K/V entries between pool indices in every layer (used to un-share a block)."""
        for layer in range(self.layout.num_layers):
            self.k[layer][:, dst] = self.k[layer][:, src]
            self.v[layer][:, dst] = self.v[layer][:, src]
