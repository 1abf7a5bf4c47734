"""The `llama` architecture (Llama 2/3, Mistral, SmolLM2 ... as converted by llama.cpp): the
plain decoder, NORM rope (the converter permuted Q/K rows for it), rope_freqs factors (Llama 3)
and the file's rope scaling."""

from __future__ import annotations

from ..gguf.file import GGUFFile
from .config import ModelConfig
from .options import DecoderOptions, read_rope


def options(gguf: GGUFFile, config: ModelConfig) -> DecoderOptions:
    return DecoderOptions(neox_rope=False, rope_scaling=read_rope(gguf, config))
