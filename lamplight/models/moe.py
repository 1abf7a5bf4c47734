"""Mixture-of-experts feed-forward layers (llama.cpp's build_moe_ffn).

Expert weights stay as the GGUF stores them (3-D tensors, raw blocks): each step dequantizes
only the experts its tokens selected, and runs each expert on the rows routed to it. A token's
routing and result never depend on the other tokens of the step: the router is a per-row
linear, and every expert matmul runs its rows in the batch-invariant dense kernels' fixed blocks.
"""

from __future__ import annotations

import torch
from torch import nn

from ..gguf.file import TensorInfo
from ..gguf.quant import dequantize_rows
from ..kernels.linear import BATCH_INVARIANT_ROWS, DenseKernel
from .activations import ACTIVATIONS
from .activations import aligned
from .layers import DenseFeedForward, QuantLinear
from .spec import ExpertsSpec


class ExpertBank(nn.Module):
    """One 3-D expert tensor [n_expert, out, in] (plus an optional bias [n_expert, out]),
    read one expert at a time."""

    def __init__(self, info: TensorInfo, bias: torch.Tensor | None = None):
        super().__init__()
        self.info = info
        self.n_expert, self.out_features, self.in_features = info.shape
        self.register_buffer("bias", bias, persistent=False)

    def expert(self, e: int, device: torch.device) -> DenseKernel:
        """Expert e's float32 weight, dequantized from its blocks alone."""
        rows = torch.arange(e * self.out_features, (e + 1) * self.out_features).numpy()
        flat = TensorInfo(self.info.name, self.info.qtype, (self.info.data.shape[0], self.in_features), self.info.data)
        weight = torch.from_numpy(dequantize_rows(flat, rows)).to(device)
        return DenseKernel(weight, torch.float32, BATCH_INVARIANT_ROWS)

    def apply(self, x: torch.Tensor, e: int) -> torch.Tensor:
        y = self.expert(e, x.device)(x)
        return y if self.bias is None else y + self.bias[e]


class MoEFeedForward(nn.Module):
    """Router, top-k experts, weighted sum.

    gating 'softmax' (qwen3moe): softmax over all experts, top-k of the probabilities, weights
    renormalised to sum 1 when `normalize`. gating 'softmax_selected' (gpt-oss): top-k of the
    raw router logits, softmax over the k selected. A shared expert (qwen35moe) adds a dense FFN
    every token runs, scaled by sigmoid(shared_gate . x).
    """

    def __init__(self, spec: ExpertsSpec):
        super().__init__()
        self.router = QuantLinear(spec.router)
        self.register_buffer("router_bias", spec.router_bias, persistent=False)
        self.gate = ExpertBank(spec.gate, spec.gate_bias)
        self.up = ExpertBank(spec.up, spec.up_bias)
        self.down = ExpertBank(spec.down, spec.down_bias)
        self.n_used, self.gating, self.normalize = spec.n_used, spec.gating, spec.normalize
        self.activation = ACTIVATIONS[spec.activation]
        self.shared = None
        if spec.shared is not None:
            self.shared = DenseFeedForward(spec.shared)
        self.register_buffer("shared_gate", spec.shared_gate, persistent=False)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per row: the selected experts [T, k] and their weights [T, k]."""
        logits = self.router(x)
        if self.router_bias is not None:
            logits = logits + self.router_bias
        if self.gating == "softmax_selected":
            top, experts = logits.topk(self.n_used, dim=-1)
            return experts, torch.softmax(top, dim=-1)
        weights, experts = torch.softmax(logits, dim=-1).topk(self.n_used, dim=-1)
        if self.normalize:
            weights = weights / weights.sum(-1, keepdim=True)
        return experts, weights

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        experts, weights = self.route(x)
        out = torch.zeros_like(x)
        for e in experts.unique().tolist():  # ascending: each row sums its experts in one order
            rows, slot = (experts == e).nonzero(as_tuple=True)
            xe = x[rows]
            y = self.down.apply(self.activation(self.gate.apply(xe, e), self.up.apply(xe, e)), e)
            out.index_add_(0, rows, y * weights[rows, slot, None])
        if self.shared is not None:
            shared = self.shared(x)
            if self.shared_gate is not None:  # one scalar gate per token, summed per row (no
                # matrix-vector product: MKL's sums the rows of 1-3 row inputs another way)
                shared = shared * aligned(torch.sigmoid, (x * self.shared_gate).sum(-1))[:, None]
            out = out + shared
        return out
