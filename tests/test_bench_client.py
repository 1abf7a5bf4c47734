"""The benchmark load generator, measured against fake servers whose speed we control.

The fakes sleep for configured delays, so the benchmark's figures must land near them. Bands
are wide on purpose: the delays are lower bounds, and a loaded CI machine only adds time.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import socket
import threading
import time
from dataclasses import dataclass

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from lamplight.bench import add_arguments, main
from lamplight.bench.client import find_context_size
from lamplight.bench.progress import Progress
from lamplight.bench.prompts import PromptFactory


@dataclass
class FakeSpec:
    first_token_delay: float = 0.01
    # Prefill time per prompt word not covered by the one-slot prefix cache.
    per_prompt_token_delay: float = 0.0001
    per_token_delay: float = 0.008
    n_ctx: int = 4096
    honour_ignore_eos: bool = True
    tokens_per_chunk: int = 1
    fail_status: int | None = None
    # Generation requests served before the fake starts failing (None: never).
    fail_after: int | None = None
    # Prompts the prefix cache remembers (a server's slots); a request reuses the best match.
    cache_slots: int = 1
    # Sent as X-Lamplight-Replica, as lamplight's replicas do.
    replica: str | None = None
    # /props model_path, as llama-server and lamplight report it (the roofline reads the file).
    model_path: str | None = None

    @property
    def decode_tps(self) -> float:
        return 1 / self.per_token_delay


def _sse(data: dict) -> str:
    return f"data: {json.dumps(data)}\n\n"


def make_fake_app(spec: FakeSpec) -> FastAPI:
    app = FastAPI()
    cache: list[list[str]] = []
    served = {"requests": 0}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": "fake-model", "object": "model"}]}

    @app.get("/props")
    async def props():
        props = {"default_generation_settings": {"n_ctx": spec.n_ctx}}
        return {**props, "model_path": spec.model_path} if spec.model_path else props

    @app.post("/tokenize")
    async def tokenize(request: Request):
        words = (await request.json())["content"].split()
        return {"tokens": list(range(len(words)))}

    async def generate(request: Request, chat: bool):
        served["requests"] += 1
        if spec.fail_status and served["requests"] > (spec.fail_after or 0):
            return JSONResponse({"error": {"message": "fake failure"}}, spec.fail_status)
        body = await request.json()
        text = (" ".join(m["content"] for m in body["messages"]) if chat else body["prompt"])
        n_tokens = body["max_tokens"]
        if not (spec.honour_ignore_eos and body.get("ignore_eos")):
            n_tokens = min(n_tokens, 5)
        headers = {"x-lamplight-replica": spec.replica} if spec.replica else None
        return StreamingResponse(stream(text.split(), n_tokens, body, chat),
                                 media_type="text/event-stream", headers=headers)

    async def stream(words: list[str], n_tokens: int, body: dict, chat: bool):
        cached = max((_common_prefix(old, words) for old in cache), default=0)
        cache.insert(0, words)
        del cache[spec.cache_slots:]
        prefill_s = spec.per_prompt_token_delay * (len(words) - cached)
        await asyncio.sleep(spec.first_token_delay + prefill_s)
        for sent in range(0, n_tokens, spec.tokens_per_chunk):
            if sent:
                await asyncio.sleep(spec.per_token_delay * spec.tokens_per_chunk)
            piece = " tok" * min(spec.tokens_per_chunk, n_tokens - sent)
            choice = {"delta": {"content": piece}} if chat else {"text": piece}
            choice["index"] = 0
            yield _sse({"choices": [{**choice, "finish_reason": None}]})
        yield _sse({"choices": [{"index": 0, "text": "", "delta": {}, "finish_reason": "length"}]})
        if (body.get("stream_options") or {}).get("include_usage"):
            yield _sse({"choices": [], "usage": {"prompt_tokens": len(words), "completion_tokens": n_tokens,
                                                 "prompt_tokens_details": {"cached_tokens": cached}}})
        yield "data: [DONE]\n\n"

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await generate(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await generate(request, chat=True)

    return app


def _common_prefix(a: list[str], b: list[str]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


class AppThread:
    """An ASGI app on a free loopback port, served from a thread (`with`: started, then stopped)."""

    def __init__(self, app):
        # IPPROTO_TCP explicitly: asyncio only sets TCP_NODELAY on sockets created with it,
        # and Nagle's algorithm would add 40 ms stalls to the fake's responses.
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        config = uvicorn.Config(app, log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "fake server did not start"
            time.sleep(0.01)
        return self

    def __exit__(self, *exc_info) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=5)
        self.sock.close()


class FakeServer(AppThread):
    """A fake OpenAI-compatible server (make_fake_app) on a free loopback port."""

    def __init__(self, spec: FakeSpec):
        self.spec = spec
        super().__init__(make_fake_app(spec))


@pytest.fixture(scope="module")
def fast_server():
    with FakeServer(FakeSpec()) as server:
        yield server


@pytest.fixture(scope="module")
def slow_server():
    with FakeServer(FakeSpec(first_token_delay=0.06, per_token_delay=0.016)) as server:
        yield server


def run_bench(tmp_path, *args: str, seed: int = 7) -> tuple[int, dict | None]:
    out = tmp_path / "bench.json"
    code = main([*args, "--quick", "--no-progress", "--seed", str(seed), "--json", str(out)])
    return code, (json.loads(out.read_text()) if out.exists() else None)


def metric(report: dict, scenario: str, name_start: str) -> dict:
    rows = [r for r in report["summary"]
            if r["scenario"] == scenario and r["metric"].startswith(name_start)]
    assert len(rows) == 1, (scenario, name_start, [r["metric"] for r in report["summary"]])
    return rows[0]


def test_quick_run_measures_the_fake_servers_delays(fast_server, tmp_path, capsys):
    code, report = run_bench(tmp_path, "--url", fast_server.url)
    assert code == 0, capsys.readouterr().err
    spec = fast_server.spec

    decode = metric(report, "decode", "decode speed")["values"]["A"]
    assert 0.3 * spec.decode_tps < decode < 1.5 * spec.decode_tps

    ttft = {n: metric(report, "ttft", f"TTFT, {n}-token")["values"]["A"] for n in (16, 512, 2048)}
    assert ttft[16] < ttft[2048]
    # 2048 uncached prompt words cost at least 0.2 s of fake prefill.
    assert ttft[2048] >= 1000 * (spec.first_token_delay + 2048 * spec.per_prompt_token_delay)

    assert _concurrency_gain(report) > 1.5 or _concurrency_gain(run_bench(
        tmp_path, "--url", fast_server.url, "--scenarios", "concurrency")[1]) > 1.5, \
        "4 requests in flight should outpace one (measured twice: a loaded CI machine can stall one run)"

    assert metric(report, "prefix", "prefix cache speedup")["values"]["A"] > 1.5
    assert report["errors"] == 0 and report["warnings"] == []
    stdout = capsys.readouterr().out
    assert "decode speed, single stream" in stdout and "TTFT, 2048-token prompt" in stdout


def _concurrency_gain(report: dict) -> float:
    single = metric(report, "concurrency", "output speed, 1 in flight")["values"]["A"]
    return metric(report, "concurrency", "output speed, 4 in flight")["values"]["A"] / single


def test_json_holds_raw_requests_and_summaries(fast_server, tmp_path):
    code, report = run_bench(tmp_path, "--url", fast_server.url, "--scenarios", "decode,ttft",
                             "--ttft-lengths", "16,64")
    assert code == 0
    assert report["format"] == "lamplight.bench" and report["version"] == 1
    assert report["servers"]["A"]["model"] == "fake-model"
    assert report["servers"]["A"]["n_ctx"] == 4096 and report["servers"]["A"]["tokenize"]
    assert [s["name"] for s in report["scenarios"]] == ["decode", "ttft"]
    decode = report["scenarios"][0]
    assert len(decode["requests"]) == 2
    for request in decode["requests"]:
        assert request["server"] == "A" and request["error"] is None
        assert request["output_tokens"] == request["max_tokens"] == 32
        assert request["ttft_s"] < request["total_s"]
        assert request["usage_completion_tokens"] == 32 and not request["short"]
        assert request["prompt_counted_tokens"] == request["prompt_target_tokens"] == 32
    ttft = report["scenarios"][1]
    assert sorted(r["prompt_length"] for r in ttft["requests"]) == [16, 64]
    assert {"metric", "unit", "values", "higher_is_better", "ratio_a_over_b"} <= set(
        report["summary"][0])


def test_compare_interleaves_and_ratios_favour_the_faster_server(
        fast_server, slow_server, tmp_path, capsys):
    code, report = run_bench(tmp_path, "--url", fast_server.url, "--compare", slow_server.url,
                             "--scenarios", "decode,ttft,concurrency", "--concurrency", "1,4",
                             "--ttft-lengths", "16,512")
    assert code == 0, capsys.readouterr().err
    decode_requests = report["scenarios"][0]["requests"]
    assert [r["server"] for r in decode_requests] == ["A", "B", "A", "B"]

    decode = metric(report, "decode", "decode speed")
    expected = fast_server.spec.decode_tps / slow_server.spec.decode_tps  # 2.0
    assert expected / 2 < decode["ratio_a_over_b"] < expected * 2
    assert decode["better"] == "A" and decode["higher_is_better"]

    ttft = metric(report, "ttft", "TTFT, 16-token")
    assert ttft["ratio_a_over_b"] < 1 and ttft["better"] == "A" and not ttft["higher_is_better"]
    assert metric(report, "concurrency", "output speed, 4 in flight")["better"] == "A"

    table = capsys.readouterr().out
    assert "A/B" in table and fast_server.url in table and slow_server.url in table


def test_conversations_report_cache_reuse_and_replica_affinity_per_turn(tmp_path, capsys):
    with FakeServer(FakeSpec(cache_slots=4, replica="r1")) as roomy, FakeServer(FakeSpec()) as one_slot, \
            FakeServer(FakeSpec(cache_slots=4)) as third:
        code, report = run_bench(tmp_path, "--url", roomy.url, "--compare", one_slot.url, "--compare", third.url,
                                 "--scenarios", "conversation")
    assert code == 0, capsys.readouterr().err
    requests = report["scenarios"][0]["requests"]
    assert len(requests) == 3 * 3 * 3 and {r["server"] for r in requests} == {"A", "B", "C"}
    # Turn k of every conversation on A, then on B, then on C, then turn k + 1.
    assert [r["server"] for r in requests[:9]] == ["A"] * 3 + ["B"] * 3 + ["C"] * 3
    for label in "ABC":
        for conversation in range(3):
            turns = sorted((r for r in requests if r["server"] == label and r["conversation"] == conversation),
                           key=lambda r: r["turn"])
            prompts = [r["usage_prompt_tokens"] for r in turns]
            # Each turn repeats the last one, its reply (8 tokens) and a new user message.
            assert prompts[0] < prompts[0] + 8 < prompts[1] < prompts[2], prompts
    share = metric(report, "conversation", "prompt tokens from the cache")["values"]
    # Four remembered prompts hold all three conversations; one holds only the shared system prompt.
    assert share["A"] > 80 and share["C"] > 80 and share["B"] < share["A"]
    assert metric(report, "conversation", "cached prompt tokens, turn 3")["values"]["A"] > \
        metric(report, "conversation", "cached prompt tokens, turn 2")["values"]["A"]
    affinity = metric(report, "conversation", "turns on the previous turn's replica")["values"]
    assert affinity == {"A": 100.0, "B": None, "C": None}
    table = capsys.readouterr().out
    assert "TTFT, turn 3" in table and third.url in table and "A/B" not in table


def test_conversations_shorten_the_system_prompt_to_fit_the_context(tmp_path):
    with FakeServer(FakeSpec(n_ctx=500, cache_slots=4)) as server:
        code, report = run_bench(tmp_path, "--url", server.url, "--scenarios", "conversation")
    assert code == 0
    scenario = report["scenarios"][0]
    assert scenario["params"]["system_tokens"] < 256 and "shortened" in scenario["notes"][0]
    assert max(r["usage_prompt_tokens"] for r in scenario["requests"]) + 8 <= 500


def test_short_outputs_are_detected_and_reported(tmp_path, capsys):
    with FakeServer(FakeSpec(honour_ignore_eos=False)) as server:
        code, report = run_bench(tmp_path, "--url", server.url, "--scenarios", "decode")
    assert code == 0
    assert all(r["short"] and r["output_tokens"] == 5 for r in report["scenarios"][0]["requests"])
    assert any("ignore_eos" in w for w in report["warnings"])
    assert "ignore_eos" in capsys.readouterr().err


def test_usage_count_is_preferred_over_chunk_count(tmp_path):
    with FakeServer(FakeSpec(tokens_per_chunk=2)) as server:
        code, report = run_bench(tmp_path, "--url", server.url, "--scenarios", "decode")
    assert code == 0
    for request in report["scenarios"][0]["requests"]:
        assert request["content_chunks"] == 16 and request["output_tokens"] == 32


def test_chat_api(fast_server, tmp_path):
    # A seed of its own: the fake's prefix cache must not remember an earlier test's prompts.
    code, report = run_bench(tmp_path, "--url", fast_server.url, "--api", "chat",
                             "--scenarios", "prefix", seed=8)
    assert code == 0
    assert metric(report, "prefix", "prefix cache speedup")["values"]["A"] > 1.5


def test_prompt_lengths_beyond_the_context_are_skipped(tmp_path):
    with FakeServer(FakeSpec(n_ctx=1024)) as server:
        code, report = run_bench(tmp_path, "--url", server.url, "--scenarios", "ttft", "prefix",
                                 "--ttft-lengths", "16,2048")
    assert code == 0
    assert metric(report, "ttft", "TTFT, 2048-token")["values"]["A"] is None
    assert metric(report, "ttft", "TTFT, 16-token")["values"]["A"] is not None
    assert any("2048-token prompt skipped" in w for w in report["warnings"])
    prefix = report["scenarios"][1]
    assert all(r["prompt_counted_tokens"] + r["max_tokens"] <= 1024 for r in prefix["requests"])


def test_dead_url_exits_cleanly(tmp_path, capsys):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead_url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    code, report = run_bench(tmp_path, "--url", dead_url)
    err = capsys.readouterr().err
    assert code == 1 and report is None
    assert "cannot connect" in err and dead_url in err and "Traceback" not in err


def test_server_errors_exit_cleanly(tmp_path, capsys):
    with FakeServer(FakeSpec(fail_status=500)) as server:
        code, _ = run_bench(tmp_path, "--url", server.url)
    err = capsys.readouterr().err
    assert code == 1 and "HTTP 500" in err and "fake failure" in err and "Traceback" not in err


def test_failures_mid_run_still_write_the_report_and_exit_nonzero(tmp_path, capsys):
    # The warm-up and the first decode request succeed, the second one fails.
    with FakeServer(FakeSpec(fail_status=503, fail_after=2)) as server:
        code, report = run_bench(tmp_path, "--url", server.url, "--scenarios", "decode")
    err = capsys.readouterr().err
    assert code == 1 and "1 requests failed" in err and "Traceback" not in err
    errors = [r["error"] for r in report["scenarios"][0]["requests"]]
    assert errors[0] is None and "HTTP 503" in errors[1]
    assert report["errors"] == 1
    assert metric(report, "decode", "decode speed")["samples"]["A"] == 1


def test_progress_redraws_one_line():
    stream = io.StringIO()
    progress = Progress(stream, live=True)
    progress.start("decode", 2)
    progress.tick()
    progress.tick(failed=True)
    progress.finish()
    text = stream.getvalue()
    assert text.count("\n") == 1 and "\r" in text and "2/2 requests, 1 failed" in text


def test_prompts_are_deterministic_calibrated_and_distinct():
    async def counter(text: str) -> int:  # a tokenizer with 1.5 tokens per word
        return round(len(text.split()) * 1.5)

    async def build(seed: int):
        factory = PromptFactory(seed, counter)
        await factory.calibrate()
        return [await factory.prompt(512, key) for key in ("a", "b")]

    first, again, other_seed = (asyncio.run(build(seed)) for seed in (1, 1, 2))
    assert first == again and first != other_seed
    assert all(abs(p.counted_tokens - 512) <= 2 for p in first)
    assert first[0].user.split()[:3] != first[1].user.split()[:3]


def test_context_size_sources():
    assert find_context_size({"default_generation_settings": {"n_ctx": 2048}}, None) == (
        2048, "/props default_generation_settings.n_ctx")
    models = {"data": [{"id": "m", "max_model_len": 8192}]}
    assert find_context_size(None, models)[0] == 8192
    assert find_context_size({}, {"data": [{"id": "m", "meta": {"n_ctx_train": 4096}}]})[0] == 4096
    assert find_context_size(None, None) == (None, None)


def test_mounts_as_a_subcommand():
    parser = argparse.ArgumentParser(prog="lamplight")
    bench = add_arguments(parser.add_subparsers(dest="command").add_parser("bench"))
    args = parser.parse_args(["bench", "--url", "http://127.0.0.1:9", "--scenarios", "decode"])
    assert bench.prog.endswith("bench") and args.scenarios == [["decode"]]
    assert callable(args.bench_main)


def test_set_overrides_any_scenario_size(tmp_path, capsys):
    """--set FIELD=VALUE: one conversation of 3 turns with a 100-token system prompt."""
    with FakeServer(FakeSpec(cache_slots=4)) as server:
        code, report = run_bench(tmp_path, "--url", server.url, "--scenarios", "conversation", "--set",
                                 "conversation_count=1", "--set", "conversation_turns=3",
                                 "--set", "conversation_system_tokens=100")
    assert code == 0
    scenario = report["scenarios"][0]
    assert (scenario["params"]["conversations"], scenario["params"]["turns"], scenario["params"]["system_tokens"]) == (1, 3, 100)
    assert sorted(r["turn"] for r in scenario["requests"]) == [0, 1, 2]
    for bad in ("conversation_count=0", "no_such_field=1", "ttft_lengths=a,b", "conversation_turns"):
        with pytest.raises(SystemExit):
            main(["--url", server.url, "--set", bad])
        assert "--set" in capsys.readouterr().err


class ClosingServer:
    """A raw HTTP server that closes its first `drops` connections after reading the request,
    without a byte of answer (a server closing a kept-alive connection as the client reuses
    it), then answers each request with a one-token SSE stream."""

    def __init__(self, drops: int):
        self.drops, self.connections = drops, 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                self.connections += 1
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head, _, body = data.partition(b"\r\n\r\n")
                length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                                  if line.lower().startswith(b"content-length")))
                while len(body) < length:
                    body += conn.recv(65536)
                if self.connections <= self.drops:
                    continue
                events = (_sse({"choices": [{"index": 0, "text": " tok", "finish_reason": "length"}]})
                          + "data: [DONE]\n\n")
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n"
                             b"content-length: %d\r\n\r\n%s" % (len(events), events.encode()))

    def close(self):
        self.sock.close()


@pytest.mark.parametrize("drops, fails", [(1, False), (2, True)])
def test_a_connection_closed_before_any_answer_is_retried_once(drops, fails):
    from lamplight.bench.client import ServerClient
    from lamplight.bench.prompts import Prompt

    server = ClosingServer(drops)

    async def one_request():
        async with ServerClient(server.url, model="m") as client:
            return await client.stream(Prompt(user="hello there"), 4)

    try:
        result = asyncio.run(one_request())
    finally:
        server.close()
    assert server.connections == 2  # one retry, never more
    if fails:
        assert "RemoteProtocolError" in result.error
    else:
        assert result.error is None and result.text == " tok" and result.finish_reason == "length"
