"""Weight kernels a QuantLinear (or a fused group of them) can compute with.

Each kernel maps float32 activations [..., in] to float32 outputs [..., out]; what happens
inside (bf16 activations, packed 4-bit weights) is the kernel's business.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .unpack import GROUP


class DenseKernel:
    """A dense weight in a chosen dtype (float32 reference, or bf16 on CUDA).

    `row_multiple` > 1 computes the rows in products of exactly that many (the last padded): MKL
    chooses its float32 kernels by the product's sizes and sums a row in another order in
    another kernel, so a row's result would depend on how many rows came with it. Padding to a
    multiple of 4 in one product was enough on AMD (Zen 5); Intel's MKL paths use other kernels
    for every product under 16 rows, and with 2 threads for some sizes up to 48 (Intel Xeon,
    family 6 model 167, MKL 2024.2). Products of one fixed shape sum every row alike on both,
    whatever its place among the 16 (tests/test_models.py). On that Xeon this made the PyTorch
    backend's 256-token SmolLM2 prompt 2.2x slower (281 -> 615 ms, attention included) and its
    decode step 9% slower; the native kernels, the default, do not use it.
    """

    def __init__(self, weight: torch.Tensor, dtype: torch.dtype, row_multiple: int = 1):
        self.weight = weight.to(dtype).contiguous()
        self.dtype = dtype
        self.row_multiple = row_multiple

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1]).to(self.dtype)
        n = flat.shape[0]
        pad = -n % self.row_multiple
        if pad or torch.compiler.is_compiling():  # compiled: no branch (a guard) on the row count
            flat = F.pad(flat, (0, 0, 0, pad))
        if self.row_multiple > 1 and flat.device.type == "cpu" and not torch.compiler.is_compiling():
            y = torch.cat([F.linear(block, self.weight) for block in flat.split(self.row_multiple)])[:n].float()
        else:
            y = F.linear(flat, self.weight)[:n].float()
        return y.reshape(*x.shape[:-1], self.out_features)


def invariant_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """F.linear(x, weight) in float32 in DenseKernel's fixed row blocks: each row's result the
    same whatever rows come with it."""
    return DenseKernel(weight, torch.float32, BATCH_INVARIANT_ROWS)(x)


class RowSplit:
    """How many leading rows of the current step are decode tokens (set by the model per step)."""

    decode_rows: int = 0


# Float32 matmuls compute their rows in products of exactly this many (see DenseKernel).
BATCH_INVARIANT_ROWS = 16


class Int4CpuKernel:
    """PyTorch's CPU int4 matmul: 4-bit weights in groups of 32 with bf16 scale and zero.

    It reproduces GGUF's Q4_0/Q4_1/Q4_K values up to rounding the fp16 scales to bf16, and is
    fast only with bf16 activations (float32 activations take a path about 10x slower). It works
    row by row (its cost grows linearly with the rows), so prompt rows (those after the step's
    decode rows) go to a float32 GEMM instead. Each row's kernel depends only on whether it is a
    decode token, never on what else is in the step, which keeps results batch-invariant.
    """

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor,
                 dense: torch.Tensor | None = None, split: RowSplit | None = None):
        self.out_features, self.in_features = q.shape
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32).contiguous(), 1)
        self.scales_zeros = torch.stack([scale.t(), zero.t()], dim=-1).to(torch.bfloat16).contiguous()
        self.dense = DenseKernel(dense, torch.float32, BATCH_INVARIANT_ROWS) if dense is not None else None
        self.split = split or RowSplit()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        flat = x if x.dim() == 2 else x.reshape(-1, self.in_features)
        n_decode = min(self.split.decode_rows, flat.shape[0])
        if self.dense is None or n_decode == flat.shape[0]:
            y = self._int4(flat)
        elif n_decode == 0:
            y = self.dense(flat)
        else:
            y = torch.cat((self._int4(flat[:n_decode]), self.dense(flat[n_decode:])))
        return y if x.dim() == 2 else y.reshape(*x.shape[:-1], self.out_features)

    def _int4(self, rows: torch.Tensor) -> torch.Tensor:
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(rows.to(torch.bfloat16), self.packed, GROUP, self.scales_zeros)
        return y.float()


class Int8CpuKernel:
    """PyTorch's CPU int8 matmul (bf16 activations, one scale per output row) for the output head.

    The head is the largest single read of a decode step (the vocabulary times the width); in
    int8 it is a quarter of float32, about 3x faster at one row. The weights are requantized
    per row from their float values (GGUF's Q8_0 has a scale per 32 weights), which adds a
    small error the fast-path fidelity test measures. Rows are computed independently.
    """

    def __init__(self, weight: torch.Tensor):
        self.out_features, self.in_features = weight.shape
        scale = weight.abs().amax(dim=1).clamp_min(1e-12) / 127.0
        self.q = torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8).contiguous()
        self.scale = scale.to(torch.bfloat16)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).to(torch.bfloat16)
        y = torch.ops.aten._weight_int8pack_mm(flat, self.q, self.scale).float()
        return y.reshape(*x.shape[:-1], self.out_features)
