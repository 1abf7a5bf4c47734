"""llama.cpp-exact tokenization for GGUF vocabularies, built on the `tokenizers` library."""

from .decode import IncrementalDecoder
from .tokenizer import Tokenizer

__all__ = ["IncrementalDecoder", "Tokenizer"]
