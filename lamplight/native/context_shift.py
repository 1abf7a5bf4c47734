"""Context shift on the native path, on numpy: cached K/V entries moved to other pool indices,
the keys re-rotated by a position delta so that nothing is recomputed.

What the PyTorch path does (lamplight.models.layers.shift_kv with Rotary.rotate_by), to the bit:
each key row is read to float32 (lp_kv_rows: the forward's own conversion of the pool's type,
the same values as the PyTorch pool's), rotated by the unit rotation of |delta| positions in
float32 products and differences as Rotary._rotate computes them, and stored back in the pool's
type (lp_kv_rows: fp16 and bf16 rounded to nearest even as torch's casts are, quantized blocks
as lamplight.state.kv_quant_torch writes them). Values and the keys of layers without rope move
as the bytes they are (a row read and written again keeps its bytes).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..models.rope import RopeTables
from ..state.kv import KVPool
from ..state.kv_types import KVType
from . import abi
from .linear import address


@dataclass(frozen=True)
class KeyRotation:
    """A layer's rope: its unit-rotation tables and layout (neox: the two halves of the rotated
    dims turn together; else adjacent pairs)."""

    tables: RopeTables
    neox: bool

    def rotate_by(self, x: np.ndarray, delta: int) -> np.ndarray:
        """Already-rotated keys x (float32 [..., head_dim]) moved by `delta` positions (rotations
        compose by adding angles); dims past the rotated ones stay."""
        cos = self.tables.cos[abs(delta)]
        sin = self.tables.sin[abs(delta)] if delta >= 0 else -self.tables.sin[abs(delta)]
        n_rot = 2 * cos.shape[-1]
        rot, rest = x[..., :n_rot], x[..., n_rot:]
        if self.neox:
            a, b = rot[..., : n_rot // 2], rot[..., n_rot // 2 :]
            rotated = np.concatenate((a * cos - b * sin, a * sin + b * cos), axis=-1)
        else:
            a, b = rot[..., 0::2], rot[..., 1::2]
            rotated = np.stack((a * cos - b * sin, a * sin + b * cos), axis=-1).reshape(rot.shape)
        return np.concatenate((rotated, rest), axis=-1) if rest.size else rotated


def shift_kv(lib: ctypes.CDLL, pool: KVPool, rotations: list[KeyRotation | None], src: Sequence[int],
             dst: Sequence[int], delta: int) -> None:
    """Move the entries at pool indices `src` to `dst`, each layer's keys re-rotated by `delta`
    positions with its rotation (None: a layer without rope). `pool` keeps numpy storage (the
    native runner's new_state)."""
    if pool.k and not isinstance(pool.k[0], np.ndarray):
        raise TypeError("the native context shift moves rows of a numpy pool (NativeRunner.new_state)")
    for layer, rotation in enumerate(rotations):
        k, v = pool.read_stored(layer, src)
        if rotation is not None:
            head_dim = pool.layout.shape(layer)[1]
            keys = rotation.rotate_by(_values(lib, pool.k_type, k, head_dim), delta)
            k = _stored(lib, pool.k_type, keys, k.shape)
        pool.write_stored(layer, dst, k, v)


def _values(lib: ctypes.CDLL, kind: KVType, stored: np.ndarray, dim: int) -> np.ndarray:
    """Stored rows [..., row] of `kind` as float32 values [..., dim]."""
    stored = np.ascontiguousarray(stored)
    values = np.empty((*stored.shape[:-1], dim), dtype=np.float32)
    _convert(lib, kind, store=False, stored=stored, values=values)
    return values


def _stored(lib: ctypes.CDLL, kind: KVType, values: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """float32 values [..., dim] as rows of `kind` ([..., row], `shape`)."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    stored = np.empty(shape, dtype=kind.storage)
    _convert(lib, kind, store=True, stored=stored, values=values)
    return stored


def _convert(lib: ctypes.CDLL, kind: KVType, store: bool, stored: np.ndarray, values: np.ndarray) -> None:
    dim = values.shape[-1]
    rc = lib.lp_kv_rows(kind.native_id, int(store), address(stored), values.size // dim, dim, address(values))
    if rc != abi.LP_OK:
        raise abi.error(lib, rc, "context shift")
