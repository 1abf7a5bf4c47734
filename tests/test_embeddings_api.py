"""The embedding and rerank endpoints (lamplight.server.api_embeddings) replaying every HTTP
exchange recorded from llama-server (../shared/reference/embeddings): the same 200/non-200
split, llama-server's status and error type where it answers 4xx/501 (a 400 where it answers
500), the response shapes, keys, usage and order, vectors and scores within the noise; and the
official openai client's embeddings.create against a served app."""

from __future__ import annotations

import base64
import functools
import socket
import threading
import time

import numpy as np
import pytest
import uvicorn
from fastapi import FastAPI
from starlette.testclient import TestClient

from conftest import reference_params, reference_path
from lamplight.embeddings import load_embedder
from lamplight.server.api_embeddings import embeddings_router
from lamplight.server.errors import ApiError

MODELS = ("bert", "nomic-bert", "qwen3-embed", "gemma-embed", "bert-rerank", "qwen3-rerank", "bert-f32", "smollm2")
SLOT_CTX = 1024  # -c 2048 -np 2
# llama-server answers 200 with numbers read past the rank scores; lamplight refuses (400).
REFUSED_ON_PURPOSE = {"v1_embeddings_on_rerank_server", "v1_embeddings_rank_pooling"}
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _app(embedder, reranking: bool, name: str) -> FastAPI:
    app = FastAPI()
    app.include_router(embeddings_router(embedder, reranking=reranking, model_name=name))
    app.add_exception_handler(ApiError, lambda request, exc: exc.response())
    return app


def _flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


@functools.lru_cache(maxsize=None)
def _client(model: str, args: tuple[str, ...]) -> TestClient:
    """The app as llama-server was started for the record: --embedding, --pooling, --reranking."""
    reranking = "--reranking" in args
    if model == "smollm2":
        from lamplight.sources import resolve_model

        path, name = resolve_model("smollm2-135m-instruct"), SMOLLM2_FILE
    else:
        path, name = reference_path(f"embeddings/{model}.gguf"), f"{model}.gguf"
    embedder = None
    if "--embedding" in args or reranking:
        pooling = "rank" if reranking else _flag(list(args), "--pooling")
        embedder = load_embedder(path, pooling=pooling, n_ctx=SLOT_CTX)
    return TestClient(_app(embedder, reranking, name))


def _records(model: str):
    def pick(rows):
        main_noise = {r["run"]: max(r["fp32_weights_diff"]) for r in rows if "fp32_weights_diff" in r}
        full_scores = {r["run"]: {x["index"]: x["relevance_score"] for x in r["response"]["results"]}
                       for r in rows if r["case"] == "rerank_jina"}
        return [pytest.param(model, r, main_noise.get(r["run"]), full_scores.get(r["run"]), id=f"{model}-{r['run']}-{r['case']}")
                for r in rows if r["path"] != "/tokenize" and "np2-streams" not in r["run"]]
    return pick


@pytest.mark.parametrize("model,row,noise,scores",
                         [p for m in MODELS for p in reference_params(f"embeddings/{m}.jsonl", _records(m))])
def test_replays_llama_server(model, row, noise, scores):
    client = _client(model, tuple(row["server_args"]))
    if "raw_body" in row:
        reply = client.post(row["path"], content=row["raw_body"], headers={"Content-Type": "application/json"})
    else:
        reply = client.post(row["path"], json=row["request"])
    if row["case"] in REFUSED_ON_PURPOSE:
        assert reply.status_code == 400 and "rank" in reply.json()["error"]["message"]
        return
    if row["status"] != 200:
        _check_error(reply, row)
        return
    assert reply.status_code == 200, reply.text
    # No F32 copy of bert-f32 (it is one) nor of the real SmolLM2: cosines carry the check there.
    bound = 2e-4 + 2 * noise if noise is not None else None
    _check_answer(reply.json(), row["response"], row["path"], bound, scores, row["request"])


def _check_error(reply, row: dict) -> None:
    gold = row["response"]["error"]
    error = reply.json()["error"]
    if row["status"] == 500:  # llama-server's exceptions: a 400 naming the problem here
        assert reply.status_code == 400 and error["type"] == "invalid_request_error", error
        assert error["message"]
        return
    assert (reply.status_code, error["type"], error["message"]) == (row["status"], gold["type"], gold["message"])
    assert {k: v for k, v in error.items() if k not in ("code", "type", "message")} == \
        {k: v for k, v in gold.items() if k not in ("code", "type", "message")}


def _check_answer(mine, gold, path: str, bound: float | None, scores, request: dict) -> None:
    if path in ("/rerank", "/reranking", "/v1/rerank", "/v1/reranking"):
        _check_rerank(mine, gold, bound, scores, request.get("documents", request.get("texts")))
        return
    if isinstance(gold, dict):  # OpenAI shape
        assert list(mine) == list(gold) and mine["usage"] == gold["usage"] and mine["model"] == gold["model"]
        assert [list(item) for item in mine["data"]] == [list(item) for item in gold["data"]]
        assert [item["index"] for item in mine["data"]] == [item["index"] for item in gold["data"]]
        pairs = [(_decoded(m["embedding"]), _decoded(g["embedding"])) for m, g in zip(mine["data"], gold["data"])]
        assert len(pairs) == len(gold["data"])
    else:  # native: [{"index", "embedding": [[...], ...]}]
        assert [list(item) for item in mine] == [list(item) for item in gold]
        assert [item["index"] for item in mine] == [item["index"] for item in gold]
        pairs = [(np.asarray(m["embedding"]), np.asarray(g["embedding"])) for m, g in zip(mine, gold)]
    for m, g in pairs:
        assert m.shape == g.shape
        if m.ndim == 2 and m.shape[0] > 1:  # per-token vectors (pooling none): never normalised
            if bound is not None:
                assert np.abs(m - g).max() <= bound
            assert min(_cosine(a, b) for a, b in zip(m, g)) >= 0.998
        else:  # pooled: the direction and the normalisation's size
            m, g = m.reshape(-1), g.reshape(-1)
            assert _cosine(m, g) >= 0.998
            assert abs(np.abs(m).max() / np.abs(g).max() - 1) <= 0.03


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def _decoded(embedding) -> np.ndarray:
    if isinstance(embedding, str):
        return np.frombuffer(base64.b64decode(embedding), dtype="<f4").astype(np.float64)
    return np.asarray(embedding, dtype=np.float64)


def _check_rerank(mine, gold, bound: float, scores, documents: list[str]) -> None:
    items_m = mine if isinstance(gold, list) else mine["results"]
    items_g = gold if isinstance(gold, list) else gold["results"]
    assert isinstance(mine, type(gold)) and len(items_m) == len(items_g)
    if isinstance(gold, dict):
        assert list(mine) == list(gold) and mine["usage"] == gold["usage"] and mine["model"] == gold["model"]
    key = "score" if isinstance(gold, list) else "relevance_score"
    for m, g in zip(items_m, items_g):
        assert list(m) == list(g)
        assert abs(m[key] - g[key]) <= bound
        if m["index"] != g["index"]:  # two documents closer than the noise may trade places
            assert scores is not None and abs(scores[m["index"]] - scores[g["index"]]) <= 2 * bound
        if "text" in g:
            assert m["text"] == documents[m["index"]]


# -- the official openai client -------------------------------------------------------------

class _Served:
    def __init__(self, app: FastAPI):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> "_Served":
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "uvicorn did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def test_openai_client_embeddings_create():
    openai = pytest.importorskip("openai")
    embedder = load_embedder(reference_path("embeddings/bert.gguf"))
    texts = ["the cat sat on the mat.", "PARIS is the Capital of France!", ""]
    with _Served(_app(embedder, False, "bert.gguf")) as served:
        client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0, timeout=60)
        reply = client.embeddings.create(model="text-embedding-3-small", input=texts)  # base64 by default
        floats = client.embeddings.create(model="x", input=texts[0], encoding_format="float")
        with pytest.raises(openai.BadRequestError, match="must not be empty"):
            client.embeddings.create(model="x", input=[])
    expected = embedder.embed([embedder.tokenize(t) for t in texts])
    assert reply.model == "text-embedding-3-small" and [d.index for d in reply.data] == [0, 1, 2]
    for item, vector in zip(reply.data, expected):
        assert np.array_equal(np.asarray(item.embedding, dtype=np.float32), vector)
    assert np.array_equal(np.asarray(floats.data[0].embedding, dtype=np.float32), expected[0])
    assert reply.usage.prompt_tokens == sum(len(embedder.tokenize(t)) for t in texts)


def test_servers_without_embeddings_or_reranking_answer_501():
    client = TestClient(_app(None, False, "none.gguf"))
    for path in ("/v1/embeddings", "/embedding", "/embeddings"):
        reply = client.post(path, json={"input": "hi"})
        assert reply.status_code == 501 and reply.json()["error"]["type"] == "not_supported_error"
    bert = TestClient(_app(load_embedder(reference_path("embeddings/bert.gguf")), True, "bert.gguf"))
    reply = bert.post("/v1/rerank", json={"query": "a", "documents": ["b"]})
    assert reply.status_code == 501 and "--reranking" in reply.json()["error"]["message"]


def test_bad_bodies_are_400s_naming_the_problem():
    client = _client("bert", ("--embedding",))
    cases = [
        ({"input": "hi", "embd_normalize": "2"}, "embd_normalize"),
        ({"input": "hi", "embd_normalize": -3}, "embd_normalize"),
        ({"input": [[1.7, 2.2]]}, "prompt"),
        ({"input": [True]}, "prompt"),
        ({"input": "hi", "encoding_format": 1}, "float or base64"),
    ]
    for body, word in cases:
        reply = client.post("/v1/embeddings", json=body)
        assert reply.status_code == 400 and word in reply.json()["error"]["message"], (body, reply.text)
    rerank = _client("bert-rerank", ("--reranking",))
    for body, word in [({"query": "a", "documents": ["b"], "top_n": -1}, "top_n"),
                       ({"query": "a", "texts": ["b"], "return_text": "yes"}, "return_text")]:
        reply = rerank.post("/rerank", json=body)
        assert reply.status_code == 400 and word in reply.json()["error"]["message"], (body, reply.text)
    assert client.post("/v1/embeddings", json={"input": "still serving"}).status_code == 200
