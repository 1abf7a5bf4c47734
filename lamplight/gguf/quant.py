"""Dequantization of GGUF tensor blocks to float32 (the reference path for every weight)."""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize as _gguf_dequantize

from .file import GGUFError, TensorInfo

# The two bundled models use Q4_1, Q8_0, Q4_K, Q5_0, Q6_K and F32; the rest are common in the wild.
SUPPORTED_TYPES = frozenset(
    {Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K}
)


def check_supported(info: TensorInfo) -> None:
    if info.qtype not in SUPPORTED_TYPES:
        names = ", ".join(sorted(t.name for t in SUPPORTED_TYPES))
        raise GGUFError(f"tensor {info.name} has type {info.qtype.name}, which lamplight cannot load (supported: {names})")


def dequantize(info: TensorInfo) -> torch.Tensor:
    """The tensor as a float32 torch tensor of its logical shape (one copy, no intermediate list)."""
    check_supported(info)
    if info.qtype == Q.F32:
        values = info.data.view(np.float32).copy()  # the mmap is read-only
    elif info.qtype == Q.F16:
        values = info.data.view(np.float16).astype(np.float32)
    else:
        values = _gguf_dequantize(info.data, info.qtype)
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32).reshape(info.shape))


def dequantize_rows(info: TensorInfo, rows: np.ndarray) -> torch.Tensor:
    """Rows `rows` of a 2-D tensor as float32 [len(rows), columns], reading only their blocks
    (an embedding lookup without a float32 copy of the whole table)."""
    check_supported(info)
    raw = info.data.reshape(info.shape[0], -1)[rows]
    if info.qtype == Q.F32:
        values = raw.view(np.float32)
    elif info.qtype == Q.F16:
        values = raw.view(np.float16).astype(np.float32)
    else:
        values = _gguf_dequantize(raw, info.qtype)
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32).reshape(len(rows), info.shape[1]))
