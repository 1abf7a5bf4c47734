"""A model's dense values as torch tensors, for the PyTorch modules.

lamplight.models.spec keeps norms, biases, convolution weights and the like as numpy arrays, so
that reading a model needs no torch. This is where they become tensors (torch.from_numpy,
sharing the arrays' memory): `torch_spec` for the PyTorch decoder (lamplight.models.decoder),
`TorchWeightSource` for the modules that read a file's tensors by name (the encoders and the
embedders' heads). Raw GGUF tensors (TensorInfo) stay as they are.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from ..gguf.file import TensorInfo
from .spec import DecoderSpec, WeightSource


def torch_spec(spec: DecoderSpec) -> DecoderSpec:
    """`spec` with every numpy array in it (at any depth) as a torch tensor."""
    return _with_tensors(spec)


def _with_tensors(value):
    """`value` itself where it holds no array (configs and options stay the same objects)."""
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value)
    if isinstance(value, tuple):
        items = tuple(_with_tensors(v) for v in value)
        return value if all(new is old for new, old in zip(items, value)) else items
    if dataclasses.is_dataclass(value) and not isinstance(value, (type, TensorInfo)):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value) if f.init}
        changed = {name: new for name, old in fields.items() if (new := _with_tensors(old)) is not old}
        return dataclasses.replace(value, **changed) if changed else value
    return value


class TorchWeightSource(WeightSource):
    """A WeightSource whose dense tensors (and optional ones) are torch tensors."""

    def dense(self, name: str) -> torch.Tensor:
        return torch.from_numpy(super().dense(name))
