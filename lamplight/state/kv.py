"""The paged KV pool: every attention layer's keys and values, stored per token index.

Storage is flat per layer and head-major: `k[layer]` has shape
[n_kv_heads, num_tokens, head_dim], so a token's K/V lives at the same index of every head.
Head-major storage lets one gather of a batch's keys come out as [n_kv_heads * batch, context,
head_dim], the layout batched matmuls take as is. Which indices belong to which sequence (blocks,
block tables, sharing) is the engine's business (lamplight.engine.kv_cache); models and runners
only read and write indices they are given.
"""

from __future__ import annotations

import numpy as np
import torch

from .kv_quant import KVQuant
from .layout import KVLayout

# What a pool stores K or V as: a torch dtype (f32, f16, bf16), or a block-quantized type.
KVType = torch.dtype | KVQuant


def lazy_zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """Zeros that take memory only where they are written, on the CPU: numpy's zeros come from
    calloc, whose large blocks are fresh zero pages the OS maps on first write (torch.zeros
    writes every byte). A pool of the model's whole context (-c 0) then costs what it holds."""
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    itemsize = torch.empty(0, dtype=dtype).element_size()
    raw = np.zeros(shape, dtype={1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[itemsize])
    return torch.from_numpy(raw).view(dtype)


class KVPool:
    """`k[layer]`, `v[layer]`: [n_kv_heads, num_tokens, head_dim] of a dtype, or of a quantized
    type [n_kv_heads, num_tokens, row bytes] uint8 (lamplight.state.kv_quant); `k_type` and
    `v_type` say which. write/read/gather take and give float values either way."""

    def __init__(self, layout: KVLayout, num_tokens: int, dtype: KVType = torch.float32,
                 device: torch.device | str = "cpu", v_dtype: KVType | None = None):
        self.layout = layout
        self.num_tokens = num_tokens
        self._device = torch.device(device)  # also for a model without attention layers
        self.k_type, self.v_type = dtype, v_dtype or dtype
        self.k, self.v = [], []
        for layer in range(layout.num_layers):
            n_kv, dk, dv = layout.shape(layer)
            self.k.append(_storage(n_kv, num_tokens, dk, self.k_type, device))
            self.v.append(_storage(n_kv, num_tokens, dv, self.v_type, device))

    @property
    def device(self) -> torch.device:
        return self.k[0].device if self.k else self._device

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store K/V of tokens ([T, n_kv_heads, head_dim]) at pool indices `slots` ([T])."""
        self.k[layer].index_copy_(1, slots, _encode(k.transpose(0, 1), self.k_type))
        self.v[layer].index_copy_(1, slots, _encode(v.transpose(0, 1), self.v_type))

    def read(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K/V at pool indices `slots`, token-major: [T, n_kv_heads, head_dim] (a quantized
        type's values dequantized to float32)."""
        _, dk, dv = self.layout.shape(layer)
        k = _decode(self.k[layer][:, slots], self.k_type, dk)
        v = _decode(self.v[layer][:, slots], self.v_type, dv)
        return k.transpose(0, 1), v.transpose(0, 1)

    def gather(self, layer: int, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K/V at pool indices `index` ([B, C]), head-major: [n_kv_heads, B, C, head_dim]."""
        flat = index.reshape(-1)
        _, dk, dv = self.layout.shape(layer)
        k = _decode(self.k[layer].index_select(1, flat), self.k_type, dk)
        v = _decode(self.v[layer].index_select(1, flat), self.v_type, dv)
        return k.view(k.shape[0], *index.shape, k.shape[-1]), v.view(v.shape[0], *index.shape, v.shape[-1])

    def read_stored(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of the K/V rows at `slots` as the pool stores them, head-major ([n_kv_heads, T,
        head_dim] of the pool's dtype, or a quantized type's row bytes): for write_stored to put
        back to the bit, at a quantized type's size."""
        return self.k[layer][:, slots], self.v[layer][:, slots]

    def write_stored(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Put rows read_stored gave back, at pool indices `slots`."""
        self.k[layer].index_copy_(1, slots, k)
        self.v[layer].index_copy_(1, slots, v)

    def copy_tokens(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy K/V entries between pool indices in every layer (used to un-share a block)."""
        for layer in range(self.layout.num_layers):
            self.k[layer][:, dst] = self.k[layer][:, src]
            self.v[layer][:, dst] = self.v[layer][:, src]


def _storage(n_kv: int, num_tokens: int, dim: int, kind: KVType, device) -> torch.Tensor:
    if isinstance(kind, KVQuant):
        return lazy_zeros((n_kv, num_tokens, kind.row_bytes(dim)), torch.uint8, device)
    return lazy_zeros((n_kv, num_tokens, dim), kind, device)


def _encode(x: torch.Tensor, kind: KVType) -> torch.Tensor:
    return kind.quantize(x) if isinstance(kind, KVQuant) else x.to(kind)


def _decode(stored: torch.Tensor, kind: KVType, dim: int) -> torch.Tensor:
    return kind.dequantize(stored, dim) if isinstance(kind, KVQuant) else stored
