"""The vision transformer of an mmproj (CLIP / SigLIP style), in PyTorch float32, as llama.cpp's
clip.cpp runs it: patch convolution, learned position rows, optional pre-norm, pre-norm blocks
with full (bidirectional) attention, optional post-norm. Weights are read from the file's tensors
(`v.*`); the shapes come from the hyperparameters and are checked.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from .config import VisionConfig
from .weights import WeightReader

ACTIVATIONS = {
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),
}


class LayerNorm:
    def __init__(self, reader: WeightReader, prefix: str, width: int, eps: float):
        self.weight = reader.need(f"{prefix}.weight", (width,))
        self.bias = reader.need(f"{prefix}.bias", (width,))
        self.eps = eps

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)

    @classmethod
    def optional(cls, reader: WeightReader, prefix: str, width: int, eps: float) -> "LayerNorm | None":
        return cls(reader, prefix, width, eps) if reader.has(f"{prefix}.weight") else None


class Linear:
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        self.weight, self.bias = weight, bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    @classmethod
    def read(cls, reader: WeightReader, prefix: str, n_out: int, n_in: int, bias: bool = True) -> "Linear":
        return cls(reader.need(f"{prefix}.weight", (n_out, n_in)),
                   reader.need(f"{prefix}.bias", (n_out,)) if bias else None)


class VisionBlock:
    def __init__(self, reader: WeightReader, index: int, config: VisionConfig):
        p, e, ff = f"v.blk.{index}", config.n_embd, config.n_ff
        self.n_head = config.n_head
        self.ln1 = LayerNorm(reader, f"{p}.ln1", e, config.eps)
        self.q, self.k, self.v, self.out = (Linear.read(reader, f"{p}.{name}", e, e)
                                            for name in ("attn_q", "attn_k", "attn_v", "attn_out"))
        self.ln2 = LayerNorm(reader, f"{p}.ln2", e, config.eps)
        self.up, self.down = _feed_forward(reader, p, e, ff)
        self.act = ACTIVATIONS[config.activation]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.out(self._attention(self.ln1(x)))
        return x + self.down(self.act(self.up(self.ln2(x))))

    def _attention(self, h: torch.Tensor) -> torch.Tensor:
        n, e = h.shape
        d = e // self.n_head
        heads = lambda t: t.view(n, self.n_head, d).transpose(0, 1)  # noqa: E731  [H, n, d]
        q, k, v = heads(self.q(h)), heads(self.k(h)), heads(self.v(h))
        weights = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(d), dim=-1)
        return (weights @ v).transpose(0, 1).reshape(n, e)


def _feed_forward(reader: WeightReader, prefix: str, e: int, ff: int) -> tuple[Linear, Linear]:
    """(up: E -> n_ff, down: n_ff -> E). llama.cpp swaps the two when the tensor named ffn_down
    takes E inputs (the legacy LLaVA converter stores HF's fc1 as ffn_down): decided by shape,
    as llama.cpp does, so a tower with n_ff == E is swapped whatever its naming."""
    names = [f"{prefix}.ffn_up", f"{prefix}.ffn_down"]
    if reader.shape(f"{names[1]}.weight")[-1] == e:
        names.reverse()
    return Linear.read(reader, names[0], ff, e), Linear.read(reader, names[1], e, ff)


class VisionTower:
    """Patch embedding + blocks. `blocks_run` may be fewer than the file's (LLaVA runs all but the
    last); with a class embedding (LLaVA) the CLS row is appended *after* the patches and takes the
    last position row, as this llama.cpp build does (ggml-org/llama.cpp#25814)."""

    def __init__(self, reader: WeightReader, config: VisionConfig, blocks_run: int):
        e, p = config.n_embd, config.patch_size
        self.config = config
        self.patch_weight = reader.need("v.patch_embd.weight", (e, 3, p, p))
        self.patch_bias = reader.optional("v.patch_embd.bias", (e,))
        self.class_embd = reader.optional("v.class_embd", (e,))
        n_rows = config.n_patches + (self.class_embd is not None)
        self.position = reader.need("v.position_embd.weight", (n_rows, e))
        self.pre_ln = LayerNorm.optional(reader, "v.pre_ln", e, config.eps)
        self.blocks = [VisionBlock(reader, i, config) for i in range(blocks_run)]
        self.post_ln = LayerNorm.optional(reader, "v.post_ln", e, config.eps)

    @torch.inference_mode()
    def __call__(self, pixels: np.ndarray) -> torch.Tensor:
        """One float image [S, S, 3] -> [rows, E]: patches row-major (x fastest), then CLS if any."""
        image = torch.from_numpy(np.ascontiguousarray(pixels, dtype=np.float32)).permute(2, 0, 1)[None]
        patches = F.conv2d(image, self.patch_weight, self.patch_bias, stride=self.config.patch_size)
        x = patches.flatten(2)[0].T  # [n_patches, E]
        if self.class_embd is not None:
            x = torch.cat([x, self.class_embd[None]])
        x = x + self.position
        if self.pre_ln is not None:
            x = self.pre_ln(x)
        for block in self.blocks:
            x = block(x)
        return x if self.post_ln is None else self.post_ln(x)
