"""Embedding-table lookups for the native forward: rows of a GGUF tensor as float32, dequantized by
the library (src/dequant.cpp) from the blocks the file stores, with the same bits as gguf's numpy
dequantizer; the types the library does not handle (Q2_K, Q3_K, MXFP4) keep gguf's.

gguf's dequantizer took 0.2 ms for 16 rows alone, but 1.2 ms a step in a server decoding 16
streams: each numpy operation released the GIL, the HTTP thread took it to send the last step's
tokens, and the engine waited for it between two forwards. The library's lookup takes
microseconds and keeps the GIL throughout."""

from __future__ import annotations

import ctypes
import functools

import numpy as np

from ..gguf.file import TensorInfo
from ..gguf.quant import check_supported, dequantize_rows
from . import abi
from .linear import address


@functools.cache
def _holding_the_gil(lib: ctypes.CDLL) -> ctypes.PyDLL:
    """The library's lookup called without releasing the GIL (a PyDLL's calls keep it): it takes
    microseconds, and a release there let the HTTP thread take the GIL for a millisecond while
    the engine waited, between two forwards."""
    held = ctypes.PyDLL(lib._name, handle=lib._handle)
    held.lp_dequantize_rows.argtypes = lib.lp_dequantize_rows.argtypes
    held.lp_dequantize_rows.restype = lib.lp_dequantize_rows.restype
    return held


def embedding_rows(lib: ctypes.CDLL, table: TensorInfo, token_ids: np.ndarray) -> np.ndarray:
    """Rows `token_ids` of the 2-D tensor `table` as float32 [len(token_ids), columns]: what
    lamplight.gguf.quant.dequantize_rows gives, bit for bit. ValueError for an id outside it."""
    check_supported(table)
    n_rows, n_cols = table.shape
    ids = np.ascontiguousarray(token_ids, dtype=np.int64)
    data = table.data.reshape(n_rows, -1)
    out = np.empty((ids.size, n_cols), dtype=np.float32)
    rc = _holding_the_gil(lib).lp_dequantize_rows(int(table.qtype), address(data), n_rows, data.shape[1], n_cols,
                                                  address(ids), ids.size, address(out))
    if rc == abi.LP_ERR_UNSUPPORTED:
        return dequantize_rows(table, token_ids)
    if rc != abi.LP_OK:
        raise abi.error(lib, rc, "lp_dequantize_rows")
    return out
