"""Context shift, n_indent and t_max_predict_ms through the HTTP API with the real SmolLM2-135M
model (greedy, short contexts so that the whole file stays around half a minute on a CPU)."""

from __future__ import annotations

import httpx
import pytest
from test_server_support import ServerThread, sse_events

import lamplight
from lamplight.server import ServerSettings, ServerState
from lamplight.server.launcher import EngineOptions, build_engine

pytestmark = pytest.mark.real_model

N_CTX = 128  # `-c 128 -np 1`: one slot of 128 tokens
FIB = {"prompt": "def fib(n):", "temperature": 0, "cache_prompt": True}


@pytest.fixture(scope="module")
def urls(smollm2_path):
    """Two servers over one loaded model: with and without --context-shift."""
    loaded = lamplight.load(str(smollm2_path))
    engines = [build_engine(loaded, EngineOptions(n_ctx=N_CTX, n_parallel=1, context_shift=shift))
               for shift in (True, False)]
    servers = []
    for engine in engines:
        state = ServerState(ServerSettings())
        state.attach(loaded, engine)
        servers.append(ServerThread(state).start())
    yield {"shift": servers[0].url, "stop": servers[1].url}
    for server in servers:
        server.stop()
    for engine in engines:
        engine.stop()


def post(url: str, path: str, **body) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=120)


def test_context_shift_streams_past_the_slot(urls):
    # A long prompt leaves room for few tokens: n_predict 160 needs several shifts of a 128-token slot.
    prompt = ("The history of the lighthouse begins in ancient times, when fires were lit on hills to guide "
              "ships at night. Later, towers of stone were built along the coast, and their keepers ") * 2
    body = {"prompt": prompt, "n_predict": 160, "temperature": 0, "ignore_eos": True, "cache_prompt": False}
    response = post(urls["shift"], "/completion", stream=True, **body)
    assert response.status_code == 200
    response.content.decode("utf-8")  # strict: valid UTF-8 all along
    events = sse_events(response.text)
    assert all("error" not in e for e in events)
    partials, final = events[:-1], events[-1]
    n_prompt = final["tokens_evaluated"]
    assert N_CTX - n_prompt < 60  # the slot is full long before n_predict
    assert len(partials) == 160 and final["tokens_predicted"] == 160
    assert final["truncated"] is True and final["stop_type"] == "limit" and final["tokens_cached"] < N_CTX
    text = "".join(e["content"] for e in partials)
    assert "\ufffd" not in text and len(text.split()) > 60
    # Without --context-shift: stops when the slot is full, with the same text up to there.
    stopped = post(urls["stop"], "/completion", **body).json()
    assert stopped["tokens_predicted"] == N_CTX - n_prompt
    assert stopped["truncated"] is True and stopped["stop_type"] == "limit"
    assert text.startswith(stopped["content"])


def test_n_indent(urls):
    full = post(urls["stop"], "/completion", n_predict=40, **FIB).json()["content"]
    assert full.startswith("\n    if n == 0:\n        return 1\n")
    # Every line after the first newline must be indented by 8: the 4-space line ends it and is dropped.
    body = post(urls["stop"], "/completion", n_predict=40, n_indent=8, **FIB).json()
    assert (body["content"], body["stop_type"], body["truncated"]) == ("\n", "limit", False)
    streamed = sse_events(post(urls["stop"], "/completion", n_predict=40, n_indent=8, stream=True, **FIB).text)
    assert "".join(e["content"] for e in streamed) == "\n"  # the dropped line never reaches the client
    # With 4 the function body passes, and the first unindented line (after it) ends the generation.
    four = post(urls["stop"], "/completion", n_predict=40, n_indent=4, **FIB).json()
    assert four["stop_type"] == "limit" and full.startswith(four["content"])
    assert four["content"].startswith("\n    if n == 0:\n        return 1\n")
    lines = four["content"].split("\n")[1:]
    assert all(line.startswith("    ") for line in lines if line.strip())
    next_line = full[len(four["content"]):].split("\n")[0]
    assert next_line.strip() and not next_line.startswith("    ")


def test_t_max_predict_ms(urls):
    full = post(urls["stop"], "/completion", n_predict=30, **FIB).json()
    # 1 ms is spent at once: the generation stops at the first newline after the first token (the
    # time is measured from the first token, which here is itself a newline).
    body = post(urls["stop"], "/completion", n_predict=30, t_max_predict_ms=1, **FIB).json()
    assert body["stop_type"] == "limit" and full["content"].startswith(body["content"])
    assert body["content"].count("\n") == 2 and body["content"].rstrip(" ").endswith("\n")
    assert body["content"].startswith("\n    if n == 0:\n")
    relaxed = post(urls["stop"], "/completion", n_predict=30, t_max_predict_ms=600000, **FIB).json()
    assert relaxed["content"] == full["content"]


def test_infill_on_a_model_without_fim_tokens(urls):
    response = post(urls["stop"], "/infill", input_prefix="def fib(n):\n", input_suffix="\n")
    assert response.status_code == 400
    assert "Infill is not supported by this model" in response.json()["error"]["message"]
