"""Embeddings on the native forward (lamplight.native: the final-normed hidden states of every
row instead of logits): the decoder cases of the reference set within llama.cpp's bound, an
input's vector independent of its batch bit for bit, and an embedder computing on the served
model's own runner (no second copy of the weights) with the same vectors. The encoders' quantized
linears on the native integer kernels: within the same bound, batch-invariant too."""

from __future__ import annotations

import functools
import random

import numpy as np
import pytest
import torch

from conftest import load_jsonl, reference_params, reference_path
from test_embeddings_models import SLOT_CTX, _cosine, _main_requests, _pooling_flag, _vectors
from tiny_gguf import write_tiny_llama

import lamplight
from lamplight.embeddings import Pooling, load_embedder
from lamplight.embeddings.decoders import ServedRunner, why_not_shared
from lamplight.models.batch import SequenceChunk
from lamplight.embeddings.encoder import Linear
from lamplight.native import runtime
from lamplight.native.linear import NativeLinear

pytestmark = pytest.mark.skipif(runtime.library() is None, reason="no native library on this machine")



@functools.lru_cache(maxsize=None)
def _embedder(model: str, pooling: str | None):
    return load_embedder(reference_path(f"embeddings/{model}.gguf"), pooling=pooling, backend="native", n_ctx=SLOT_CTX)


def _assert_within_llama_cpps_bound(embedder, row: dict) -> None:
    """The run's vectors within the README's bound of llama.cpp's (2e-4 + twice its own
    quantization noise per vector), pooled ones also at cosine 0.999 or more."""
    bounds = [2e-4 + 2 * f for f in row["fp32_weights_diff"]]
    for i, (m, g, bound) in enumerate(zip(embedder.embed(row["tokens"]), _vectors(row), bounds)):
        assert m.shape == g.shape, i
        assert np.abs(m - g).max() <= bound, (i, np.abs(m - g).max(), bound)
        if embedder.pooling is not Pooling.NONE:
            assert _cosine(m, g) >= 0.999, i


@pytest.mark.parametrize("model,row", reference_params("embeddings/qwen3-embed.jsonl", _main_requests("qwen3-embed")))
def test_native_vectors_match_llama_cpp(model, row):
    embedder = _embedder(model, _pooling_flag(row))
    assert embedder.body.backend == "native"
    _assert_within_llama_cpps_bound(embedder, row)


@pytest.mark.parametrize("model,row", [p for m in ("bert", "nomic-bert")
                                       for p in reference_params(f"embeddings/{m}.jsonl", _main_requests(m))])
def test_native_encoder_vectors_match_llama_cpp(model, row):
    """The tiny files cycle their linears through F32, F16, Q8_0, Q4_0 and Q4_1: the quantized
    ones run on the integer kernels, the others on PyTorch's float32 matmul."""
    embedder = _embedder(model, _pooling_flag(row))
    layers = embedder.body.layers
    linears = [lin for layer in layers for lin in (layer.qkv, layer.wo, layer.up, layer.down, layer.gate) if lin]
    assert any(isinstance(lin, NativeLinear) for lin in linears) and any(isinstance(lin, Linear) for lin in linears)
    assert embedder.kernels.startswith("native") and "Q8_0" in embedder.kernels and "F16" in embedder.kernels
    _assert_within_llama_cpps_bound(embedder, row)


def test_native_encoder_rerank_scores_match_llama_cpp():
    """The README's bound is a float engine's (llama.cpp's own quantization noise on each score,
    twice); 8-bit activations add noise of their own, as llama.cpp's do, but another draw of it:
    here it is at most llama.cpp's largest on the run (against the float32 reference), so a score
    is within llama.cpp's noise on it plus that."""
    (row,) = [r for r in load_jsonl("embeddings/bert-rerank.jsonl") if r["case"] == "rerank_jina"]
    embedder = _embedder("bert-rerank", None)
    assert embedder.kernels.startswith("native")
    query, documents = row["request"]["query"], row["request"]["documents"]
    scores = embedder.rerank(query, documents)
    exact = load_embedder(reference_path("embeddings/bert-rerank.gguf"), n_ctx=SLOT_CTX).rerank(query, documents)
    gold = {item["index"]: item["relevance_score"] for item in row["response"]["results"]}
    largest = max(row["fp32_weights_diff"])
    for i, (score, noise) in enumerate(zip(scores, row["fp32_weights_diff"])):
        assert abs(score - exact[i]) <= largest, (i, score, exact[i])
        assert abs(score - gold[i]) <= 2e-4 + noise + largest, (i, score, gold[i])


def test_an_encoder_without_quantized_weights_stays_on_pytorch():
    embedder = _embedder("bert-f32", None)
    assert embedder.kernels == "pytorch float32 encoder"
    assert not any(isinstance(lin, NativeLinear) for layer in embedder.body.layers for lin in (layer.qkv, layer.up))


def test_gemma_embedding_stays_on_pytorch():
    """Its sliding layers see a window on both sides of a token: the native attention's windows
    are one-sided, so the native backend computes it on PyTorch's kernels."""
    embedder = _embedder("gemma-embed", None)
    assert embedder.body.backend == "pytorch"
    reference = load_embedder(reference_path("embeddings/gemma-embed.gguf"), backend="pytorch", n_ctx=SLOT_CTX)
    tokens = [embedder.tokenize("the cat sat on the mat.")]
    assert np.array_equal(embedder.embed(tokens)[0], reference.embed(tokens)[0])


def test_native_rerank_scores_match_llama_cpp():
    (row,) = [r for r in load_jsonl("embeddings/qwen3-rerank.jsonl") if r["case"] == "rerank_jina"]
    embedder = _embedder("qwen3-rerank", None)
    scores = embedder.rerank(row["request"]["query"], row["request"]["documents"])
    gold = {item["index"]: item["relevance_score"] for item in row["response"]["results"]}
    for i, (score, noise) in enumerate(zip(scores, row["fp32_weights_diff"])):
        assert abs(score - gold[i]) <= 2e-4 + 2 * noise, (i, score, gold[i])


def test_native_smollm2_mean_and_last_pooling(smollm2_path):
    """The real Q4_1 file, bound as tests/test_embeddings_models.py bounds it on PyTorch; one
    native runner lent to both embedders (the inputs of the batch up to 64 tokens: the long
    ones only add time)."""
    runner = lamplight.load(smollm2_path, backend="native").runner
    rows = [r for r in load_jsonl("embeddings/smollm2.jsonl") if r["case"] == "v1_batch_float" and "np2" not in r["run"]]
    for row in rows:
        embedder = load_embedder(smollm2_path, pooling=_pooling_flag(row), n_ctx=SLOT_CTX,
                                 served=ServedRunner(runner, lambda fn: fn()))
        assert embedder.body.shared
        short = [i for i, tokens in enumerate(row["tokens"]) if len(tokens) <= 64]
        mine = embedder.embed([row["tokens"][i] for i in short])
        gold = _vectors(row)
        for i, m in zip(short, mine):
            assert np.abs(m - gold[i]).max() <= 0.03 and _cosine(m, gold[i]) >= 0.998, (row["run"], i)


def _mixed_batch(embedder, target: list[int]) -> list[list[int]]:
    """15 inputs of 1 to 40 words, the target at 5 and again last, a one-token input before it."""
    rng = random.Random(7)
    words = "the cat sat on mat and dog is in city of paris machine learning field study".split()
    batch = [embedder.tokenize(" ".join(rng.choice(words) for _ in range(rng.randint(1, 40)))) for _ in range(15)]
    batch[5:5] = [target]
    return batch + [[7], list(target)]


@pytest.mark.parametrize("model,pooling", [("qwen3-embed", None), ("qwen3-embed", "mean"), ("qwen3-rerank", None),
                                           ("bert", None), ("bert", "none"), ("nomic-bert", None), ("bert-rerank", None)])
def test_a_native_vector_does_not_depend_on_the_batch(model, pooling):
    embedder = _embedder(model, pooling)
    target = embedder.tokenize("the cat sat on the mat.")
    compute = embedder.rank if embedder.pooling is Pooling.RANK else embedder.embed
    alone, single = compute([target]), compute([[7]])
    together = compute(_mixed_batch(embedder, target))
    assert np.array_equal(alone[0], together[5]) and np.array_equal(alone[0], together[-1])
    assert np.array_equal(single[0], together[-2])


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("embed") / "tiny.gguf", n_ctx=512)


@pytest.mark.parametrize("backend", ["native", "pytorch"])
def test_the_embedder_computes_on_the_served_runner(tiny_model, backend):
    """No second copy: the served runner computes the vectors, through the call it is lent with
    (the engine's thread), and they are the bits of a separate embedder on the same backend;
    the runner's own logits are the same after."""
    runner = lamplight.load(tiny_model, backend=backend).runner
    calls = []

    def call(fn):
        calls.append(fn)
        return fn()

    state = runner.new_state(8)
    chunk = SequenceChunk([1, 5, 9], 0, range(3))
    logits_before = runner.run([chunk], state)
    shared = load_embedder(tiny_model, pooling="mean", served=ServedRunner(runner, call))
    own = load_embedder(tiny_model, pooling="mean", backend=backend)
    assert shared.body.runner is runner and shared.body.shared and not own.body.shared
    assert "the served model's weights" in shared.kernels
    inputs = [[1, 5, 9, 2], [3], [4, 4, 4, 4, 4, 4]]
    mine = shared.embed(inputs)
    assert len(calls) == 1
    for a, b in zip(mine, own.embed(inputs)):
        assert np.array_equal(a, b)
    assert torch.equal(runner.run([chunk], state), logits_before)


def test_a_reference_runner_is_not_shared(tiny_model):
    """The reference kernels are padded for batch invariance first: the embedder keeps its own."""
    loaded = lamplight.load(tiny_model, backend="reference")
    assert why_not_shared(loaded.runner) is not None
    embedder = load_embedder(tiny_model, pooling="mean", served=ServedRunner(loaded.runner, lambda fn: fn()))
    assert not embedder.body.shared and embedder.body.runner is not loaded.runner
