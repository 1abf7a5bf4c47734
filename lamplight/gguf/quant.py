"""Dequantization of GGUF tensor blocks to float32 (the reference path for every weight)."""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize as _gguf_dequantize

from .file import GGUFError, TensorInfo

# The two bundled models use Q4_1, Q8_0, Q4_K, Q5_0, Q6_K and F32; the rest are common in the wild
# (MXFP4: gpt-oss's expert weights).
SUPPORTED_TYPES = frozenset(
    {Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.MXFP4}
)

# MXFP4 (OCP microscaling FP4): blocks of 32 values, one E8M0 exponent byte then 16 bytes of
# E2M1 nibbles (value j in the low nibble of byte j, value j + 16 in the high one). ggml keeps
# the E2M1 values doubled (this table) and halves the scale: 2^(e - 127) / 2 = 2^(e - 128).
MXFP4_VALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.float32)
MXFP4_BLOCK_BYTES = 17


def check_supported(info: TensorInfo) -> None:
    if info.qtype not in SUPPORTED_TYPES:
        names = ", ".join(sorted(t.name for t in SUPPORTED_TYPES))
        raise GGUFError(f"tensor {info.name} has type {info.qtype.name}, which lamplight cannot load (supported: {names})")


def dequantize(info: TensorInfo) -> np.ndarray:
    """The tensor as a float32 array of its logical shape (one copy, no intermediate list).
    PyTorch callers wrap it with torch.from_numpy (no copy)."""
    check_supported(info)
    if info.qtype == Q.F32:
        values = info.data.view(np.float32).copy()  # the mmap is read-only
    elif info.qtype == Q.F16:
        values = info.data.view(np.float16).astype(np.float32)
    else:
        values = _dequantize_blocks(info.data, info.qtype)
    return np.ascontiguousarray(values, dtype=np.float32).reshape(info.shape)


def dequantize_rows(info: TensorInfo, rows: np.ndarray) -> np.ndarray:
    """Rows `rows` of a 2-D tensor as float32 [len(rows), columns], reading only their blocks
    (an embedding lookup without a float32 copy of the whole table)."""
    check_supported(info)
    raw = info.data.reshape(info.shape[0], -1)[rows]
    if info.qtype == Q.F32:
        values = raw.view(np.float32)
    elif info.qtype == Q.F16:
        values = raw.view(np.float16).astype(np.float32)
    else:
        values = _dequantize_blocks(raw, info.qtype)
    return np.ascontiguousarray(values, dtype=np.float32).reshape(len(rows), info.shape[1])


def _dequantize_blocks(raw: np.ndarray, qtype: Q) -> np.ndarray:
    return dequantize_mxfp4(raw) if qtype == Q.MXFP4 else _gguf_dequantize(raw, qtype)


def dequantize_mxfp4(raw: np.ndarray) -> np.ndarray:
    """MXFP4 rows of blocks (uint8 [..., n_blocks * 17]) to float32 [..., n_blocks * 32]."""
    blocks = raw.reshape(-1, MXFP4_BLOCK_BYTES)
    scale = np.ldexp(np.float32(1.0), blocks[:, 0].astype(np.int32) - 128).astype(np.float32)
    nibbles = blocks[:, 1:]
    values = np.concatenate((MXFP4_VALUES[nibbles & 0x0F], MXFP4_VALUES[nibbles >> 4]), axis=1)
    return (values * scale[:, None]).reshape(*raw.shape[:-1], -1)
