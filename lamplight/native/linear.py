"""Native linear layers: how a linear's weights are described to the C side (packed for the
integer kernels, or dense fp16/bf16/float32), shared by the model runner, and `NativeLinear`, one
linear run on its own (src/linear.cpp's lp_linear): the encoders' matmuls, outside any model.

Describing a linear needs no torch (the weights and biases are numpy arrays; a torch tensor
given is read as one); NativeLinear's calls take and give torch tensors.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
from gguf import GGMLQuantizationType as Q

from ..gguf.file import TensorInfo, release_tensor_pages
from ..gguf.quant import dequantize
from . import abi
from .abi import NativeUnsupported

if TYPE_CHECKING:
    import torch

# Groups of weights read as one part: (their infos, their packed weight, or None for dense).
PartGroups = list[tuple[list, object]]


def address(t) -> int | None:
    """Where an array's data starts (None for none), for the C side: a numpy array, or a torch
    tensor (its data_ptr)."""
    if t is None:
        return None
    return t.ctypes.data if isinstance(t, np.ndarray) else t.data_ptr()


def hold(keep: list, t) -> int | None:
    """t's address for the C side, t kept alive in `keep`: a numpy array as it is (contiguous),
    a torch tensor as its contiguous float32 values (a numpy view of them)."""
    if t is None:
        return None
    if not isinstance(t, np.ndarray):
        t = t.detach().float().contiguous().numpy()
    t = np.ascontiguousarray(t)
    keep.append(t)
    return address(t)


def describe_linear(groups: PartGroups, bias: np.ndarray | None, hold: Callable[[object], int | None]) -> abi.Linear:
    """The C description of a linear over `groups` (pack_groups), outputs side by side; `hold`
    keeps an array alive for as long as the description and returns its address."""
    if len(groups) > abi.MAX_PARTS:
        raise NativeUnsupported(f"more than {abi.MAX_PARTS} weights in one fused linear")
    lin = abi.Linear()
    lin.n_parts = len(groups)
    lin.n_out = sum(i.shape[0] for infos, _ in groups for i in infos)
    for part, (group_infos, packed) in zip(lin.parts, groups):
        if packed is not None:
            part.w.format, part.w.n, part.w.k = packed.format, packed.n, packed.k
            part.w.data = hold(packed.data)
        else:
            fmt, weight = _dense(group_infos)
            part.w.format, part.w.n, part.w.k = fmt, sum(i.shape[0] for i in group_infos), weight.shape[1]
            part.dense = hold(weight)
    lin.bias = hold(bias)
    return lin


# Dense weights kept as the file stores them (the kernel widens them exactly): LP_DENSE_F16/_BF16.
_DENSE_FORMATS = {Q.F16: (abi.DENSE_F16, np.float16), Q.BF16: (abi.DENSE_BF16, np.uint16)}


def _dense(infos: list) -> tuple[int, np.ndarray]:
    """A dense part's format and values: fp16 or bf16 as stored, in forward.h's tiles, when every
    weight has that type (and k is a multiple of the tile's 16), else float32 [n, k]."""
    kinds = {_DENSE_FORMATS.get(i.qtype) for i in infos}
    k = infos[0].shape[1]
    if len(kinds) == 1 and None not in kinds and k % abi.DENSE_TILE_K == 0:
        fmt, dtype = kinds.pop()
        values = np.concatenate([i.data.view(dtype).reshape(i.shape) for i in infos])
        return fmt, _dense_tiles(values)
    return abi.DENSE_F32, np.concatenate([dequantize(i) for i in infos])


def _dense_tiles(values: np.ndarray) -> np.ndarray:
    """[n, k] 2-byte values in tiles: groups of DENSE_TILE_COLS columns (the last padded with
    zeros), each as k / 16 runs of its columns' 16 values."""
    n, k = values.shape
    cols, tk = abi.DENSE_TILE_COLS, abi.DENSE_TILE_K
    padded = np.zeros((-(-n // cols) * cols, k), dtype=values.dtype)
    padded[:n] = values
    tiles = padded.reshape(-1, cols, k // tk, tk).transpose(0, 2, 1, 3)
    return np.ascontiguousarray(tiles).reshape(-1, k)


def pack_groups(infos: list) -> list[tuple[list, object]]:
    """(infos, packed weight or None for dense float32) parts for weights read together: one
    packed part if they share a format, else one part each."""
    from . import pack

    if len(infos) == 1 or not all(pack.can_pack(i.qtype) for i in infos):
        groups = [([i], pack.pack(i) if pack.can_pack(i.qtype) else None) for i in infos]
    else:
        try:
            groups = [(infos, pack.pack_rows(infos))]
        except ValueError:  # mixed formats (e.g. Q4_K Q/K with a Q6_K V): one part each
            groups = [([i], pack.pack(i)) for i in infos]
    for parts, packed in groups:  # repacked: their raw blocks need not stay resident (a load's peak)
        if packed is not None:
            for info in parts:
                release_tensor_pages(info.data)
    return groups


class NativeLinear:
    """Weights reading one input (outputs side by side) and an optional bias, on the native
    kernels outside any model: quantized weights on the integer kernels (8-bit activations, as
    llama.cpp computes them), fp16/bf16/float32 ones on the float32 dot. A row's result depends on
    that row alone, whatever else is in the call."""

    def __init__(self, lib: ctypes.CDLL, infos: Sequence[TensorInfo], bias=None):
        k = infos[0].shape[1]
        if any(i.shape[1] != k for i in infos):
            raise ValueError(f"{', '.join(i.name for i in infos)}: the weights do not read the same input")
        groups = pack_groups(list(infos))
        self.lib = lib
        self.in_features = k
        self._keep: list = []
        self.lin = describe_linear(groups, bias, lambda t: hold(self._keep, t))
        self.out_features = self.lin.n_out

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        import torch

        flat = x.reshape(-1, self.in_features)
        if flat.dtype != torch.float32 or not flat.is_contiguous():
            flat = flat.float().contiguous()
        y = torch.empty(flat.shape[0], self.out_features)
        rc = self.lib.lp_linear(ctypes.byref(self.lin), flat.data_ptr(), flat.shape[0], y.data_ptr())
        if rc != abi.LP_OK:
            raise abi.error(self.lib, rc, "lp_linear")
        return y.reshape(*x.shape[:-1], self.out_features)
