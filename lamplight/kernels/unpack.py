"""Unpacking 4-bit GGUF blocks into (values, per-group scale, per-group zero).

Every supported format is affine per group of 32 weights: w = scale * (q - 8) + zero, with q in
0..15, which is exactly the form PyTorch's int4 matmul kernels take:
  Q4_0: w = d (q - 8)             -> scale d,         zero 0
  Q4_1: w = d q + m               -> scale d,         zero m + 8 d
  Q4_K: w = (d sc_j) q - dmin m_j -> scale d sc_j,    zero 8 d sc_j - dmin m_j  (per 32-weight sub-block j)
"""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGMLQuantizationType as Q
from gguf.quants import Q4_K

from ..gguf.file import TensorInfo

GROUP = 32
INT4_TYPES = frozenset({Q.Q4_0, Q.Q4_1, Q.Q4_K})


def _nibbles(qs: np.ndarray, chunk: int = 16) -> np.ndarray:
    """[blocks, bytes] -> [blocks, 2*bytes] values: per chunk of bytes, the low nibbles, then the high ones."""
    n = qs.shape[0]
    pairs = qs.reshape(n, -1, 1, chunk) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    return (pairs & 0x0F).reshape(n, -1)


def unpack_int4(info: TensorInfo) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q [N, K] int32 in 0..15, scale [N, K/32] float32, zero [N, K/32] float32)."""
    n_rows, k = info.shape
    raw = info.data.reshape(-1, info.data.shape[-1])
    if info.qtype == Q.Q4_0:
        blocks = raw.reshape(-1, 18)
        d = blocks[:, :2].copy().view(np.float16).astype(np.float32)[:, 0]
        q = _nibbles(blocks[:, 2:])
        scale, zero = d, np.zeros_like(d)
    elif info.qtype == Q.Q4_1:
        blocks = raw.reshape(-1, 20)
        d = blocks[:, :2].copy().view(np.float16).astype(np.float32)[:, 0]
        m = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)[:, 0]
        q = _nibbles(blocks[:, 4:])
        scale, zero = d, m + 8 * d
    elif info.qtype == Q.Q4_K:
        blocks = raw.reshape(-1, 144)
        d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
        dmin = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
        sc, mins = Q4_K.get_scale_min(blocks[:, 4:16].copy())
        scale = (d * sc.astype(np.float32)).reshape(-1)
        offset = (dmin * mins.astype(np.float32)).reshape(-1)
        q = _nibbles(blocks[:, 16:], chunk=32)
        zero = 8 * scale - offset
    else:
        raise ValueError(f"{info.name}: {info.qtype.name} is not a 4-bit affine format")
    q_t = torch.from_numpy(q.reshape(n_rows, k).astype(np.int32))
    scale_t = torch.from_numpy(np.ascontiguousarray(scale, dtype=np.float32).reshape(n_rows, k // GROUP))
    zero_t = torch.from_numpy(np.ascontiguousarray(zero, dtype=np.float32).reshape(n_rows, k // GROUP))
    return q_t, scale_t, zero_t
