"""Model definitions: what each GGUF architecture computes.

`define_model(gguf)` reads a file into a `DecoderSpec` (every weight by its role, plus the
architecture's options); a runner (lamplight.runner, lamplight.native) computes it. Every
architecture is one configuration of the decoder: adding one is a module with an `options`
function and an entry below.

Reading a definition needs no torch: the PyTorch modules (`Decoder`, `load_model`) are imported
when first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from ..gguf.file import GGUFError, GGUFFile
from . import gemma2, gemma3, gemma4, gpt_oss, granite, lfm2, llama, mistral3, olmo2, phi3, qwen, qwen35
from .config import ModelConfig, read_common_config
from .options import DecoderOptions
from .spec import DecoderSpec, read_decoder_spec

if TYPE_CHECKING:
    from .decoder import Decoder

ARCHITECTURES: dict[str, Callable[[GGUFFile, ModelConfig], DecoderOptions]] = {
    "llama": llama.options,
    "gemma3": gemma3.options,
    "qwen2": qwen.qwen2_options,
    "qwen3": qwen.qwen2_options,  # qwen2's graph plus per-head Q/K norms, which the tensors say
    "qwen3moe": qwen.qwen3moe_options,
    "mistral3": mistral3.options,
    "gemma2": gemma2.options,
    "olmo2": olmo2.options,
    "granite": granite.options,
    "phi3": phi3.options,
    "gpt-oss": gpt_oss.options,
    "smollm3": llama.smollm3_options,
    "gemma4": gemma4.options,
    # Hybrids of attention and recurrent layers (lamplight.models.recurrent)
    "qwen35": qwen35.qwen35_options,
    "qwen35moe": qwen35.qwen35moe_options,
    "lfm2": lfm2.options,
    "granitehybrid": granite.hybrid_options,
}


def define_model(gguf: GGUFFile) -> DecoderSpec:
    """The file's model definition; an unsupported architecture is named before anything else fails."""
    arch = gguf.architecture
    options = ARCHITECTURES.get(arch)
    if options is None:
        raise GGUFError(
            f"{gguf.path}: architecture {arch!r} is not supported (supported: {', '.join(sorted(ARCHITECTURES))})"
        )
    config = read_common_config(gguf)
    return read_decoder_spec(gguf, config, options(gguf, config))


def load_model(gguf: GGUFFile) -> Decoder:
    """The file's model as PyTorch modules on the reference kernels (dequantized float32)."""
    from .decoder import Decoder

    model = Decoder(define_model(gguf))
    model.eval()
    return model


def __getattr__(name: str):
    if name == "Decoder":  # the PyTorch module, imported on first use
        from .decoder import Decoder

        return Decoder
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["ARCHITECTURES", "Decoder", "DecoderSpec", "ModelConfig", "define_model", "load_model"]
