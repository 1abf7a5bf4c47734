"""Elementwise functions on the native library's threads, outside any model (src/table.cpp)."""

from __future__ import annotations

import ctypes

import torch

from . import abi


def fp16_lookup(lib: ctypes.CDLL, table: torch.Tensor, x: torch.Tensor, identity_from: float,
                in_place: bool = False) -> torch.Tensor:
    """table[x rounded to fp16, as uint16 bits] where x < identity_from, else x (NaN: the table's
    entry): ggml's fp16 GELU table (lamplight.models.activations.gelu_tanh_fp16_table's bits) in
    one pass. `table`: 65536 float32 values. `in_place`: into x itself when it is contiguous
    float32 (each value is read before its own result is written)."""
    if table.dtype != torch.float32 or table.numel() != 65536 or not table.is_contiguous():
        raise ValueError("the table holds 65536 contiguous float32 values")
    src = x if x.dtype == torch.float32 and x.is_contiguous() else x.float().contiguous()
    out = src if in_place and src is x else torch.empty_like(src)
    rc = lib.lp_fp16_lookup(table.data_ptr(), src.data_ptr(), src.numel(), identity_from, out.data_ptr())
    if rc != abi.LP_OK:
        raise abi.error(lib, rc, "lp_fp16_lookup")
    return out
