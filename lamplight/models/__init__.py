"""Model architectures. `load_model(gguf)` picks the class for the file's architecture."""

from __future__ import annotations

from ..gguf.file import GGUFError, GGUFFile
from .base import CausalLM, ModelConfig
from .gemma3 import Gemma3Model
from .llama import LlamaModel

ARCHITECTURES: dict[str, type[CausalLM]] = {
    "llama": LlamaModel,
    "gemma3": Gemma3Model,
}


def load_model(gguf: GGUFFile) -> CausalLM:
    arch = gguf.architecture
    cls = ARCHITECTURES.get(arch)
    if cls is None:
        raise GGUFError(
            f"{gguf.path}: architecture {arch!r} is not supported (supported: {', '.join(sorted(ARCHITECTURES))})"
        )
    model = cls(gguf)
    model.eval()
    return model


__all__ = ["ARCHITECTURES", "CausalLM", "ModelConfig", "load_model"]
