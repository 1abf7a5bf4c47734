"""Weight kernels a QuantLinear (or a fused group of them) can compute with.

Each kernel maps float32 activations [..., in] to float32 outputs [..., out]; what happens
inside (bf16 activations, packed 4-bit weights) is the kernel's business.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .unpack import GROUP


class DenseKernel:
    """A dense weight in a chosen dtype (float32 reference, or bf16 for the fast path)."""

    def __init__(self, weight: torch.Tensor, dtype: torch.dtype):
        self.weight = weight.to(dtype).contiguous()
        self.dtype = dtype

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.to(self.dtype), self.weight).float()


class Int4CpuKernel:
    """PyTorch's CPU int4 matmul: 4-bit weights in groups of 32 with bf16 scale and zero.

    It reproduces GGUF's Q4_0/Q4_1/Q4_K values up to rounding the fp16 scales to bf16, and is
    fast only with bf16 activations (float32 activations take a path about 10x slower).
    """

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor):
        self.out_features, self.in_features = q.shape
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32).contiguous(), 1)
        self.scales_zeros = torch.stack([scale.t(), zero.t()], dim=-1).to(torch.bfloat16).contiguous()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).to(torch.bfloat16)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.packed, GROUP, self.scales_zeros)
        return y.float().reshape(*x.shape[:-1], self.out_features)
