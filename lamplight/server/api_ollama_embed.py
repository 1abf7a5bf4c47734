"""Ollama's embedding endpoints on the served embedder (lamplight.embeddings).

POST /api/embed: `input` a string or a list of strings, `truncate` (default true: an input over
the context is cut to it; false: refused), `dimensions` (keep the first N components, then
normalise again: Matryoshka truncation, as Ollama does), `options` and `keep_alive` checked as on
/api/chat. The answer: `{"model", "embeddings": [[...]], "total_duration", "load_duration",
"prompt_eval_count"}`, vectors L2-normalised as Ollama's.
POST /api/embeddings (Ollama's older endpoint): `prompt` one string, answered `{"embedding": [...]}`
unnormalised, as Ollama answers it.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from starlette.concurrency import run_in_threadpool

from lamplight.embeddings import EmbeddingInputError, Pooling

from .api_embeddings import NO_EMBEDDINGS
from .api_ollama_request import check_keep_alive
from .errors import ApiError, field_error, invalid_request, not_supported
from .fields import Fields
from .state import ServerState

EUCLIDEAN, NONE = 2, -1  # embd_normalize values (lamplight.embeddings.normalize)


def served_embedder(state: ServerState):
    """The embedder, or a 503 while the model loads, or a 501 for a server not started for
    embeddings (or started for per-token vectors or reranking, which Ollama has no shape for)."""
    embedder = state.embedder
    if embedder is None and not state.ready:
        state.require_ready()
    if embedder is None or embedder.pooling in (Pooling.NONE, Pooling.RANK):
        raise not_supported(NO_EMBEDDINGS)
    return embedder


async def embed(state: ServerState, body: dict) -> dict:
    """/api/embed."""
    start = time.perf_counter()
    embedder = served_embedder(state)
    fields = Fields(body)
    fields.string("model", "")
    check_keep_alive(body.get("keep_alive"))
    texts = _inputs(body.get("input"))
    truncate = fields.boolean("truncate", True)
    dimensions = fields.integer("dimensions", 0, minimum=0) if fields.given("dimensions") else None
    if dimensions is not None and not 1 <= dimensions <= embedder.n_embd:
        raise field_error("dimensions", f"must be between 1 and the model's {embedder.n_embd}, got {dimensions}")
    prompts = [_fitted(embedder, embedder.tokenize(text), truncate) for text in texts]
    vectors = await _vectors(embedder, prompts, NONE if dimensions else EUCLIDEAN)
    if dimensions:
        vectors = [_unit(v[:dimensions]) for v in vectors]
    return {
        "model": body.get("model") or state.model_name,
        "embeddings": [v.tolist() for v in vectors],
        "total_duration": int((time.perf_counter() - start) * 1e9),
        "load_duration": 0,
        "prompt_eval_count": sum(len(p) for p in prompts),
    }


async def embeddings_legacy(state: ServerState, body: dict) -> dict:
    """/api/embeddings: one `prompt`, its vector unnormalised."""
    embedder = served_embedder(state)
    fields = Fields(body)
    fields.string("model", "")
    check_keep_alive(body.get("keep_alive"))
    prompt = fields.string("prompt", "")
    if not prompt:
        return {"embedding": []}  # what Ollama answers to an empty prompt
    (vector,) = await _vectors(embedder, [_fitted(embedder, embedder.tokenize(prompt), True)], NONE)
    return {"embedding": vector.tolist()}


def _inputs(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(item, str) for item in value):
        return value
    if isinstance(value, list) and not value:
        raise field_error("input", "must not be an empty list")
    raise field_error("input", f"must be a string or a list of strings, got {value!r}")


def _fitted(embedder, tokens: list[int], truncate: bool) -> list[int]:
    """`tokens` within the model's context: cut with `truncate`, else refused."""
    if len(tokens) <= embedder.n_ctx:
        return tokens
    if not truncate:
        raise invalid_request(f"the input ({len(tokens)} tokens) exceeds the context length ({embedder.n_ctx})")
    return tokens[: embedder.n_ctx]


async def _vectors(embedder, prompts: list[list[int]], normalization: int) -> list[np.ndarray]:
    try:
        for tokens in prompts:
            embedder.check_tokens(tokens)
        return await run_in_threadpool(embedder.embed, prompts, normalization)
    except EmbeddingInputError as exc:
        raise ApiError(400, str(exc)) from None


def _unit(vector: np.ndarray) -> np.ndarray:
    norm = float(np.linalg.norm(vector))
    return vector / norm if norm > 0 else vector
