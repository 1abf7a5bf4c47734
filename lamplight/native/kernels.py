"""A small ctypes wrapper of the native low-bit matmul (src/qmatmul.h), for tests and benchmarks.

Single-threaded and whole-range by default; the model runner calls the C functions itself.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from .pack import PackedWeight


class QWeight(ctypes.Structure):
    _fields_ = [("format", ctypes.c_int32), ("n", ctypes.c_int32), ("k", ctypes.c_int32),
                ("reserved", ctypes.c_int32), ("data", ctypes.c_void_p)]


class QKernels:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        lib = ctypes.CDLL(str(self.path))
        lib.lp_qacts_row_bytes.argtypes = [ctypes.c_int32]
        lib.lp_qacts_row_bytes.restype = ctypes.c_size_t
        lib.lp_quantize_rows.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32, ctypes.c_int32, ctypes.c_void_p]
        lib.lp_quantize_rows.restype = None
        lib.lp_qmatmul.argtypes = [ctypes.POINTER(QWeight), ctypes.c_void_p, ctypes.c_int32, ctypes.c_void_p,
                                   ctypes.c_int64, ctypes.c_int32, ctypes.c_int32]
        lib.lp_qmatmul.restype = None
        lib.lp_qweight_col_align.argtypes = [ctypes.c_int32]
        lib.lp_qweight_col_align.restype = ctypes.c_int32
        lib.lp_isa.argtypes = []
        lib.lp_isa.restype = ctypes.c_char_p
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
        x = _rows(x)
        rows, k = x.shape
        acts = torch.empty(rows, self.row_bytes(k), dtype=torch.uint8)
        self.lib.lp_quantize_rows(x.data_ptr(), x.stride(0), k, rows, acts.data_ptr())
        return acts

    def matmul_acts(self, p: PackedWeight, acts: torch.Tensor, out: torch.Tensor | None = None,
                    col_begin: int = 0, col_end: int | None = None) -> torch.Tensor:
        """y [rows, n] from quantized activations; only columns [col_begin, col_end) are written."""
        rows = acts.shape[0]
        if out is None:
            out = torch.zeros(rows, p.n, dtype=torch.float32)
        assert out.dtype == torch.float32 and out.stride(1) == 1 and out.shape[1] >= p.n
        weight = self.qweight(p)
        self.lib.lp_qmatmul(ctypes.byref(weight), acts.data_ptr(), rows, out.data_ptr(), out.stride(0),
                            col_begin, p.n if col_end is None else col_end)
        return out

    def matmul(self, p: PackedWeight, x: torch.Tensor) -> torch.Tensor:
        """float32 [rows, k] -> float32 [rows, n]: y = x w^T with 8-bit activations."""
        return self.matmul_acts(p, self.quantize(x))

    @staticmethod
    def qweight(p: PackedWeight) -> QWeight:
        """The C struct for p; it points into p.data, which must outlive it."""
        return QWeight(p.format, p.n, p.k, 0, p.data.ctypes.data)


def _rows(x: torch.Tensor) -> torch.Tensor:
    assert x.dim() == 2 and x.dtype == torch.float32
    return x if x.stride(1) == 1 else x.contiguous()
