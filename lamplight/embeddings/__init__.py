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

from .errors import EmbeddingInputError
from .pooling import Pooling, normalize


def __getattr__(name: str):
    # The models (PyTorch, or the native encoder beside it) are imported on first use: the
    # server's routes read the names above without torch, and only an embeddings server loads one.
    if name in ("Embedder", "load_embedder"):
        from . import embedder

        return getattr(embedder, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Embedder", "EmbeddingInputError", "Pooling", "load_embedder", "normalize"]
