"""A small ctypes wrapper of the native low-bit matmul (src/qmatmul.h), for tests and benchmarks.

Single-threaded and whole-range by default; the model runner calls the C functions itself.
Its calls take and give torch tensors (torch imported by them, not with the module).
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import TYPE_CHECKING

from . import abi
from .abi import QWeight
from .pack import PackedWeight

if TYPE_CHECKING:
    import torch


class QKernels:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        lib = abi.declare_matmul(ctypes.CDLL(str(self.path)))
        # Builds from before the layout export (an old library timed by kernels_bench --lib) load
        # unchecked, and their lp_qmatmul returns nothing to check.
        self.checked = hasattr(lib, "lp_abi_layout")
        if self.checked:
            abi.check_layout(abi.declare(lib))
        self.lib = lib
        self.isa = lib.lp_isa().decode()

    @classmethod
    def load(cls, variant: str) -> QKernels:
        from . import build

        return cls(build.library_path(variant))

    def row_bytes(self, k: int) -> int:
        return self.lib.lp_qacts_row_bytes(k)

    def col_align(self, fmt: int) -> int:
        return self.lib.lp_qweight_col_align(fmt)

    def quantize(self, x: torch.Tensor) -> torch.Tensor:
        """float32 [rows, k] -> quantized activations uint8 [rows, row_bytes(k)]."""
        import torch

        x = _rows(x)
        rows, k = x.shape
        if k % 32:
            raise ValueError(f"rows of width {k}: the quantized activations take a multiple of 32")
        acts = torch.empty(rows, self.row_bytes(k), dtype=torch.uint8)
        self.lib.lp_quantize_rows(x.data_ptr(), x.stride(0), k, rows, acts.data_ptr())
        return acts

    def matmul_acts(self, p: PackedWeight, acts: torch.Tensor, out: torch.Tensor | None = None,
                    col_begin: int = 0, col_end: int | None = None) -> torch.Tensor:
        """y [rows, n] from quantized activations; only columns [col_begin, col_end) are written."""
        import torch

        rows = acts.shape[0]
        if out is None:
            out = torch.zeros(rows, p.n, dtype=torch.float32)
        # The C side knows no array lengths: the shapes are checked here.
        if acts.dtype != torch.uint8 or not acts.is_contiguous() or acts.shape[1:] != (self.row_bytes(p.k),):
            raise ValueError(f"acts {tuple(acts.shape)} {acts.dtype}: rows of {self.row_bytes(p.k)} bytes expected")
        if out.dtype != torch.float32 or out.stride(1) != 1 or out.shape[0] < rows or out.shape[1] < p.n:
            raise ValueError(f"out {tuple(out.shape)} {out.dtype}: at least {rows} x {p.n} float32 expected")
        weight = self.qweight(p)
        rc = self.lib.lp_qmatmul(ctypes.byref(weight), acts.data_ptr(), rows, out.data_ptr(), out.stride(0),
                                 col_begin, p.n if col_end is None else col_end)
        if self.checked and rc != abi.LP_OK:
            raise abi.error(self.lib, rc, "lp_qmatmul")
        return out

    def matmul(self, p: PackedWeight, x: torch.Tensor) -> torch.Tensor:
        """float32 [rows, k] -> float32 [rows, n]: y = x w^T with 8-bit activations."""
        return self.matmul_acts(p, self.quantize(x))

    @staticmethod
    def qweight(p: PackedWeight) -> QWeight:
        """The C struct for p; it points into p.data, which must outlive it."""
        return QWeight(p.format, p.n, p.k, 0, p.data.ctypes.data)


def _rows(x: torch.Tensor) -> torch.Tensor:
    import torch

    assert x.dim() == 2 and x.dtype == torch.float32
    return x if x.stride(1) == 1 else x.contiguous()
