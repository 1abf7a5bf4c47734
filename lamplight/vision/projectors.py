"""Projectors: the tower's output rows -> rows of the text model's width (`mm.*` tensors).

Each reads its tensors at construction (shapes checked) and states its output width, which the
loader compares with the text model's n_embd.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..gguf.file import GGUFError
from .config import VisionConfig
from .encoder import Linear
from .weights import WeightReader

# Gemma 3's pooling kernel when the file has no clip.vision.projector.scale_factor (the converter
# writes the key only when it differs from 4).
GEMMA3_DEFAULT_POOL = 4


def _grid(x: torch.Tensor, config: VisionConfig) -> torch.Tensor:
    """The tower's patch rows as a [side, side, E] grid (y, x)."""
    side = config.patches_per_side
    return x[: side * side].reshape(side, side, -1)


def _factor_dividing(config: VisionConfig, factor: int, key: str, path: str) -> int:
    side = config.patches_per_side
    if side % factor:
        raise GGUFError(f"{path}: {key} = {factor} does not divide the {side} x {side} patch grid")
    return factor


class Idefics3Projector:
    """SmolVLM: pixel shuffle by s (s x s neighbouring patches concatenated, dy outer, dx inner),
    then `mm.model.fc` (no bias)."""

    def __init__(self, reader: WeightReader, config: VisionConfig):
        if config.scale_factor is None:
            raise GGUFError(f"{reader.gguf.path}: clip.vision.projector.scale_factor is missing "
                            "(idefics3 needs the pixel-shuffle factor; llama.cpp aborts without it)")
        self.config = config
        self.s = _factor_dividing(config, config.scale_factor, "clip.vision.projector.scale_factor", reader.gguf.path)
        self.fc = Linear(reader.need("mm.model.fc.weight", (-1, self.s * self.s * config.n_embd)), None)
        self.out_width = self.fc.weight.shape[0]
        self.rows_per_tile = config.n_patches // (self.s * self.s)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        s, e = self.s, self.config.n_embd
        side = self.config.patches_per_side // s
        shuffled = _grid(x, self.config).reshape(side, s, side, s, e).permute(0, 2, 1, 3, 4).reshape(-1, s * s * e)
        return self.fc(shuffled)


class Gemma3Projector:
    """Gemma 3: k x k average pool of the patch grid, RMS norm (vision eps, weight as stored: the
    converter already added Gemma's 1), then `x @ mm.input_projection.weight` as stored (its numpy
    layout is (vision, text): not transposed, unlike every other linear)."""

    def __init__(self, reader: WeightReader, config: VisionConfig):
        self.config = config
        key = "clip.vision.projector.scale_factor"
        self.k = _factor_dividing(config, config.scale_factor or GEMMA3_DEFAULT_POOL, key, reader.gguf.path)
        self.norm_weight = reader.need("mm.soft_emb_norm.weight", (config.n_embd,))
        self.projection = reader.need("mm.input_projection.weight", (config.n_embd, -1))
        self.out_width = self.projection.shape[1]
        self.rows_per_tile = (config.patches_per_side // self.k) ** 2

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        grid = _grid(x, self.config).permute(2, 0, 1)[None]  # [1, E, side, side]
        pooled = F.avg_pool2d(grid, self.k)[0].flatten(1).T  # [tokens, E], row-major
        normed = pooled * torch.rsqrt(pooled.square().mean(-1, keepdim=True) + self.config.eps) * self.norm_weight
        return normed @ self.projection


class LlavaMlpProjector:
    """LLaVA-1.5: `mm.0` linear, GELU (tanh), `mm.2` linear, over the tower's rows 1..n (this
    llama.cpp build drops patch 0 and keeps the CLS row, appended last by the tower)."""

    def __init__(self, reader: WeightReader, config: VisionConfig):
        self.config = config
        first = reader.need("mm.0.weight", (-1, config.n_embd))
        hidden = first.shape[0]
        self.fc1 = Linear(first, reader.need("mm.0.bias", (hidden,)))
        second = reader.need("mm.2.weight", (-1, hidden))
        self.out_width = second.shape[0]
        self.fc2 = Linear(second, reader.need("mm.2.bias", (self.out_width,)))
        self.rows_per_tile = config.n_patches

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x[1:]), approximate="tanh"))
