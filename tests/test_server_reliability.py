"""Issue 14: no bad request can hurt the server or its neighbours. One regression test per defect,
through the HTTP API, plus the request limits and slow clients. Tiny random-weight model,
uvicorn on 127.0.0.1."""

from __future__ import annotations

import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from test_server_support import ServerThread, assert_error, sse_events, wait_all_idle
from tiny_gguf import write_tiny_llama

import lamplight
import lamplight.engine.engine as engine_module
from lamplight.server import ServerSettings, ServerState
from lamplight.server.launcher import EngineOptions, build_engine
from lamplight.server.settings import RequestLimits

LONG = {"n_predict": 40, "ignore_eos": True, "temperature": 0}


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    return lamplight.load(str(write_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny.gguf")))


@pytest.fixture(scope="module")
def engine(loaded):
    engine = build_engine(loaded, EngineOptions(n_ctx=1024, n_parallel=4, n_ubatch=64))
    yield engine
    engine.stop()


def serve(loaded, engine, **settings) -> ServerThread:
    state = ServerState(ServerSettings(metrics=True, **settings))
    state.attach(loaded, engine)
    return ServerThread(state).start()


@pytest.fixture(scope="module")
def server(loaded, engine):
    server = serve(loaded, engine)
    yield server
    server.stop()


@pytest.fixture()
def client(server):
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client


def stream(url: str, body: dict, path: str = "/completion") -> list:
    with httpx.Client(base_url=url, timeout=60) as client:
        return sse_events(client.post(path, json={**body, "stream": True}).text)


def assert_stream_finished(events: list) -> None:
    assert events[-1] == "[DONE]" or events[-1].get("stop") is True, events[-3:]
    assert not any(isinstance(e, dict) and "error" in e for e in events), events


# -- defect 1: one bad request failed every running stream -------------------------------------

@pytest.mark.parametrize("field", ["top_k", "min_keep"])
def test_huge_integer_is_a_400_and_running_streams_finish(server, client, field):
    with ThreadPoolExecutor(2) as pool:
        neighbours = [pool.submit(stream, server.url, {"prompt": f"the {i}", **LONG}) for i in range(2)]
        time.sleep(0.05)
        assert_error(client.post("/completion", json={"prompt": "hi", field: 1e30}), 400, "invalid_request_error",
                     f"Field '{field}'")
        for neighbour in neighbours:
            assert_stream_finished(neighbour.result())


def test_lone_surrogate_breaker_is_a_400_and_running_streams_finish(server, client):
    with ThreadPoolExecutor(1) as pool:
        neighbour = pool.submit(stream, server.url, {"prompt": "the", **LONG})
        time.sleep(0.05)
        response = client.post("/completion", content=json.dumps(
            {"prompt": "hi", "dry_multiplier": 0.8, "dry_sequence_breakers": ["\ud800"]}))
        assert_error(response, 400, "invalid_request_error", "Field 'dry_sequence_breakers[0]'")
        assert_stream_finished(neighbour.result())


def _fail_when(monkeypatch, name: str, seed: int) -> None:
    """Make the engine's `name` raise for requests with this seed: SequenceSampler (the request
    fails to start) or sample_batch (it fails in a batched step, after three tokens)."""
    original = getattr(engine_module, name)

    def failing(*args, **kwargs):
        if name == "SequenceSampler":
            hit = args[0].seed == seed
        else:
            hit = any(s.params.seed == seed and s.n_generated >= 3 for s in args[1])
        if hit:
            raise ValueError("Overflow when unpacking long long")
        return original(*args, **kwargs)

    monkeypatch.setattr(engine_module, name, failing)


@pytest.mark.parametrize("where", ["SequenceSampler", "sample_batch"])
def test_an_engine_failure_ends_that_request_alone(server, client, engine, monkeypatch, where):
    """Whatever still goes wrong in the engine (starting a request, or in a batched sampling step)
    fails that request with an answer; the others in the same steps finish normally."""
    _fail_when(monkeypatch, where, seed=666)
    with ThreadPoolExecutor(3) as pool:
        neighbours = [pool.submit(stream, server.url, {"prompt": f"a {i}", **LONG, "seed": i}) for i in range(2)]
        time.sleep(0.05)
        bad_stream = pool.submit(client.post, "/completion", json={"prompt": "the", **LONG, "seed": 666, "stream": True})
        bad = client.post("/completion", json={"prompt": "in", **LONG, "seed": 666})
        assert_error(bad, 500, "server_error", "Overflow when unpacking long long")
        streamed = bad_stream.result()
        if where == "SequenceSampler":  # failed before its first event: a plain HTTP error
            assert_error(streamed, 500, "server_error", "Overflow when unpacking long long")
        else:  # failed mid-stream: tokens, then an error event, and no [DONE]
            events = sse_events(streamed.text)
            assert "content" in events[0] and "Overflow" in events[-1]["error"]["message"]
        for neighbour in neighbours:
            assert_stream_finished(neighbour.result())
    wait_all_idle(engine)
    monkeypatch.undo()
    assert client.post("/completion", json={"prompt": "hi", "n_predict": 2}).status_code == 200


# -- defect 2: one heavy request froze everyone ------------------------------------------------

def test_breakers_are_bounded_and_prepared_off_the_engine_thread(server, client, monkeypatch):
    too_many = [f"b{i}" for i in range(2500)]
    assert_error(client.post("/completion", json={"prompt": "hi", "dry_multiplier": 0.8,
                                                  "dry_sequence_breakers": too_many}),
                 400, "invalid_request_error", "at most 64 breakers (--max-dry-breakers), got 2500")
    from lamplight.sampling import dry

    threads = []
    original = dry.BreakerTable.for_tokenizer.__func__

    def recording(cls, tokenizer, breakers):
        threads.append(threading.current_thread().name)
        return original(cls, tokenizer, breakers)

    monkeypatch.setattr(dry.BreakerTable, "for_tokenizer", classmethod(recording))
    body = {"prompt": "the the the", "n_predict": 4, "dry_multiplier": 0.8,
            "dry_sequence_breakers": [f"x{i}" for i in range(64)]}
    assert client.post("/completion", json=body).status_code == 200
    assert threads and "lamplight-engine" not in threads


# -- defect 3: 500s on bad input ---------------------------------------------------------------

DEEP = "[" * 5000 + "]" * 5000
BAD_INPUTS = [
    ("/completion", DEEP, "nested too deeply"),
    ("/v1/chat/completions", DEEP, "nested too deeply"),
    ("/v1/completions", '{"prompt": ' + DEEP + "}", "nested too deeply"),
    ("/tokenize", '{"content": ' + DEEP + "}", "nested too deeply"),
    ("/detokenize", DEEP, "nested too deeply"),
    ("/apply-template", DEEP, "nested too deeply"),
    ("/infill", DEEP, "nested too deeply"),
    ("/completion", json.dumps({"prompt": "a", "grammar": "root ::= " + "(" * 3000 + '"a"' + ")" * 3000}),
     "Field 'grammar'"),
    ("/completion", json.dumps({"prompt": "a\ud800"}), "Field 'prompt'"),
    ("/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "\ud800"}]}),
     "Field 'messages[0].content'"),
    ("/tokenize", json.dumps({"content": "x\udfff"}), "Field 'content'"),
    ("/completion", json.dumps({"prompt": "a", "logit_bias": [["\ud800", 1]]}), "Field 'logit_bias[0][0]'"),
    ("/completion", json.dumps({"prompt": "a", "logit_bias": {"\ud800": 1}}), "lone UTF-16 surrogate"),
    ("/completion", json.dumps({"prompt": "a", "temperature": 1e308}), "Field 'temperature'"),
    ("/completion", json.dumps({"prompt": "a", "presence_penalty": 1e308}), "Field 'presence_penalty'"),
    ("/completion", json.dumps({"prompt": "a", "presence_penalty": -1e308, "stream": True}),
     "Field 'presence_penalty'"),
    ("/completion", json.dumps({"prompt": "a", "logit_bias": [[5, 1e308]]}), "Field 'logit_bias'"),
    ("/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "x"}], "logit_bias": {"5": -1e308}}),
     "Field 'logit_bias'"),
]


@pytest.mark.parametrize("path,body,message", BAD_INPUTS, ids=range(len(BAD_INPUTS)))
def test_bad_input_is_a_400_never_a_500(client, path, body, message):
    assert_error(client.post(path, content=body), 400, "invalid_request_error", message)


def test_slots_and_answers_stay_valid_json_after_extreme_numbers(client):
    """Large finite values that do fit float32 are accepted and echoed as finite JSON numbers."""
    body = {"prompt": "a", "n_predict": 2, "temperature": 3e38, "presence_penalty": -3e38, "logit_bias": [[5, 3e38]]}
    response = client.post("/completion", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["generation_settings"]["temperature"] > 1e38
    slots = client.get("/slots")
    assert slots.status_code == 200 and all(isinstance(s, dict) for s in slots.json())


# -- defect 4: a request with n > 1 starved -----------------------------------------------------

def test_multi_choice_request_is_not_starved(server, engine):
    """Single-choice requests keep arriving on every slot; an `n: 4` request still starts (its
    place in line reserves the slots that free up) and finishes in bounded time."""
    stop = threading.Event()

    def flood(i: int) -> int:
        done = 0
        with httpx.Client(base_url=server.url, timeout=60) as client:
            while not stop.is_set():  # lengths differ, so slots free up one at a time
                client.post("/completion", json={"prompt": f"flood {i}", "n_predict": 20 + 7 * (i + done) % 30,
                                                  "ignore_eos": True})
                done += 1
        return done

    with ThreadPoolExecutor(12) as pool:
        floods = [pool.submit(flood, i) for i in range(12)]
        time.sleep(0.3)
        start = time.monotonic()
        try:
            with httpx.Client(base_url=server.url, timeout=20) as client:
                body = client.post("/v1/completions", json={"prompt": "all four", "n": 4, "max_tokens": 4,
                                                            "ignore_eos": True}).json()
        finally:
            stop.set()
        waited = time.monotonic() - start
        assert sum(f.result() for f in floods) > 0
    assert len(body["choices"]) == 4
    assert waited < 10, f"the n=4 request waited {waited:.1f} s"
    wait_all_idle(engine)


# -- defect 5: a request the server could never accept -----------------------------------------

@pytest.fixture(scope="module")
def small_queue_server(loaded):
    engine = build_engine(loaded, EngineOptions(n_ctx=1024, n_parallel=4, n_ubatch=64, queue_size=1))
    server = serve(loaded, engine, limits=RequestLimits(max_sequences=32))
    yield server, engine
    server.stop()
    engine.stop()


def test_many_prompts_are_one_queue_entry(small_queue_server):
    server, engine = small_queue_server
    with httpx.Client(base_url=server.url, timeout=60) as client:
        for n_prompts in (6, 30):  # queue size 1, four slots: each prompt counted to 503 before
            many = client.post("/v1/completions", json={"prompt": [f"p{i}" for i in range(n_prompts)], "max_tokens": 2})
            assert many.status_code == 200, many.text
            assert [c["index"] for c in many.json()["choices"]] == list(range(n_prompts))
        thirty_two = client.post("/completion", json={"prompt": ["x"] * 16, "n": 2, "n_predict": 1})
        assert thirty_two.status_code == 200 and len(thirty_two.json()) == 32
        over = client.post("/v1/completions", json={"prompt": ["x"] * 11, "n": 3, "max_tokens": 1})
        assert_error(over, 400, "invalid_request_error",
                     "11 prompts x n=3 make 33 sequences, more than the limit of 32 per request (--max-request-sequences)")
        too_long = client.post("/v1/completions", json={"prompt": ["short", "x " * 300], "max_tokens": 1})
        assert_error(too_long, 400, "exceed_context_size_error", "exceeds the available context size")
    wait_all_idle(engine)
    assert engine.stats["requests"] >= 6 + 16


# -- limits --------------------------------------------------------------------------------------

LIMITS = [
    ({"stop": [f"s{i}" for i in range(33)]}, "Field 'stop': at most 32 stop strings (--max-stop-strings)"),
    ({"stop": ["x" * 257]}, "Field 'stop': a stop string may have at most 256 characters"),
    ({"logit_bias": [[i % 200, 1] for i in range(1025)]}, "Field 'logit_bias': at most 1024 entries (--max-logit-bias)"),
    ({"logit_bias": {"the " * 1100: 1}}, "more than the limit of 1024 (--max-logit-bias)"),
    ({"n_probs": 101}, "Field 'n_probs': must be an integer in [0, 100]"),
    ({"grammar": "root ::= " + '"a" ' * 70000}, "Field 'grammar': at most 262144 bytes (--max-grammar-size)"),
    ({"json_schema": {"enum": ["x" * 300000]}}, "Field 'json_schema': the schema may have at most 262144 bytes"),
    ({"n": 5}, "Field 'n': must be an integer in [1, 4]"),
    ({"seed": 2**40}, "Field 'seed'"),
    ({"n_predict": 2**40}, "Field 'n_predict'"),
]


@pytest.mark.parametrize("extra,message", LIMITS, ids=range(len(LIMITS)))
def test_limits_name_field_and_limit(client, extra, message):
    assert_error(client.post("/completion", json={"prompt": "a", **extra}), 400, "invalid_request_error", message)


def test_chat_top_logprobs_limit(client):
    response = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}],
                                                         "logprobs": True, "top_logprobs": 101})
    assert_error(response, 400, "invalid_request_error", "Field 'top_logprobs': must be an integer in [0, 100]")


def _raw_request(url: str, head: bytes, body: bytes = b"", read_timeout: float = 10) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=read_timeout) as sock:
        sock.sendall(head + body)
        chunks = []
        while True:
            try:
                chunk = sock.recv(65536)
            except (TimeoutError, ConnectionResetError):
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)


def test_body_size_limit(server, client):
    declared = _raw_request(server.url, b"POST /completion HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n"
                                        b"Content-Length: 99999999\r\n\r\n", b"{")
    assert declared.startswith(b"HTTP/1.1 413") and b"--max-body-size" in declared

    def chunks():
        for _ in range(20):
            yield b" " * 2**20  # 20 MiB of whitespace, without a Content-Length
    response = client.post("/completion", content=chunks())
    assert_error(response, 413, "invalid_request_error", "larger than the limit of 16777216 bytes")
    big_but_allowed = client.post("/detokenize", json={"tokens": [100] * 300_000})
    assert big_but_allowed.status_code == 200 and len(big_but_allowed.json()["content"]) == 300_000


# -- slow and lying clients ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def strict_server(loaded, engine):
    server = serve(loaded, engine, timeout=1.5, idle_timeout=0.5)
    yield server
    server.stop()


def test_idle_connections_are_closed(strict_server):
    host, port = strict_server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        start = time.monotonic()
        assert sock.recv(100) == b""  # closed by the server, nothing sent
        assert time.monotonic() - start < 3


def test_slow_and_lying_clients_time_out_without_delaying_others(strict_server):
    head = b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
    body = b'{"prompt": "hi", "n_predict": 2}'

    def trickle() -> bytes:
        host, port = strict_server.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(head % len(body))
            for byte in body[:8]:  # a byte every 0.1 s: still going when the 1.5 s deadline passes
                sock.sendall(bytes([byte]))
                time.sleep(0.1)
            return sock.recv(65536)

    with ThreadPoolExecutor(3) as pool:
        trickled = pool.submit(trickle)
        lying = pool.submit(_raw_request, strict_server.url, head % (len(body) + 50), body)
        slow_head = pool.submit(_raw_request, strict_server.url, b"POST /completion HTTP/1.1\r\nHost:")
        time.sleep(0.2)
        start = time.monotonic()
        with httpx.Client(base_url=strict_server.url, timeout=10) as client:
            for _ in range(3):
                assert client.post("/completion", json={"prompt": "x", "n_predict": 2}).status_code == 200
        assert time.monotonic() - start < 1.0  # nobody waited for the slow clients
        assert trickled.result().startswith(b"HTTP/1.1 408")
        assert lying.result().startswith(b"HTTP/1.1 408")
        assert slow_head.result() == b""  # closed: its head never arrived
    short = _raw_request(strict_server.url, head % 10, body)  # says 10 bytes, sends more
    assert short.startswith(b"HTTP/1.1 400")


# -- odd paths (issue 24): a path no file can have is an unknown path, never a 500 -------------

# An encoded NUL, `..`, bytes that are no UTF-8, a name longer than the OS allows: each reached
# the chat page's file lookup, which raised instead of finding no file.
ODD_PATHS = ["/v1/models%00", "/%00/x", "/%00", "/index.html%00", "/%2e%2e/%2e%2e/etc/passwd", "/%ff",
             "/" + "a" * 300, "/v1/" + "b/" * 3000]


@pytest.fixture(scope="module")
def keyed_server(loaded, engine):
    server = serve(loaded, engine, api_keys=("secret",))
    yield server
    server.stop()


@pytest.mark.parametrize("path", ODD_PATHS, ids=range(len(ODD_PATHS)))
def test_odd_paths_are_unknown_paths(server, keyed_server, path):
    with httpx.Client(timeout=30) as client:
        assert_error(client.get(server.url + path), 404, "not_found_error")
        assert client.head(server.url + path).status_code == 404
        assert_error(client.get(keyed_server.url + path), 401, "authentication_error")
        keyed = client.get(keyed_server.url + path, headers={"Authorization": "Bearer secret"})
        assert_error(keyed, 404, "not_found_error")
        assert client.get(server.url + "/v1/models").status_code == 200


def test_a_nul_in_the_query_string_is_ignored(client):
    assert client.get("/v1/models?x=%00%ff").json()["data"][0]["id"] == "tiny.gguf"
    assert client.get("/health?x=%00").json() == {"status": "ok"}
