"""Streaming and failure paths that a real model cannot produce on demand, driven by a scripted
stand-in for the engine: SSE pings, errors before and after the stream starts, queue full,
client disconnects (which must cancel the generation)."""

from __future__ import annotations

import threading

import httpx
import openai
import pytest
from test_server_support import ScriptedEngine, ServerThread, sse_events
from tiny_gguf import write_tiny_llama

import lamplight
from lamplight.engine.types import (
    ContextExceededError,
    ErrorEvent,
    FinalEvent,
    InvalidRequestError,
    PromptProgress,
    QueueFullError,
    Timings,
    TokenEvent,
)
from lamplight.server import ServerSettings, ServerState

PING_INTERVAL = 0.1
CHAT = {"messages": [{"role": "user", "content": "hi"}]}


def token(n: int, text: str, choice: int = 0) -> TokenEvent:
    return TokenEvent(choice=choice, token_id=100 + n, text=text, n_decoded=n + 1)


def final(content: str, n_decoded: int, choice: int = 0) -> FinalEvent:
    return FinalEvent(choice=choice, content=content, token_ids=tuple(range(100, 100 + n_decoded)),
                      stop_type="limit", stopping_word="", truncated=False, n_prompt=3, n_cached=1,
                      n_decoded=n_decoded, tokens_cached=3 + n_decoded, id_slot=0,
                      timings=Timings(1, 2, 1.5, n_decoded, 2.5), has_new_line=False)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    loaded = lamplight.load(str(write_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny.gguf")))
    engine = ScriptedEngine()
    state = ServerState(ServerSettings(sse_ping_interval=PING_INTERVAL))
    state.attach(loaded, engine)
    server = ServerThread(state).start()
    yield server, engine
    server.stop()


@pytest.fixture
def engine(served) -> ScriptedEngine:
    engine = served[1]
    engine.script, engine.submit_error, engine.handles = [], None, []
    return engine


@pytest.fixture
def url(served) -> str:
    return served[0].url


def wait_until(flag: threading.Event, seconds: float = 5.0) -> bool:
    return flag.wait(seconds)


def test_pings_while_the_engine_is_silent(url, engine):
    engine.script = [PING_INTERVAL * 3.5, token(0, "a"), PING_INTERVAL * 2.5, token(1, "b"), final("ab", 2)]
    text = httpx.post(f"{url}/completion", json={"prompt": "x", "stream": True}, timeout=10).text
    before_first_data = text[: text.index("data: ")]
    assert before_first_data.count(":\n\n") >= 2
    assert text.count(":\n\n") >= 3
    events = sse_events(text)
    assert [e["content"] for e in events] == ["a", "b", ""] and events[-1]["stop"] is True


def test_openai_client_ignores_pings(url, engine):
    engine.script = [token(0, "Hel"), PING_INTERVAL * 2.5, token(1, "lo"), final("Hello", 2)]
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=10)
    chunks = list(client.chat.completions.create(model="m", stream=True, **CHAT))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello"


def test_error_before_the_first_event_is_a_plain_http_error(url, engine):
    engine.script = [ErrorEvent(0, "decode failed", 500, "server_error")]
    for body in ({**CHAT, "stream": True}, CHAT):
        response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=10)
        assert response.status_code == 500
        assert response.json() == {"error": {"code": 500, "message": "decode failed", "type": "server_error"}}


def test_error_after_the_stream_started_ends_it_without_done(url, engine):
    engine.script = [token(0, "a"), ErrorEvent(0, "decode failed", 500, "server_error")]
    response = httpx.post(f"{url}/v1/chat/completions", json={**CHAT, "stream": True}, timeout=10)
    events = sse_events(response.text)
    assert response.status_code == 200 and "[DONE]" not in events
    assert events[-1] == {"error": {"code": 500, "message": "decode failed", "type": "server_error"}}


@pytest.mark.parametrize("error, code, type_", [
    (QueueFullError("the server is busy"), 503, "unavailable_error"),
    (ContextExceededError(300, 256), 400, "exceed_context_size_error"),
    (InvalidRequestError("id_slot 9 is out of range"), 400, "invalid_request_error"),
])
def test_submit_errors(url, engine, error, code, type_):
    engine.submit_error = error
    for body in (CHAT, {**CHAT, "stream": True}):
        response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=10)
        assert response.status_code == code
        assert response.json()["error"]["type"] == type_ and response.json()["error"]["message"] == str(error)


def test_disconnect_cancels_a_stream(url, engine):
    engine.script = [token(0, "a"), "hang"]
    with httpx.stream("POST", f"{url}/completion", json={"prompt": "x", "stream": True}, timeout=10) as response:
        next(response.iter_lines())
    assert wait_until(engine.handles[-1].cancelled)


def test_disconnect_cancels_a_silent_stream(url, engine):
    engine.script = ["hang"]
    with httpx.stream("POST", f"{url}/v1/chat/completions", json={**CHAT, "stream": True}, timeout=10) as response:
        assert next(response.iter_raw()).startswith(b":")
    assert wait_until(engine.handles[-1].cancelled)


def test_disconnect_cancels_a_non_stream_request(url, engine):
    engine.script = ["hang"]
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{url}/v1/chat/completions", json=CHAT, timeout=0.5)
    assert wait_until(engine.handles[-1].cancelled)


def test_text_held_back_until_the_end_is_still_streamed(url, engine):
    engine.script = [token(0, "Hel"), token(1, ""), final("Hello", 2)]
    events = sse_events(httpx.post(f"{url}/v1/chat/completions", json={**CHAT, "stream": True}, timeout=10).text)
    deltas = [e["choices"][0]["delta"].get("content") for e in events[:-1] if e["choices"]]
    assert deltas == [None, "Hel", "lo", None]
    native = sse_events(httpx.post(f"{url}/completion", json={"prompt": "x", "stream": True}, timeout=10).text)
    assert "".join(e["content"] for e in native) == "Hello"


def test_progress_and_timings_per_token(url, engine):
    engine.script = [PromptProgress(0, 3, 1, 1, 0.0), PromptProgress(0, 3, 1, 3, 4.0), token(0, "a"), final("a", 1)]
    body = {**CHAT, "stream": True, "return_progress": True, "timings_per_token": True}
    events = sse_events(httpx.post(f"{url}/v1/chat/completions", json=body, timeout=10).text)
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert events[0]["prompt_progress"] == {"total": 3, "cache": 1, "processed": 1, "time_ms": 0}
    assert events[1]["prompt_progress"]["processed"] == 3
    assert events[2]["choices"][0]["delta"] == {"content": "a"} and "timings" in events[2]
    assert engine.requests[-1].return_progress is True
    native = sse_events(httpx.post(f"{url}/completion", json={"prompt": "x", **body}, timeout=10).text)
    assert native[0]["prompt_progress"]["total"] == 3 and native[0]["tokens"] == []
    assert all("timings" in e for e in native)


def test_n_choices_streamed_side_by_side(url, engine):
    engine.script = [token(0, "a", 0), token(0, "b", 1), final("a", 1, 0), final("b", 1, 1)]
    body = {**CHAT, "stream": True, "n": 2, "stream_options": {"include_usage": True}}
    events = sse_events(httpx.post(f"{url}/v1/chat/completions", json=body, timeout=10).text)
    finishes = [e["choices"][0] for e in events[:-1] if e["choices"] and e["choices"][0]["finish_reason"]]
    assert [f["index"] for f in finishes] == [0, 1]
    assert events[-2]["usage"] == {"completion_tokens": 2, "prompt_tokens": 3, "total_tokens": 5,
                                   "prompt_tokens_details": {"cached_tokens": 1}}
    assert engine.requests[-1].n_choices == 2


def test_request_reaches_the_engine_as_asked(url, engine):
    engine.script = [final("", 0)]
    httpx.post(f"{url}/completion", json={
        "prompt": [1, 2, 3], "n_predict": 7, "stop": "x", "cache_prompt": False, "id_slot": 1, "seed": 42,
        "n_indent": 2, "t_max_predict_ms": 50, "temperature": 0.3, "logit_bias": [[5, False]]}, timeout=10)
    request = engine.requests[-1]
    assert request.prompt_tokens == [1, 2, 3] and request.n_predict == 7 and list(request.stop) == ["x"]
    assert request.cache_prompt is False and request.id_slot == 1 and request.n_indent == 2
    assert request.t_max_predict_ms == 50 and request.sampling.seed == 42
    assert request.sampling.temperature == 0.3 and request.sampling.logit_bias == [(5, float("-inf"))]
    httpx.post(f"{url}/completion", json={"prompt": "x"}, timeout=10)
    assert 0 <= engine.requests[-1].sampling.seed <= 0xFFFFFFFF  # -1 became a concrete seed


def test_unexpected_failures_are_json_500s(url, engine):
    engine.submit_error = RuntimeError("kaboom")
    response = httpx.post(f"{url}/completion", json={"prompt": "x"}, timeout=10)
    assert response.status_code == 500 and response.headers["server"] == "lamplight"
    assert response.json() == {"error": {"code": 500, "message": "RuntimeError: kaboom", "type": "server_error"}}
    engine.submit_error = None
    engine.script = [final("", 0)]
    # A lone surrogate is no text: refused as llama-server's JSON parser refuses it, naming the field.
    lone_surrogate = httpx.post(f"{url}/completion", content=b'{"prompt": "x", "stop": ["\\ud800"]}', timeout=10)
    assert lone_surrogate.status_code == 400 and "Field 'stop[0]'" in lone_surrogate.json()["error"]["message"]


def test_slots_fail_on_no_slot(url, engine):
    assert httpx.get(f"{url}/slots", timeout=10).status_code == 200
    response = httpx.get(f"{url}/slots?fail_on_no_slot=1", timeout=10)
    assert response.status_code == 503 and response.json()["error"]["type"] == "unavailable_error"
