"""`Embedder`: one embedding or rerank model, from token ids to pooled, normalised vectors or
relevance scores; `load_embedder` builds it from a GGUF file."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from ..gguf.file import GGUFError, GGUFFile
from ..models.torch_spec import TorchWeightSource
from ..tokenizer import Tokenizer
from .decoders import BACKENDS, DecoderBody, ServedRunner
from .encoder import ENCODER_ARCHITECTURES, Encoder
from .errors import EmbeddingInputError
from .pooling import Pooling, normalize, pool

DEFAULT_UBATCH = 512  # llama.cpp's n_ubatch: what one input must fit unless it can be split
STEP_TOKENS = 4096  # tokens computed per forward step (many inputs of a request share a step)
RERANK_TEMPLATE_KEY = "tokenizer.chat_template.rerank"


class RankHead:
    """The classifier a rerank model scores with: BERT's (cls.weight + tanh, then cls.output;
    the score is output 0, raw) or a decoder's yes/no rows (the score is softmax(...)[0], P(yes))."""

    def __init__(self, w: TorchWeightSource, softmax: bool):
        self.dense = w.optional_dense("cls.weight")
        self.dense_bias = w.optional_dense("cls.bias")
        self.out = w.dense("cls.output.weight")
        self.out_bias = w.optional_dense("cls.output.bias")
        self.softmax = softmax

    def score(self, h: torch.Tensor) -> float:
        if self.dense is not None:
            h = h @ self.dense.T
            h = torch.tanh(h if self.dense_bias is None else h + self.dense_bias)
        logits = h @ self.out.T
        if self.out_bias is not None:
            logits = logits + self.out_bias
        if self.softmax:
            logits = torch.softmax(logits.double(), dim=-1)
        return float(logits[0])


@dataclass
class Limits:
    """What one input may hold (llama-server's rules): an input that cannot be split over
    micro-batches must fit one (n_ubatch) and the context; one that can (last pooling on a
    causal decoder) must be shorter than the context."""

    n_ctx: int
    n_ubatch: int
    splittable: bool

    def check(self, n_tokens: int) -> None:
        if self.splittable:
            if n_tokens >= self.n_ctx:
                raise EmbeddingInputError(
                    f"request ({n_tokens} tokens) exceeds the available context size ({self.n_ctx} tokens), "
                    "try increasing it", "exceed_context_size_error", n_prompt_tokens=n_tokens, n_ctx=self.n_ctx)
            return
        if n_tokens > self.n_ubatch:
            raise EmbeddingInputError(f"input ({n_tokens} tokens) is too large to process. increase the physical "
                                      f"batch size (current batch size: {self.n_ubatch})")
        if n_tokens > self.n_ctx:
            raise EmbeddingInputError(
                f"input ({n_tokens} tokens) is larger than the max context size ({self.n_ctx} tokens)",
                "exceed_context_size_error", n_prompt_tokens=n_tokens, n_ctx=self.n_ctx)


class Embedder:
    """`embed(token lists)`: a vector per input ([n_embd]; [n_tokens, n_embd] with pooling none);
    `rerank(query, documents)`: a score per document. Thread-safe: one computation at a time."""

    def __init__(self, gguf: GGUFFile, pooling: Pooling | str | None = None, backend: str = "reference",
                 n_ctx: int | None = None, n_ubatch: int = DEFAULT_UBATCH, served: ServedRunner | None = None):
        self.path = Path(gguf.path)
        self.architecture = gguf.architecture
        self.tokenizer = Tokenizer.from_gguf(gguf)
        if gguf.architecture in ENCODER_ARCHITECTURES:
            self.body = Encoder(gguf, backend)
        else:
            self.body = DecoderBody(gguf, backend, served)
        # On a served runner a step holds up generation: steps of one micro-batch (llama-server's).
        self.step_tokens = n_ubatch if self.body.shared else STEP_TOKENS
        self.pooling = _pooling(gguf, pooling)
        w = TorchWeightSource(gguf)
        self.rank_head = RankHead(w, softmax=self.body.causal) if w.has("cls.output.weight") else None
        if self.pooling is Pooling.RANK and self.rank_head is None:
            raise GGUFError(f"{gguf.path}: pooling rank needs a classification head (cls.output.weight), the file has none")
        # EmbeddingGemma's projections after pooling (per token with pooling none).
        self.dense = [w.dense(name) for name in ("dense_2.weight", "dense_3.weight") if w.has(name)]
        self.n_embd = self.dense[-1].shape[0] if self.dense else self.body.n_embd
        self.n_ctx = min(n_ctx or self.body.n_ctx_train, self.body.n_ctx_train)
        self.limits = Limits(self.n_ctx, n_ubatch, splittable=self.body.causal and self.pooling is Pooling.LAST)
        self.rerank_template = gguf.metadata.get(RERANK_TEMPLATE_KEY)
        self.file_type = gguf.metadata.get("general.file_type")
        self._lock = threading.Lock()

    @property
    def kernels(self) -> str:
        """What computes the hidden states (the start-up log)."""
        return self.body.kernels

    @property
    def has_rank_head(self) -> bool:
        return self.rank_head is not None

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    # -- tokens ---------------------------------------------------------------------------------

    def tokenize(self, text: str) -> list[int]:
        """An input text's tokens as llama-server embeds it: specials added ([CLS]/[SEP], or
        the file's BOS/EOS) and special-token texts parsed."""
        return self.tokenizer.encode(text, add_special=True, parse_special=True)

    def rerank_tokens(self, query: str, document: str) -> list[int]:
        """The sequence scored for one (query, document) pair: the file's rerank template with
        both filled in, else [BOS] query [EOS] [SEP] document [EOS] as the vocabulary's add_*
        flags say (EOS falling back to SEP), the texts taken literally."""
        tok = self.tokenizer
        if self.rerank_template is not None:
            prompt = self.rerank_template.replace("{query}", query).replace("{document}", document)
            return tok.encode(prompt, add_special=False, parse_special=True)
        eos = tok.eos_id if tok.eos_id is not None else tok.sep_id
        ids = [tok.bos_id] if tok.add_bos and tok.bos_id is not None else []
        ids += tok.encode(query, add_special=False, parse_special=False)
        if tok.add_eos and eos is not None:
            ids.append(eos)
        if tok.add_sep and tok.sep_id is not None:
            ids.append(tok.sep_id)
        ids += tok.encode(document, add_special=False, parse_special=False)
        if tok.add_eos and eos is not None:
            ids.append(eos)
        return ids

    def check_tokens(self, tokens: Sequence[int]) -> None:
        """Raise EmbeddingInputError for an input the model cannot take."""
        if not tokens:
            raise EmbeddingInputError("Input content cannot be empty")
        if any(not 0 <= t < self.vocab_size for t in tokens):
            raise EmbeddingInputError("Prompt contains invalid tokens")
        self.limits.check(len(tokens))

    # -- computing ------------------------------------------------------------------------------

    def embed(self, inputs: Sequence[Sequence[int]], normalization: int = 2) -> list[np.ndarray]:
        """Float32 vectors, in input order: pooled and normalised per `normalization` (see
        pooling.normalize), or with pooling none every token's vector, never normalised."""
        if self.pooling is Pooling.RANK:
            raise EmbeddingInputError("this model is served for reranking (pooling rank): it gives scores, not vectors")
        pooled = [self._project(pool(h, self.pooling, self.body.causal)) for h in self._hidden(inputs)]
        if self.pooling is Pooling.NONE:
            return [p.numpy() for p in pooled]
        return [normalize(p.numpy(), normalization) for p in pooled]

    def rank(self, sequences: Sequence[Sequence[int]]) -> list[float]:
        """Each sequence's relevance score from the rank head."""
        if self.rank_head is None:
            raise EmbeddingInputError(f"{self.path.name} has no ranking head (cls.output.weight)")
        return [self.rank_head.score(pool(h, Pooling.RANK, self.body.causal)) for h in self._hidden(sequences)]

    def rerank(self, query: str, documents: Sequence[str]) -> list[float]:
        sequences = [self.rerank_tokens(query, d) for d in documents]
        for s in sequences:
            self.check_tokens(s)
        return self.rank(sequences)

    def _hidden(self, inputs: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        for tokens in inputs:
            self.check_tokens(tokens)
        with self._lock, torch.inference_mode():
            out: list[torch.Tensor] = []
            for step in _steps(inputs, self.step_tokens):
                out += self.body.hidden_states(step)
            return out

    def _project(self, x: torch.Tensor) -> torch.Tensor:
        for weight in self.dense:
            x = x @ weight.T
        return x


def _pooling(gguf: GGUFFile, pooling: Pooling | str | None) -> Pooling:
    if pooling is None:
        return Pooling.from_gguf_value(gguf.arch_value("pooling_type"))
    return pooling if isinstance(pooling, Pooling) else Pooling.parse(pooling)


def _steps(inputs: Sequence[Sequence[int]], budget: int) -> list[list[Sequence[int]]]:
    """Consecutive inputs grouped into steps of at most `budget` tokens (a longer input alone)."""
    steps: list[list[Sequence[int]]] = [[]]
    used = 0
    for tokens in inputs:
        if steps[-1] and used + len(tokens) > budget:
            steps.append([])
            used = 0
        steps[-1].append(tokens)
        used += len(tokens)
    return steps if steps[0] else []


def load_embedder(path: str | os.PathLike, pooling: Pooling | str | None = None, backend: str = "reference",
                  n_ctx: int | None = None, n_ubatch: int = DEFAULT_UBATCH,
                  served: ServedRunner | None = None) -> Embedder:
    """An embedder for a GGUF file: `pooling` overrides the file's pooling_type; `backend` is
    "reference" (float32), "pytorch" (PyTorch's fast kernels), "native" (the C++ forward) or
    "fast" (native where it runs, else pytorch) for decoders (gemma-embedding: PyTorch; encoders
    compute in float32 either way); `n_ctx` the context per input (default and at most the
    model's); `served`: the runner serving this same file, computed on instead of a second copy
    of the weights where it can be (decoders.why_not_shared)."""
    if backend not in BACKENDS:
        raise ValueError(f"embedding backend {backend!r} is not one of {', '.join(BACKENDS)}")
    return Embedder(GGUFFile(path), pooling, backend, n_ctx, n_ubatch, served)
