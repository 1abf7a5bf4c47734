"""The `llama` architecture (Llama 2/3, Mistral, SmolLM2 ... as converted by llama.cpp): the
plain decoder, NORM rope (the converter permuted Q/K rows for it), rope_freqs factors (Llama 3)
and the file's rope scaling. `smollm3` is the same block without rope on every fourth layer."""

from __future__ import annotations

from ..gguf.file import GGUFFile
from .config import ModelConfig
from .options import DecoderOptions, read_rope


def options(gguf: GGUFFile, config: ModelConfig) -> DecoderOptions:
    return DecoderOptions(neox_rope=False, rope_scaling=read_rope(gguf, config))


NOPE_PERIOD = 4  # smollm3: layer il has no rope iff (il + 1) % 4 == 0 (fixed in llama.cpp, no key)


def smollm3_options(gguf: GGUFFile, config: ModelConfig) -> DecoderOptions:
    """SmolLM3: a llama block (NORM rope) without rope on every fourth layer."""
    nope = tuple((il + 1) % NOPE_PERIOD == 0 for il in range(config.n_layers))
    return DecoderOptions(neox_rope=False, rope_scaling=read_rope(gguf, config), no_rope_layers=nope)
