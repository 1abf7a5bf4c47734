"""Switch a loaded model from the float32 reference path to fast kernels.

On CPU: every Q4_0/Q4_1/Q4_K weight becomes PyTorch's packed int4 matmul (bf16 activations),
every other weight a bf16 dense matrix, and Q/K/V and gate/up are fused into one matmul each
where their formats allow. A tied output head gets a bf16 copy of the embedding (the float32
table stays for lookups). On CUDA every weight becomes bf16 dense (cuBLAS is fast there).
The float32 weights are dropped, so memory shrinks too; the model code does not change.
"""

from __future__ import annotations

import torch
from torch import nn

from ..models.base import CausalLM
from ..models.layers import LinearGroup, QuantLinear
from .linear import DenseKernel, Int4CpuKernel
from .unpack import INT4_TYPES, unpack_int4


def use_fast_path(model: CausalLM, device: str = "cpu") -> CausalLM:
    cpu = torch.device(device).type == "cpu"
    grouped: set[int] = set()
    for module in model.modules():
        if isinstance(module, LinearGroup):
            module.fused = _fused_kernel(list(module.members), cpu)
            grouped.update(id(m) for m in module.members)
    for module in model.modules():
        if isinstance(module, QuantLinear):
            module.kernel = _kernel(module, cpu)
    if getattr(model, "output", None) is None:
        model.tied_head_kernel = DenseKernel(model.token_embd, torch.bfloat16)
    return model


def _kernel(layer: QuantLinear, cpu: bool):
    if cpu and layer.qtype in INT4_TYPES:
        return Int4CpuKernel(*unpack_int4(layer.info))
    return DenseKernel(layer.weight, torch.bfloat16)


def _fused_kernel(members: list[QuantLinear], cpu: bool):
    if cpu and all(m.qtype in INT4_TYPES for m in members):
        parts = [unpack_int4(m.info) for m in members]
        return Int4CpuKernel(*(torch.cat(p, dim=0) for p in zip(*parts)))
    return DenseKernel(torch.cat([m.weight for m in members], dim=0), torch.bfloat16)


def is_fast(model: nn.Module) -> bool:
    return any(isinstance(m, QuantLinear) and not isinstance(m.kernel, DenseKernel) for m in model.modules())
