"""LoRA adapters in llama.cpp's GGUF format, applied on top of any QuantLinear.

An adapter file has `general.type = adapter`, `adapter.type = lora`, `adapter.lora.alpha`, and
for each adapted weight `W` (e.g. `blk.0.attn_q.weight`) two tensors `W.lora_a` [rank, in] and
`W.lora_b` [out, rank]. A layer then computes `W x + s * B (A x)` with `s = scale * alpha / rank`
(or just `scale` when alpha is 0), as llama.cpp does. The weights stay separate (nothing is
merged), so adapters can be switched per step without touching the base weights.

This module reads and checks adapters (numpy arrays, no torch); each backend applies them its
own way (lamplight.models.lora_hooks for the PyTorch decoder, lamplight.native.runner).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from ..gguf.file import GGUFError, GGUFFile
from ..gguf.quant import dequantize
from .spec import DecoderSpec


@dataclass
class LoraAdapter:
    path: str
    alpha: float
    # base weight name -> (A [rank, in], B [out, rank])
    weights: dict[str, tuple[np.ndarray, np.ndarray]]
    scale: float = 1.0  # the server-wide scale (--lora-scaled, POST /lora-adapters)

    def factor(self, name: str) -> float:
        rank = self.weights[name][0].shape[0]
        return self.alpha / rank if self.alpha else 1.0


@dataclass
class LoraScales:
    """The scale of every loaded adapter for the step being computed (shared by all layers)."""

    scales: list[float] = field(default_factory=list)


def load_lora(path: str | os.PathLike, architecture: str) -> LoraAdapter:
    gguf = GGUFFile(path)
    meta = gguf.metadata
    if meta.get("general.type") != "adapter" or meta.get("adapter.type") != "lora":
        raise GGUFError(f"{gguf.path} is not a LoRA adapter (general.type={meta.get('general.type')!r}, adapter.type={meta.get('adapter.type')!r})")
    if meta.get("general.architecture") != architecture:
        raise GGUFError(f"{gguf.path}: adapter is for {meta.get('general.architecture')!r}, the model is {architecture!r}")
    pairs: dict[str, dict[str, np.ndarray]] = {}
    for name, info in gguf.tensors.items():
        base, _, kind = name.rpartition(".")
        if kind not in ("lora_a", "lora_b"):
            raise GGUFError(f"{gguf.path}: unexpected tensor {name} in a LoRA adapter")
        pairs.setdefault(base, {})[kind] = dequantize(info)
    weights = {}
    for base, pair in pairs.items():
        if set(pair) != {"lora_a", "lora_b"}:
            raise GGUFError(f"{gguf.path}: {base} lacks its lora_a or lora_b tensor")
        a, b = pair["lora_a"], pair["lora_b"]
        if a.shape[0] != b.shape[1]:
            raise GGUFError(f"{gguf.path}: {base}.lora_a and .lora_b ranks differ ({a.shape[0]} vs {b.shape[1]})")
        weights[base] = (a, b)
    return LoraAdapter(os.fspath(path), float(meta.get("adapter.lora.alpha", 0.0)), weights)


def check_adapters(spec: DecoderSpec, adapters: list[LoraAdapter]) -> None:
    """Every adapted weight is a linear weight of the model, of the adapter's shape."""
    linears = spec.linear_weights()
    for adapter in adapters:
        for name, (a, b) in adapter.weights.items():
            weight = linears.get(name)
            if weight is None:
                raise GGUFError(f"{adapter.path}: adapts {name}, which is not a linear weight of the model")
            out_features, in_features = weight.shape
            if a.shape[1] != in_features or b.shape[0] != out_features:
                raise GGUFError(f"{adapter.path}: {name} adapter shape does not match the model's weight")
