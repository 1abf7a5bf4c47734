"""The paged KV pool: every attention layer's keys and values, stored per token index.

Storage is flat per layer and head-major: `k[layer]` has shape
[n_kv_heads, num_tokens, row], so a token's K/V lives at the same index of every head. Head-major
storage lets one gather of a batch's keys come out as [n_kv_heads * batch, context, head_dim], the
layout batched matmuls take as is. Which indices belong to which sequence (blocks, block tables,
sharing) is the engine's business (lamplight.engine.kv_cache); models and runners only read and
write indices they are given.

`KVPool` keeps its rows in numpy arrays (what the native forward computes on, no torch); the
PyTorch runners' pools are `TorchKVPool`s (lamplight.state.torch_pools), tensors on any device
with the float reads and writes the PyTorch model makes. Both move stored rows the same way
(read_stored, write_stored, copy_tokens: the engine's copy-on-write and prompt cache), indices
given as sequences of ints or int64 arrays.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .kv_types import KVType, kv_type
from .layout import KVLayout

Indices = Sequence[int] | np.ndarray


class KVPool:
    """`k[layer]`, `v[layer]`: [n_kv_heads, num_tokens, row] arrays of the K and V types' storage
    (lamplight.state.kv_types: float32, float16, bf16's bits, or a quantized type's row bytes);
    `k_type` and `v_type` say which. Zeros take memory only where they are written: numpy's zeros
    come from calloc, whose large blocks are fresh pages the OS maps on first write, so a pool of
    the model's whole context (-c 0) costs what it holds."""

    def __init__(self, layout: KVLayout, num_tokens: int, dtype=None, *, v_dtype=None):
        """`dtype`: K's type (lamplight.state.kv_types.kv_type's forms: None is f32); `v_dtype`: V's
        (None: as K)."""
        self.layout = layout
        self.num_tokens = num_tokens
        self.k_type = kv_type(dtype)
        self.v_type = self.k_type if v_dtype is None else kv_type(v_dtype)
        self.k, self.v = [], []
        for layer in range(layout.num_layers):
            n_kv, dk, dv = layout.shape(layer)
            self.k.append(self._zeros((n_kv, num_tokens, self.k_type.row_width(dk)), self.k_type))
            self.v.append(self._zeros((n_kv, num_tokens, self.v_type.row_width(dv)), self.v_type))

    def _zeros(self, shape: tuple[int, ...], kind: KVType):
        return np.zeros(shape, dtype=kind.storage)

    def _index(self, slots: Indices):
        """Pool indices as the storage indexes with them."""
        return np.asarray(slots, dtype=np.int64)

    @property
    def device(self) -> str:
        return "cpu"

    @property
    def nbytes(self) -> int:
        """Bytes of every layer's K and V storage."""
        return sum(t.nbytes for t in (*self.k, *self.v))

    def floats(self, n: int):
        """`n` float32 zeros where this pool keeps its storage (a PyTorch pool: a tensor on its device)."""
        return np.zeros(n, dtype=np.float32)

    def read_stored(self, layer: int, slots: Indices):
        """Copies of the K/V rows at `slots` as the pool stores them, head-major ([n_kv_heads, T,
        row] of the storage type): for write_stored to put back to the bit, at a quantized type's size."""
        index = self._index(slots)
        return self.k[layer][:, index], self.v[layer][:, index]

    def write_stored(self, layer: int, slots: Indices, k, v) -> None:
        """Put rows read_stored gave back, at pool indices `slots`."""
        index = self._index(slots)
        self.k[layer][:, index] = k
        self.v[layer][:, index] = v

    def copy_tokens(self, src: Indices, dst: Indices) -> None:
        """Copy K/V entries between pool indices in every layer (used to un-share a block)."""
        src, dst = self._index(src), self._index(dst)
        for layer in range(self.layout.num_layers):
            self.k[layer][:, dst] = self.k[layer][:, src]
            self.v[layer][:, dst] = self.v[layer][:, src]
