"""Embedding and rerank models against llama.cpp's vectors and scores (../shared/reference/
embeddings): every architecture and pooling of the reference set, within the README's noise
bound (2e-4 + twice llama.cpp's own F32-weights difference, per component), the all-F32 BERT
tightly, normalisation, the limits, and batch invariance bit for bit."""

from __future__ import annotations

import functools
import random

import numpy as np
import pytest

from conftest import load_jsonl, reference_params, reference_path
from lamplight.embeddings import EmbeddingInputError, Pooling, load_embedder, normalize

FILES = ("bert", "nomic-bert", "qwen3-embed", "gemma-embed", "bert-f32")
SLOT_CTX = 1024  # the reference servers' slot context (-c 2048 -np 2)


@functools.lru_cache(maxsize=None)
def _embedder(model: str, pooling: str | None, backend: str = "reference"):
    return load_embedder(reference_path(f"embeddings/{model}.gguf"), pooling=pooling, backend=backend, n_ctx=SLOT_CTX)


def _pooling_flag(row: dict) -> str | None:
    args = row["server_args"]
    return args[args.index("--pooling") + 1] if "--pooling" in args else None


def _vectors(row: dict) -> list[np.ndarray]:
    items = row["response"]["data"] if row["path"] == "/v1/embeddings" else row["response"]
    return [np.asarray(item["embedding"], dtype=np.float64) for item in items]


def _main_requests(model: str):
    """The runs' main batches; not the -np 2 runs that record llama.cpp's partial pooling bug."""
    return lambda rows: [pytest.param(model, r, id=f"{model}-{r['run']}") for r in rows
                         if "numpy_f64_diff" in r and "np2-streams" not in r["run"]]


@pytest.mark.parametrize("model,row", [p for m in FILES for p in reference_params(f"embeddings/{m}.jsonl", _main_requests(m))])
def test_vectors_match_llama_cpp(model, row):
    embedder = _embedder(model, _pooling_flag(row))
    assert embedder.pooling.value == (_pooling_flag(row) or _gguf_default(model))
    mine = embedder.embed(row["tokens"])
    gold = _vectors(row)
    per_token = embedder.pooling is Pooling.NONE
    if model == "bert-f32":  # F32 weights, flash attention off: a float32 engine's own noise
        bounds = [1e-3 if per_token else 5e-5] * len(gold)  # per-token: ggml's fp16 GELU table flips
    else:
        bounds = [2e-4 + 2 * f for f in row["fp32_weights_diff"]]
    for i, (m, g, bound) in enumerate(zip(mine, gold, bounds)):
        assert m.shape == g.shape, i
        assert np.abs(m - g).max() <= bound, (i, np.abs(m - g).max(), bound)
        if not per_token:
            assert _cosine(m, g) >= (0.99999 if model == "bert-f32" else 0.999), i


def _gguf_default(model: str) -> str:
    return {"bert": "cls", "bert-f32": "cls", "nomic-bert": "mean", "qwen3-embed": "last", "gemma-embed": "mean"}[model]


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


@pytest.mark.parametrize("model", ["bert-rerank", "qwen3-rerank"])
def test_rerank_scores_match_llama_cpp(model):
    (row,) = [r for r in load_jsonl(f"embeddings/{model}.jsonl") if r["case"] == "rerank_jina"]
    embedder = _embedder(model, None)
    assert embedder.pooling is Pooling.RANK and embedder.has_rank_head
    query, documents = row["request"]["query"], row["request"]["documents"]
    assert [embedder.rerank_tokens(query, d) for d in documents] == row["tokens"]
    scores = embedder.rerank(query, documents)
    gold = {item["index"]: item["relevance_score"] for item in row["response"]["results"]}
    for i, (score, noise) in enumerate(zip(scores, row["fp32_weights_diff"])):
        assert abs(score - gold[i]) <= 2e-4 + 2 * noise, (i, score, gold[i])


def test_smollm2_mean_and_last_pooling(smollm2_path):
    """The real Q4_1 file (no F32 copy recorded: bound by the tiny files' quantization noise)."""
    rows = [r for r in load_jsonl("embeddings/smollm2.jsonl") if r["case"] == "v1_batch_float" and "np2" not in r["run"]]
    for row in rows:
        embedder = load_embedder(smollm2_path, pooling=_pooling_flag(row), n_ctx=SLOT_CTX)
        texts = row["request"]["input"]
        assert [embedder.tokenize(t) if isinstance(t, str) else t for t in texts] == row["tokens"]
        for i, (m, g) in enumerate(zip(embedder.embed(row["tokens"]), _vectors(row))):
            assert np.abs(m - g).max() <= 0.03 and _cosine(m, g) >= 0.998, (row["run"], i)


def test_normalisations_match_llama_cpp():
    rows = [r for r in load_jsonl("embeddings/bert.jsonl")
            if r["case"].startswith("embedding_native_norm") and "embd_normalize" in r["request"]]
    embedder = _embedder("bert", None)
    tokens = embedder.tokenize(rows[0]["request"]["content"])
    raw = embedder.embed([tokens], normalization=-1)[0]
    for row in rows:
        p = row["request"]["embd_normalize"]
        gold = _vectors(row)[0][0]
        mine = embedder.embed([tokens], normalization=p)[0]
        scale = np.abs(gold).max()  # 32760 for p = 0; the bound is relative to the values' size
        assert np.abs(mine - gold).max() <= scale * 0.02, p  # 2 * fp32w on unit vectors ~ 1e-2 relative
        np.testing.assert_allclose(mine, normalize(raw, p), rtol=1e-6, atol=1e-7)
    assert not normalize(np.zeros(4, np.float32), 2).any()


def test_pooling_none_gives_every_tokens_vector_unnormalised():
    embedder = _embedder("bert", "none")
    tokens = embedder.tokenize("the cat sat on the mat.")
    (per_token,) = embedder.embed([tokens], normalization=1)
    assert per_token.shape == (len(tokens), embedder.n_embd)
    assert not np.allclose(np.abs(per_token).sum(axis=1), 1.0)


@pytest.mark.parametrize("model,pooling,backend", [
    ("bert", None, "reference"), ("bert", "none", "reference"), ("nomic-bert", None, "reference"),
    ("qwen3-embed", None, "reference"), ("qwen3-embed", "mean", "pytorch"), ("gemma-embed", None, "reference"),
    ("qwen3-rerank", None, "reference"),
])
def test_an_inputs_vector_does_not_depend_on_the_batch(model, pooling, backend):
    """One input alone and inside a batch of 18 of other lengths (a one-token input, a
    duplicate of the same length): the same bits."""
    embedder = _embedder(model, pooling, backend)
    rng = random.Random(7)
    words = "the cat sat on mat and dog is in city of paris machine learning field study".split()
    batch = [embedder.tokenize(" ".join(rng.choice(words) for _ in range(rng.randint(1, 40)))) for _ in range(15)]
    target = embedder.tokenize("the cat sat on the mat.")
    batch[5:5] = [target]
    batch += [[7], list(target)]
    compute = embedder.rank if embedder.pooling is Pooling.RANK else embedder.embed
    alone, single = compute([target]), compute([[7]])
    together = compute(batch)
    assert np.array_equal(alone[0], together[5]) and np.array_equal(alone[0], together[-1])
    assert np.array_equal(single[0], together[-2])


def test_limits_as_llama_server():
    bert = _embedder("bert", None)
    with pytest.raises(EmbeddingInputError, match="input \\(513 tokens\\) is too large"):
        bert.check_tokens([5] * 513)
    bert.check_tokens([5] * 512)
    last = _embedder("qwen3-embed", None)  # last pooling on a decoder spans micro-batches
    last.check_tokens([5] * (SLOT_CTX - 1))
    with pytest.raises(EmbeddingInputError, match="exceeds the available context size") as info:
        last.check_tokens([5] * SLOT_CTX)
    assert info.value.kind == "exceed_context_size_error" and info.value.extra == {"n_prompt_tokens": SLOT_CTX, "n_ctx": SLOT_CTX}
    with pytest.raises(EmbeddingInputError, match="invalid tokens"):
        bert.check_tokens([3, -5])
    with pytest.raises(EmbeddingInputError, match="cannot be empty"):
        bert.check_tokens([])


def test_pooling_rank_needs_a_head_and_gives_no_vectors():
    with pytest.raises(ValueError, match="classification head"):
        load_embedder(reference_path("embeddings/bert.gguf"), pooling="rank")
    with pytest.raises(EmbeddingInputError, match="reranking"):
        _embedder("bert-rerank", None).embed([[2, 3]])
    with pytest.raises(ValueError, match="unknown pooling"):
        load_embedder(reference_path("embeddings/bert.gguf"), pooling="max")
