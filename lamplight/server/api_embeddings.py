"""Embeddings and reranking with llama-server's shapes (lamplight.embeddings computes them).

POST /v1/embeddings (OpenAI: `input` a string, strings, token ids or lists of them;
`encoding_format` float or base64; `usage`; a body with `content` instead gets the native shape),
/embedding and /embeddings (native: `[{"index", "embedding": [[...]]}]`, one vector per token
with pooling none), and /rerank, /reranking, /v1/rerank, /v1/reranking (Jina/Cohere's shape, or
TEI's bare array when the body has `texts`). `embd_normalize` as llama.cpp: -1 none, 0 int16
range, 1 taxicab, 2 euclidean (default), p > 2 p-norm.

`embeddings_router(embedder, reranking=..., model_name=...)` builds the routes for one served
model: without an embedder every route answers 501, as llama-server started without
`--embeddings`; /rerank needs `reranking` (llama-server's `--reranking`). The computation runs
off the event loop, one at a time per embedder (the embedder's own lock). Bad input is a 400
naming the problem where llama-server answers 500 (wrongly typed fields, a number where text
goes, an input over the micro-batch).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np
from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from lamplight.embeddings import EmbeddingInputError, Pooling

from .errors import ApiError, invalid_request, not_supported
from .json_io import json_response, read_json_object

if TYPE_CHECKING:
    from lamplight.embeddings import Embedder  # loaded (with torch) only by an embeddings server

EMBEDDING_PATHS_NATIVE = ("/embedding", "/embeddings")
RERANK_PATHS = ("/rerank", "/reranking", "/v1/rerank", "/v1/reranking")
NO_EMBEDDINGS = "This server does not support embeddings. Start it with `--embeddings`"
NO_RERANKING = "This server does not support reranking. Start it with `--reranking`"
NOT_OAI_POOLING = "Pooling type 'none' is not OAI compatible. Please use a different pooling type"
BAD_PROMPT = ('"prompt" elements must be a string, a list of tokens, or a list of mixed strings and tokens '
              "(multimodal prompts are not supported here)")
BAD_DOCUMENTS = '"documents" must be a non-empty string array'


@dataclass(frozen=True)
class Served:
    """What the routes serve: the embedder (None: a server not started for embeddings), whether
    it was started for reranking, and the model name answers echo."""

    embedder: Embedder | None
    reranking: bool = False
    model_name: str = ""
    normalize: int = 2  # embd_normalize unless a request gives one (--embd-normalize)


def embeddings_router(embedder: Embedder | None = None, *, reranking: bool = False, model_name: str | None = None,
                      served: Callable[[Request], Served] | None = None) -> APIRouter:
    """The embedding and rerank routes for `embedder`, or for what `served(request)` says at each
    request (a server whose model loads after its routes exist)."""
    router = APIRouter()
    fixed = Served(embedder, reranking, model_name or (embedder.path.name if embedder is not None else ""))
    lookup = served or (lambda request: fixed)

    @router.post("/v1/embeddings")
    async def openai_embeddings(request: Request) -> Response:
        now = lookup(request)
        model, name = _require_embedder(now.embedder), now.model_name
        if model.pooling is Pooling.NONE:
            raise invalid_request(NOT_OAI_POOLING)  # before the body, as llama-server
        body = await read_json_object(request)
        if "input" not in body and "content" in body:
            return await _native(model, body, body["content"], now.normalize)
        if "input" not in body:
            raise invalid_request('"input" or "content" must be provided')
        encoding = _encoding_format(body)
        prompts = _prompts(model, body["input"])
        vectors = await _embed(model, prompts, _normalization(body, now.normalize))
        return json_response({
            "model": body["model"] if isinstance(body.get("model"), str) else name,
            "object": "list",
            "usage": _usage(prompts),
            "data": [_openai_item(v, i, encoding) for i, v in enumerate(vectors)],
        })

    async def native_embeddings(request: Request) -> Response:
        now = lookup(request)
        model = _require_embedder(now.embedder)
        body = await read_json_object(request)
        key = "content" if "content" in body else "input"
        if key not in body:
            raise invalid_request('"input" or "content" must be provided')
        return await _native(model, body, body[key], now.normalize)

    for path in EMBEDDING_PATHS_NATIVE:
        router.add_api_route(path, native_embeddings, methods=["POST"])

    async def rerank(request: Request) -> Response:
        now = lookup(request)
        model, name = now.embedder, now.model_name
        if model is None or not now.reranking or model.pooling is not Pooling.RANK:
            raise not_supported(NO_RERANKING)  # a rank GGUF served with --embedding only, too
        body = await read_json_object(request)
        query, documents, tei = _rerank_request(body)
        top_n = _top_n(body, len(documents))
        sequences = [_checked(model, model.rerank_tokens(query, d)) for d in documents]
        scores = await run_in_threadpool(model.rank, sequences)
        ranked = sorted(range(len(documents)), key=lambda i: -scores[i])[:top_n]
        if tei:
            with_text = _boolean(body, "return_text")
            return json_response([_tei_item(i, scores[i], documents[i] if with_text else None) for i in ranked])
        return json_response({
            "model": body["model"] if isinstance(body.get("model"), str) else name,
            "object": "list",
            "usage": _usage(sequences),
            "results": [{"index": i, "relevance_score": scores[i]} for i in ranked],
        })

    for path in RERANK_PATHS:
        router.add_api_route(path, rerank, methods=["POST"])
    return router


# -- embeddings ---------------------------------------------------------------------------------

def _require_embedder(embedder: Embedder | None) -> Embedder:
    if embedder is None:
        raise not_supported(NO_EMBEDDINGS)
    if embedder.pooling is Pooling.RANK:
        # llama-server answers with numbers read past the scores; a rerank model gives scores only.
        raise invalid_request("Pooling type 'rank' gives relevance scores, not embeddings: use /rerank")
    return embedder


async def _native(model: Embedder, body: dict, prompt: Any, normalize: int = 2) -> Response:
    prompts = _prompts(model, prompt)
    vectors = await _embed(model, prompts, _normalization(body, normalize))
    if model.pooling is Pooling.NONE:
        return json_response([{"index": i, "embedding": v.tolist()} for i, v in enumerate(vectors)])
    return json_response([{"index": i, "embedding": [v.tolist()]} for i, v in enumerate(vectors)])


async def _embed(model: Embedder, prompts: list[list[int]], normalization: int) -> list[np.ndarray]:
    try:
        return await run_in_threadpool(model.embed, prompts, normalization)
    except EmbeddingInputError as exc:
        raise _input_error(exc) from None


def _openai_item(vector: np.ndarray, index: int, encoding: str) -> dict:
    if encoding == "base64":
        data = base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
        return {"embedding": data, "index": index, "object": "embedding", "encoding_format": "base64"}
    return {"embedding": vector.tolist(), "index": index, "object": "embedding"}


def _usage(prompts: Sequence[Sequence[int]]) -> dict:
    n = sum(len(p) for p in prompts)
    return {"prompt_tokens": n, "total_tokens": n}


def _encoding_format(body: dict) -> str:
    value = body.get("encoding_format", "float")
    if not isinstance(value, str) or value not in ("float", "base64"):
        raise invalid_request("The format to return the embeddings in. Can be either float or base64")
    return value


def _normalization(body: dict, default: int = 2) -> int:
    value = body.get("embd_normalize", default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid_request("\"embd_normalize\" must be an integer: -1 none, 0 max-abs (int16), 1 taxicab, "
                              "2 euclidean, p > 2 p-norm")
    if value < -1:
        raise invalid_request(f"\"embd_normalize\" {value} is not -1, 0, 1, 2 or a p-norm above 2")
    return value


def _prompts(model: Embedder, value: Any) -> list[list[int]]:
    """llama-server's input forms: a string; a list holding a number at the top level (one
    prompt of ids and strings); else a list of prompts, each a string or such a mixed list.
    Every prompt is checked (empty, invalid ids, over the limits) before anything is computed."""
    if isinstance(value, str):
        prompts = [model.tokenize(value)]
    elif isinstance(value, list):
        if not value:
            raise invalid_request('"input" must not be empty')
        if any(_is_integer(x) for x in value):
            prompts = [_mixed_prompt(model, value)]
        else:
            prompts = [model.tokenize(x) if isinstance(x, str) else _mixed_prompt(model, x) for x in value]
    else:
        raise invalid_request(BAD_PROMPT)
    return [_checked(model, p) for p in prompts]


def _is_integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _mixed_prompt(model: Embedder, items: Any) -> list[int]:
    """Token ids as given and strings tokenized; only a string in the first place gets the
    specials (llama-server's tokenize_mixed)."""
    if not isinstance(items, list):
        raise invalid_request(BAD_PROMPT)
    tokens: list[int] = []
    for position, item in enumerate(items):
        if _is_integer(item):
            tokens.append(item)
        elif isinstance(item, str):
            first = position == 0
            tokens += model.tokenizer.encode(item, add_special=first, parse_special=True)
        else:
            raise invalid_request(BAD_PROMPT)
    return tokens


def _checked(model: Embedder, tokens: list[int]) -> list[int]:
    try:
        model.check_tokens(tokens)
    except EmbeddingInputError as exc:
        raise _input_error(exc) from None
    return tokens


def _input_error(exc: EmbeddingInputError) -> ApiError:
    return ApiError(400, str(exc), exc.kind, **exc.extra)


# -- rerank -------------------------------------------------------------------------------------

def _rerank_request(body: dict) -> tuple[str, list[str], bool]:
    """(query, documents, TEI shape): `documents` scored where present, else TEI's `texts`; the
    TEI shape whenever the body has `texts`."""
    if "query" not in body:
        raise invalid_request('"query" must be provided')
    query = body["query"]
    if not isinstance(query, str):
        raise invalid_request('"query" must be a string')
    documents = body.get("documents") if "documents" in body else body.get("texts")
    if not isinstance(documents, list) or not documents or not all(isinstance(d, str) for d in documents):
        raise invalid_request(BAD_DOCUMENTS)
    return query, documents, "texts" in body


def _top_n(body: dict, n_documents: int) -> int:
    value = body.get("top_n", n_documents)
    if value is None:
        return n_documents
    if not _is_integer(value) or value < 0:
        raise invalid_request('"top_n" must be a non-negative integer')
    return value


def _boolean(body: dict, key: str) -> bool:
    value = body.get(key, False)
    if not isinstance(value, bool):
        raise invalid_request(f'"{key}" must be a boolean')
    return value


def _tei_item(index: int, score: float, text: str | None) -> dict:
    item: dict[str, Any] = {"index": index, "score": score}
    if text is not None:
        item["text"] = text
    return item
