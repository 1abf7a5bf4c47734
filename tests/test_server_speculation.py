"""Speculative decoding through HTTP: --spec-type's server drafts, requests turn it off or choose
kinds with `speculative.*`, the replies are those without it, and timings, /slots, /metrics and
generation_settings report it as llama-server does."""

from __future__ import annotations

import httpx
import pytest
from test_server_support import assert_error, serve, sse_events
from tiny_gguf import write_tiny_llama

from lamplight.server import ServerSettings
from lamplight.speculative import SpecConfig
from lamplight.speculative.config import NgramMapSizes, NgramModSizes

SMALL = NgramMapSizes(size_n=2, size_m=8)
SPEC = SpecConfig(kinds=("ngram-simple", "ngram-mod"), ngram_simple=SMALL, ngram_map_k=SMALL, ngram_map_k4v=SMALL,
                  ngram_mod=NgramModSizes(n_match=2, n_max=8, n_min=1))
PROMPT = " ".join(["the cat sat on the mat"] * 6)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    import lamplight
    from lamplight.server.launcher import EngineOptions, build_engine

    loaded = lamplight.load(str(write_tiny_llama(tmp_path_factory.mktemp("spec") / "tiny.gguf", n_ctx=1024)))
    engine = build_engine(loaded, EngineOptions(n_ctx=2048, n_parallel=2, n_ubatch=64, speculative=SPEC))
    running = serve(loaded, engine, ServerSettings(metrics=True))
    yield running, engine
    running.stop()
    engine.stop()


def complete(url: str, **body) -> dict:
    response = httpx.post(f"{url}/completion", json={"prompt": PROMPT, "n_predict": 40, "ignore_eos": True, **body},
                          timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 1.0, "seed": 7, "top_k": 0}])
def test_replies_are_those_without_speculation(server, sampling):
    running, _ = server
    off = complete(running.url, **sampling, **{"speculative.type": "none"})
    on = complete(running.url, **sampling)
    assert on["content"] == off["content"] and on["tokens_predicted"] == off["tokens_predicted"] == 40
    assert "draft_n" not in off["timings"]
    assert on["generation_settings"]["speculative.types"] == "ngram-simple,ngram-mod"
    assert off["generation_settings"]["speculative.types"] == "none"
    if "draft_n" in on["timings"]:
        assert 0 <= on["timings"]["draft_n_accepted"] <= on["timings"]["draft_n"]


def test_drafts_are_reported_in_timings_slots_and_metrics(server):
    running, engine = server
    drafted = [complete(running.url, temperature=0, **{"speculative.type": kind})["timings"].get("draft_n", 0)
               for kind in ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod")]
    assert sum(drafted) > 0
    assert all(slot["speculative"] for slot in httpx.get(f"{running.url}/slots", timeout=30).json())
    metrics = httpx.get(f"{running.url}/metrics", timeout=30).text
    counts = {line.split()[0]: float(line.split()[1]) for line in metrics.splitlines()
              if line.startswith("llamacpp:spec_decode")}
    assert counts["llamacpp:spec_decode_num_draft_tokens_total"] == engine.spec_stats.draft_tokens >= sum(drafted)
    assert counts["llamacpp:spec_decode_num_accepted_tokens_total"] == engine.spec_stats.accepted_tokens
    assert counts["llamacpp:spec_decode_num_drafts_total"] == engine.spec_stats.drafts > 0
    assert 'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"}' in counts or \
        engine.spec_stats.accepted_tokens == 0


def test_a_streamed_chat_reply_is_the_plain_one(server):
    running, _ = server
    body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 30, "temperature": 0, "stream": True}

    def content(extra: dict) -> str:
        response = httpx.post(f"{running.url}/v1/chat/completions", json={**body, **extra}, timeout=120)
        assert response.status_code == 200, response.text
        chunks = [e for e in sse_events(response.text) if isinstance(e, dict)]
        return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))

    assert content({}) == content({"speculative.type": "none"})


@pytest.mark.parametrize("field, value, message", [
    ("speculative.type", "draft-mtp", "draft-mtp: not yet"),
    ("speculative.type", "ngram-quick", "unknown speculative decoding type"),
    ("speculative.type", "ngram-mod,draft-simple", "the server was started without one (-md)"),
    ("speculative.type", 3, "speculative.type"),
    ("speculative.n_max", -1, "speculative.n_max"),
    ("speculative.n_min", 1.5, "speculative.n_min"),
    ("speculative.p_min", 2, "speculative.p_min"),
])
def test_bad_speculative_fields_are_400_naming_the_field(server, field, value, message):
    running, _ = server
    response = httpx.post(f"{running.url}/completion", json={"prompt": "hi", "n_predict": 2, field: value}, timeout=30)
    error = assert_error(response, 400, "invalid_request_error", message)
    assert field in error["message"]


def test_n_min_above_n_max_is_400(server):
    running, _ = server
    response = httpx.post(f"{running.url}/completion", timeout=30,
                          json={"prompt": "hi", "n_predict": 2, "speculative.n_max": 2, "speculative.n_min": 3})
    assert_error(response, 400, "invalid_request_error", "speculative.n_min")
    assert complete(running.url, temperature=0)["tokens_predicted"] == 40  # still serving
