"""Embeddings through `lamplight serve`: an encoder served for vectors alone (no engine), a
generating model started with --embedding (it still generates), a reranker with --reranking,
Ollama's /api/embed, and the official clients unchanged. The vectors themselves are checked
against llama.cpp's in tests/test_embeddings_*.py; here: that the server serves the same ones.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import httpx
import numpy as np
import ollama
import openai
import pytest
from conftest import reference_path
from test_server_cli import free_port, wait_for_status
from tiny_gguf import write_tiny_llama

from lamplight.embeddings import load_embedder
from lamplight.gguf.file import GGUFFile
from lamplight.server.model_info import ftype_name


class Server:
    def __init__(self, *flags: str):
        self.port = free_port()
        command = [sys.executable, "-m", "lamplight", "serve", "--port", str(self.port), "-t", "1", *flags]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                        env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.url = f"http://127.0.0.1:{self.port}"
        try:
            wait_for_status(f"{self.url}/health", 200, seconds=120)
        except AssertionError:
            self.stop()
            raise AssertionError(f"the server did not start: {self.err}")

    def stop(self) -> str:
        self.process.send_signal(signal.SIGINT)
        try:
            _, self.err = self.process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            _, self.err = self.process.communicate()
        return self.err


@pytest.fixture(scope="module")
def bert():
    path = reference_path("embeddings/bert.gguf")
    server = Server("-m", str(path), "-c", "512")
    yield server, path
    server.stop()


def test_an_encoder_serves_vectors_alone(bert):
    server, path = bert
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none")
    texts = ["the quick brown fox", "Hello, World!", "a"]
    served = client.embeddings.create(model="bert", input=texts)
    expected = load_embedder(path, backend="fast").embed([load_embedder(path, backend="fast").tokenize(t) for t in texts])
    for item, vector in zip(served.data, expected):
        np.testing.assert_allclose(np.array(item.embedding, dtype=np.float32), vector, rtol=0, atol=1e-6)
    assert served.usage.prompt_tokens == sum(len(load_embedder(path, backend="fast").tokenize(t)) for t in texts)


def test_an_encoder_cannot_generate_but_describes_itself(bert):
    server, path = bert
    answer = httpx.post(f"{server.url}/completion", json={"prompt": "hi", "n_predict": 2}, timeout=30)
    assert answer.status_code == 501 and "embeddings only" in answer.json()["error"]["message"]
    chat = httpx.post(f"{server.url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
    assert chat.status_code == 501
    for route in ("/health", "/v1/models", "/slots", "/api/tags"):
        assert httpx.get(f"{server.url}{route}", timeout=30).status_code in (200, 501), route
    # As llama-server: /props, /tokenize and /detokenize serve a model that only embeds (a
    # benchmark or a RAG tool counts its chunks' tokens there).
    props = httpx.get(f"{server.url}/props", timeout=30).json()
    assert props["default_generation_settings"]["n_ctx"] == 512 and props["total_slots"] == 1
    assert props["bos_token"] == "[CLS]" and props["model_ftype"] == ftype_name(GGUFFile(path).metadata.get("general.file_type"))
    embedder = load_embedder(path, backend="fast")
    tokens = httpx.post(f"{server.url}/tokenize", json={"content": "Hello, World!"}, timeout=30).json()["tokens"]
    assert tokens == embedder.tokenize("Hello, World!")[1:-1]  # without [CLS] and [SEP]: add_special false
    with_specials = httpx.post(f"{server.url}/tokenize", json={"content": "Hello, World!", "add_special": True}).json()
    assert with_specials["tokens"] == embedder.tokenize("Hello, World!")
    text = httpx.post(f"{server.url}/detokenize", json={"tokens": tokens}, timeout=30).json()["content"]
    assert text.split() == ["hello", ",", "world", "!"]
    native = httpx.post(f"{server.url}/embedding", json={"content": "hello"}, timeout=30).json()
    embedder = load_embedder(bert[1], backend="fast")
    np.testing.assert_allclose(native[0]["embedding"][0], embedder.embed([embedder.tokenize("hello")])[0], atol=1e-6)
    assert httpx.post(f"{server.url}/rerank", json={"query": "a", "documents": ["b"]}).status_code == 501
    assert httpx.get(f"{server.url}/health").status_code == 200  # still serving


def test_ollama_embed_on_the_encoder(bert):
    server, path = bert
    client = ollama.Client(host=server.url)
    answer = client.embed(model="bert", input=["hello world", "goodbye"])
    embedder = load_embedder(path, backend="fast")
    expected = embedder.embed([embedder.tokenize(t) for t in ("hello world", "goodbye")])
    for served, vector in zip(answer.embeddings, expected):
        np.testing.assert_allclose(np.array(served, dtype=np.float32), vector, atol=1e-6)
        assert abs(np.linalg.norm(served) - 1.0) < 1e-5
    short = client.embed(model="bert", input="hello world", dimensions=8)
    assert len(short.embeddings[0]) == 8 and abs(np.linalg.norm(short.embeddings[0]) - 1.0) < 1e-5
    legacy = client.embeddings(model="bert", prompt="hello world")
    raw = embedder.embed([embedder.tokenize("hello world")], normalization=-1)[0]
    np.testing.assert_allclose(np.array(legacy.embedding, dtype=np.float32), raw, atol=1e-5)
    with pytest.raises(ollama.ResponseError) as error:
        client.embed(model="bert", input=[])
    assert error.value.status_code == 400 and "input" in error.value.error
    with pytest.raises(ollama.ResponseError) as error:
        client.embed(model="bert", input="x " * 600, truncate=False)
    assert error.value.status_code == 400 and "context" in error.value.error
    assert client.embed(model="bert", input="x " * 600).embeddings  # truncated to the context by default


def test_a_generating_model_with_embedding_still_generates(tmp_path):
    model = write_tiny_llama(tmp_path / "tiny.gguf", n_ctx=512)
    server = Server("-m", str(model), "-c", "512", "-np", "2", "--embedding", "--pooling", "mean",
                    "--embd-normalize", "-1")
    try:
        body = httpx.post(f"{server.url}/completion", json={"prompt": "hi", "n_predict": 2}, timeout=60).json()
        assert body["tokens_predicted"] == 2
        vectors = httpx.post(f"{server.url}/v1/embeddings", json={"input": "hi there"}, timeout=60).json()
        embedder = load_embedder(model, pooling="mean", backend="fast")  # the server's kernels (--weights fast)
        expected = embedder.embed([embedder.tokenize("hi there")], normalization=-1)[0]  # --embd-normalize -1
        np.testing.assert_allclose(np.array(vectors["data"][0]["embedding"], dtype=np.float32), expected, atol=1e-5)
    finally:
        err = server.stop()
    assert "embeddings: pooling mean" in err
    assert "the served model's weights" in err  # computed on the engine's runner: no second copy


def test_a_reranker_ranks(tmp_path):
    path = reference_path("embeddings/bert-rerank.gguf")
    server = Server("-m", str(path), "--reranking")
    try:
        documents = ["a cat sat on the mat", "stock prices fell", "the cat is asleep"]
        answer = httpx.post(f"{server.url}/v1/rerank", json={"query": "cat", "documents": documents, "top_n": 2},
                            timeout=60).json()
        embedder = load_embedder(path, pooling="rank", backend="fast")
        scores = embedder.rerank("cat", documents)
        assert [r["index"] for r in answer["results"]] == sorted(range(3), key=lambda i: -scores[i])[:2]
        for result in answer["results"]:
            assert abs(result["relevance_score"] - scores[result["index"]]) < 1e-6
        assert httpx.post(f"{server.url}/v1/embeddings", json={"input": "x"}).status_code == 400  # use /rerank
    finally:
        server.stop()


def test_reranking_a_model_without_a_head_is_a_start_up_error(tmp_path):
    model = write_tiny_llama(tmp_path / "tiny.gguf", n_ctx=512)
    port = free_port()
    done = subprocess.run([sys.executable, "-m", "lamplight", "serve", "-m", str(model), "--port", str(port),
                           "--reranking"], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "classification head" in done.stderr
