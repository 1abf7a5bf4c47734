"""Functions on the native library's threads outside any model: elementwise (src/table.cpp), and the
encoders' attention (src/encoder_attention.cpp) and residual layer norm (src/layer_norm.cpp).

They take and give torch tensors; torch is imported by the calls, not with the module (the
native package loads without it)."""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING

from . import abi

if TYPE_CHECKING:
    import torch


def fp16_lookup(lib: ctypes.CDLL, table: torch.Tensor, x: torch.Tensor, identity_from: float,
                in_place: bool = False) -> torch.Tensor:
    """table[x rounded to fp16, as uint16 bits] where x < identity_from, else x (NaN: the table's
    entry): ggml's fp16 GELU table (lamplight.models.activations.gelu_tanh_fp16_table's bits) in
    one pass. `table`: 65536 float32 values. `in_place`: into x itself when it is contiguous
    float32 (each value is read before its own result is written)."""
    import torch

    if table.dtype != torch.float32 or table.numel() != 65536 or not table.is_contiguous():
        raise ValueError("the table holds 65536 contiguous float32 values")
    src = x if x.dtype == torch.float32 and x.is_contiguous() else x.float().contiguous()
    out = src if in_place and src is x else torch.empty_like(src)
    rc = lib.lp_fp16_lookup(table.data_ptr(), src.data_ptr(), src.numel(), identity_from, out.data_ptr())
    if rc != abi.LP_OK:
        raise abi.error(lib, rc, "lp_fp16_lookup")
    return out


# lp_attend_full's head size is a multiple of this.
ATTEND_FULL_LANES = 16


def attend_full(lib: ctypes.CDLL, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_seqs: int, n_heads: int,
                scale: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q k^T * scale) v per head over all rows of each of the n_seqs sequences of equal
    length that q, k, v [n_seqs * n, n_heads * head_dim] hold one after another (views with any
    row stride, columns contiguous); into `out` (float32, rows of contiguous columns) or a new
    tensor."""
    import torch

    rows, width = q.shape
    if k.shape != q.shape or v.shape != q.shape or rows % max(n_seqs, 1) or width % n_heads:
        raise ValueError(f"q, k, v {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}: not {n_seqs} sequences of "
                         f"{n_heads} heads")
    parts = [t if t.dtype == torch.float32 and t.stride(1) == 1 else t.float().contiguous() for t in (q, k, v)]
    if out is None:
        out = torch.empty(rows, width)
    if out.shape != q.shape or out.dtype != torch.float32 or out.stride(1) != 1:
        raise ValueError(f"out {tuple(out.shape)} {out.dtype}: not float32 rows of {width} contiguous values")
    if rows == 0:
        return out
    rc = lib.lp_attend_full(*(t.data_ptr() for t in parts), *(t.stride(0) for t in parts), n_seqs,
                            rows // n_seqs, n_heads, width // n_heads, scale, out.data_ptr(), out.stride(0))
    if rc != abi.LP_OK:
        raise abi.error(lib, rc, "lp_attend_full")
    return out


def add_layer_norm(lib: ctypes.CDLL, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                   bias: torch.Tensor | None, eps: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """LayerNorm(x + residual) over the last dimension, times weight, plus bias, as ggml's norm
    computes it, row by row in one pass; into `out` (which may be x or residual) or a new tensor.
    Every tensor contiguous float32."""
    import torch

    n = x.shape[-1]
    tensors = [t for t in (x, residual, weight, bias, out) if t is not None]
    if any(t.dtype != torch.float32 or not t.is_contiguous() for t in tensors):
        raise ValueError("add_layer_norm takes contiguous float32 tensors")
    if (residual is not None and residual.shape != x.shape) or weight.shape != (n,) or \
            (bias is not None and bias.shape != (n,)) or (out is not None and out.shape != x.shape):
        raise ValueError(f"add_layer_norm: shapes {[tuple(t.shape) for t in tensors]} do not match rows of {n}")
    if out is None:
        out = torch.empty_like(x)
    rc = lib.lp_add_layer_norm(x.data_ptr(), residual.data_ptr() if residual is not None else None, weight.data_ptr(),
                               bias.data_ptr() if bias is not None else None, eps, x.numel() // n, n, out.data_ptr())
    if rc != abi.LP_OK:
        raise abi.error(lib, rc, "lp_add_layer_norm")
    return out
