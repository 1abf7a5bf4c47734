"""The "pytorch" backend's kernels: a Decoder's float32 reference kernels swapped for fast ones.

On CPU, measured on an AVX2 machine: PyTorch's packed int4 matmul (bf16 activations) beats a
float32 GEMV several times over for a few rows but costs the same per row at any row count,
while MKL's float32 GEMM gets cheaper per row as rows grow; bf16 dense matmuls are slower than
float32 on CPUs without bf16 instructions. So every Q4_0/Q4_1/Q4_K weight gets the int4 kernel
for decode rows plus its float32 matrix for prompt chunks (see Int4CpuKernel), Q/K/V and
gate/up are fused into one matmul each where their formats allow, every other weight stays
float32, and the output head (the largest read of a decode step) becomes int8 with a scale
per row (see Int8CpuKernel). On CUDA every weight becomes bf16 dense (cuBLAS is fast there).
The model code does not change.
"""

from __future__ import annotations

import torch

from ..kernels.linear import BATCH_INVARIANT_ROWS, DenseKernel, Int4CpuKernel, Int8CpuKernel, RowSplit
from ..kernels.unpack import INT4_TYPES, unpack_int4
from ..models.decoder import Decoder
from ..models.layers import LinearGroup, QuantLinear


def use_fast_path(model: Decoder, device: str = "cpu") -> Decoder:
    cpu = torch.device(device).type == "cpu"
    split = RowSplit()
    model.row_split = split
    for module in model.modules():
        if isinstance(module, LinearGroup):
            module.fused = _fused_kernel(list(module.members), cpu, split)
            start = 0
            for member, size in zip(module.members, module.sizes):
                member.kernel = FusedSlice(module.fused, start, start + size)
                start += size
    for module in model.modules():
        if isinstance(module, QuantLinear) and not isinstance(module.kernel, FusedSlice):
            module.kernel = _kernel(module, cpu, split)
    if getattr(model, "output", None) is None:
        model.tied_head_kernel = Int8CpuKernel(model.token_embd) if cpu else DenseKernel(model.token_embd, torch.bfloat16)
    elif cpu:
        model.output.kernel = Int8CpuKernel(model.output.weight)
    return model


class FusedSlice:
    """The kernel of a layer whose weights live in its group's fused kernel: its columns of the
    fused output. The model calls the group, never the member, so the member keeps no copy of
    its own (that copy was a quarter of the fast path's memory)."""

    def __init__(self, fused, start: int, end: int):
        self.fused, self.start, self.end = fused, start, end

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.fused(x)[..., self.start : self.end]


def _kernel(layer: QuantLinear, cpu: bool, split: RowSplit):
    if not cpu:
        return DenseKernel(layer.weight, torch.bfloat16)
    if layer.qtype in INT4_TYPES:
        return Int4CpuKernel(*unpack_int4(layer.info), dense=layer.weight, split=split)
    return DenseKernel(layer.weight, torch.float32, BATCH_INVARIANT_ROWS)


def _fused_kernel(members: list[QuantLinear], cpu: bool, split: RowSplit):
    dense = torch.cat([m.weight for m in members], dim=0)
    if not cpu:
        return DenseKernel(dense, torch.bfloat16)
    if all(m.qtype in INT4_TYPES for m in members):
        parts = [unpack_int4(m.info) for m in members]
        return Int4CpuKernel(*(torch.cat(p, dim=0) for p in zip(*parts)), dense=dense, split=split)
    return DenseKernel(dense, torch.float32, BATCH_INVARIANT_ROWS)
