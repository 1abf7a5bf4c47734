"""Model architectures. `load_model(gguf)` picks the class for the file's architecture."""

from __future__ import annotations

from ..gguf.file import GGUFError, GGUFFile
from .base import CausalLM, ModelConfig
from .gemma2 import Gemma2Model
from .gemma3 import Gemma3Model
from .gpt_oss import GptOssModel
from .granite import GraniteModel
from .llama import LlamaModel
from .mistral3 import Mistral3Model
from .olmo2 import Olmo2Model
from .phi3 import Phi3Model
from .qwen import Qwen2Model, Qwen3MoeModel

ARCHITECTURES: dict[str, type[CausalLM]] = {
    "llama": LlamaModel,
    "gemma3": Gemma3Model,
    "qwen2": Qwen2Model,
    "qwen3": Qwen2Model,  # qwen2's graph plus per-head Q/K norms, which the tensors say
    "qwen3moe": Qwen3MoeModel,
    "mistral3": Mistral3Model,
    "gemma2": Gemma2Model,
    "olmo2": Olmo2Model,
    "granite": GraniteModel,
    "phi3": Phi3Model,
    "gpt-oss": GptOssModel,
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
