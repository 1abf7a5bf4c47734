"""Reading an mmproj's tensors as float32 torch tensors, each checked against the shape the
hyperparameters imply (a missing or misshapen tensor is a GGUFError naming it)."""

from __future__ import annotations

import torch

from ..gguf.file import GGUFError, GGUFFile
from ..gguf.quant import dequantize


class WeightReader:
    """Dequantizes tensors on request and counts the bytes of what it handed out."""

    def __init__(self, gguf: GGUFFile):
        self.gguf = gguf
        self.loaded_bytes = 0

    def has(self, name: str) -> bool:
        return name in self.gguf.tensors

    def shape(self, name: str) -> tuple[int, ...]:
        """A tensor's shape without reading it."""
        if name not in self.gguf.tensors:
            raise GGUFError(f"{self.gguf.path}: tensor {name} is missing from the projector")
        return self.gguf.tensors[name].shape

    def need(self, name: str, shape: tuple[int, ...] | None = None) -> torch.Tensor:
        """Tensor `name` (PyTorch order: a linear weight is (out, in)); `shape` entries of -1 are
        free, and the shape found is checked against the rest."""
        info = self.gguf.tensors.get(name)
        if info is None:
            raise GGUFError(f"{self.gguf.path}: tensor {name} is missing from the projector")
        if shape is not None and (len(info.shape) != len(shape)
                                  or any(want not in (-1, got) for want, got in zip(shape, info.shape))):
            want = "x".join("?" if d == -1 else str(d) for d in shape)
            raise GGUFError(f"{self.gguf.path}: tensor {name} has shape {'x'.join(map(str, info.shape))}, "
                            f"expected {want}")
        tensor = torch.from_numpy(dequantize(info))
        self.loaded_bytes += tensor.numel() * tensor.element_size()
        return tensor

    def optional(self, name: str, shape: tuple[int, ...] | None = None) -> torch.Tensor | None:
        return self.need(name, shape) if self.has(name) else None
