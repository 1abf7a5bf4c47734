"""Embedding and reranking models: vectors and relevance scores from GGUF files.

Encoders (`bert`, `nomic-bert`: encoder.py) and decoders (Qwen3-Embedding, Qwen3-Reranker,
SmolLM2, `gemma-embedding`: decoders.py, on lamplight's decoder) give every input's final hidden
states; `Embedder` (embedder.py) pools them (pooling.py: none, mean, cls, last, rank), applies
EmbeddingGemma's projections, normalises, or scores with the rank head, as llama.cpp does.
Many inputs share each forward step, and an input's vector never depends on what else is in
the step.

>>> e = load_embedder("bge-small.gguf")
>>> e.embed([e.tokenize("hello world")])[0].shape
(384,)
"""

from .embedder import Embedder, EmbeddingInputError, load_embedder
from .pooling import Pooling, normalize

__all__ = ["Embedder", "EmbeddingInputError", "Pooling", "load_embedder", "normalize"]
