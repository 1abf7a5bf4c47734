"""What a model keeps per sequence, described without storage: the K/V layout of its attention
layers, the recurrent state of its recurrent layers, and the two together (`StateSpec`).

The pools that hold the state are lamplight.state.kv's and lamplight.state.recurrent's (numpy
storage, or PyTorch's in lamplight.state.torch_pools); these descriptions hold none, so that a
model definition (lamplight.models.spec) needs no storage at all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def type_bits(kind) -> float:
    """Bits per value of a K/V type: a KV type (lamplight.state.kv_types, which says its bits), a
    torch or numpy dtype, or None for float32."""
    if kind is None:
        return 32
    bits = getattr(kind, "bits", None)
    return bits if bits is not None else kind.itemsize * 8


@dataclass(frozen=True)
class KVLayout:
    """The K/V every attention layer with its own cache stores per token. `layer_shapes` lists
    (n_kv_heads, head_dim_k, head_dim_v) per layer where layers differ (Gemma 4's sliding and
    full layers); empty, every layer has the shape of the scalar fields."""

    num_layers: int
    n_kv_heads: int
    head_dim_k: int
    head_dim_v: int
    layer_shapes: tuple[tuple[int, int, int], ...] = ()

    @classmethod
    def of_layers(cls, shapes: list[tuple[int, int, int]]) -> "KVLayout":
        """The layout of layers of these shapes (the plain uniform form where they agree)."""
        if not shapes:
            return cls(0, 0, 0, 0)
        if len(set(shapes)) == 1:
            return cls(len(shapes), *shapes[0])
        widest = max(shapes, key=lambda s: s[0] * (s[1] + s[2]))
        return cls(len(shapes), *widest, layer_shapes=tuple(shapes))

    def shape(self, layer: int) -> tuple[int, int, int]:
        """(n_kv_heads, head_dim_k, head_dim_v) of one layer."""
        return self.layer_shapes[layer] if self.layer_shapes else (self.n_kv_heads, self.head_dim_k, self.head_dim_v)

    def bytes_per_token(self, k_dtype=None, v_dtype=None) -> int:
        """Bytes of one token's K/V in every layer, K stored as `k_dtype` (type_bits' kinds;
        None: float32) and V as `v_dtype` (None: as K)."""
        k_bits, v_bits = type_bits(k_dtype), type_bits(v_dtype or k_dtype)
        shapes = [self.shape(layer) for layer in range(self.num_layers)]
        return int(sum(n * (dk * k_bits + dv * v_bits) for n, dk, dv in shapes) // 8)


@dataclass(frozen=True)
class RecurrentLayout:
    """One recurrent layer's state per sequence: the convolution's history [K-1, channels] and the
    recurrence matrix (e.g. [heads, d_v, d_k]; () for a layer without one, LFM2's short conv)."""

    history: tuple[int, int]
    matrix: tuple[int, ...] = ()

    @property
    def floats(self) -> int:
        return math.prod(self.history) + (math.prod(self.matrix) if self.matrix else 0)

    def bytes_per_sequence(self) -> int:
        return self.floats * 4


@dataclass(frozen=True)
class StateSpec:
    """The state one model keeps per sequence."""

    kv: KVLayout  # attention layers' keys and values, one entry per token position
    recurrent: tuple[RecurrentLayout, ...] = ()  # one per recurrent layer, in layer order

    def bytes_per_token(self, k_dtype=None, v_dtype=None) -> int:
        return self.kv.bytes_per_token(k_dtype, v_dtype)

    def recurrent_bytes_per_sequence(self) -> int:
        """Bytes of recurrent state one sequence holds whatever its length (also one checkpoint's size)."""
        return sum(layout.bytes_per_sequence() for layout in self.recurrent)
