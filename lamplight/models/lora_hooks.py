"""LoRA adapters (lamplight.models.lora) on the PyTorch decoder: each adapted QuantLinear adds
its adapters' deltas to its output."""

from __future__ import annotations

import torch
from torch import nn

from .layers import QuantLinear
from .lora import LoraAdapter, LoraScales


def attach_loras(model: nn.Module, adapters: list[LoraAdapter]) -> LoraScales:
    """Hook every adapter into the PyTorch model's linear layers (checked with check_adapters
    first); returns the per-step scale holder they share."""
    scales = LoraScales([0.0] * len(adapters))
    linears = {m.name: m for m in model.modules() if isinstance(m, QuantLinear)}
    for index, adapter in enumerate(adapters):
        for name, (a, b) in adapter.weights.items():
            linears[name].add_lora(index, torch.from_numpy(a), torch.from_numpy(b), adapter.factor(name), scales)
    return scales
