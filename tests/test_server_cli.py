"""`lamplight serve` / `pull` / `bench` wiring, and start-up: /health is 503 while the model loads."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest
from tiny_gguf import write_tiny_llama

from lamplight.cli import build_parser, engine_options, main
from lamplight.server import ServerSettings, ServerState
from lamplight.server.launcher import serve, uvicorn_server


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_status(url: str, status: int, seconds: float = 60) -> httpx.Response:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            response = httpx.get(url, timeout=2)
            if response.status_code == status:
                return response
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"{url} never answered {status}")


def test_serve_flags_use_llama_server_names():
    args = build_parser().parse_args([
        "serve", "-m", "m.gguf", "-c", "512", "-np", "2", "-b", "256", "-ub", "64", "-n", "16", "-a", "mine",
        "--api-key", "a,b", "-t", "2", "--seed", "7", "--temp", "0.5", "--top-k", "10", "--top-p", "0.9",
        "--min-p", "0.1", "--queue-size", "3", "--no-slots", "--cors-origins", "http://x", "--metrics",
        "--context-shift", "-to", "30", "--chat-template", "chatml", "-ctk", "f16", "-ctv", "bf16", "--compile"])
    assert (args.model, args.ctx_size, args.parallel, args.batch_size, args.ubatch_size) == ("m.gguf", 512, 2, 256, 64)
    assert (args.n_predict, args.alias, args.api_key, args.threads, args.seed) == (16, "mine", "a,b", 2, 7)
    assert (args.temp, args.top_k, args.top_p, args.min_p, args.queue_size) == (0.5, 10, 0.9, 0.1, 3)
    assert not args.slots_endpoint and args.metrics and args.context_shift and args.timeout == 30
    assert (args.cache_type_k, args.cache_type_v) == ("f16", "bf16") and args.compile
    options = engine_options(args)
    assert (options.cache_type_k, options.cache_type_v, options.compile) == ("f16", "bf16", True)
    defaults = build_parser().parse_args(["serve"])
    assert (defaults.model, defaults.host, defaults.port, defaults.parallel) == ("smollm2-135m-instruct", "127.0.0.1", 8080, -1)


def test_bench_and_pull_are_mounted(capsys):
    assert build_parser().parse_args(["bench", "--quick"]).quick is True
    assert main(["pull", "no-such-model"]) == 1
    assert "unknown model alias" in capsys.readouterr().err


def test_health_is_503_until_the_model_has_loaded():
    state = ServerState(ServerSettings(port=free_port()))
    server = uvicorn_server(state)
    release = threading.Event()

    class FakeEngine:
        is_ready = True

        def stop(self):
            pass

    def slow_load():
        release.wait(30)
        return object(), FakeEngine()

    result = []
    thread = threading.Thread(target=lambda: result.append(serve(state, slow_load, server)), daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{state.settings.port}/health"
    loading = wait_for_status(url, 503)
    assert loading.json()["error"] == {"code": 503, "message": "Loading model", "type": "unavailable_error"}
    release.set()
    assert wait_for_status(url, 200).json() == {"status": "ok"}
    server.should_exit = True
    thread.join(10)
    assert result == [0]


def test_a_model_that_fails_to_load_stops_the_server(capsys):
    state = ServerState(ServerSettings(port=free_port()))

    def broken_load():
        raise FileNotFoundError("no such model")

    assert serve(state, broken_load, uvicorn_server(state)) == 1
    assert "failed to load the model: no such model" in capsys.readouterr().err


def test_lamplight_serve_command(tmp_path):
    model = write_tiny_llama(tmp_path / "tiny.gguf")
    port = free_port()
    command = [sys.executable, "-m", "lamplight.cli", "serve", "-m", str(model), "--port", str(port),
               "-c", "512", "-np", "2", "-a", "tiny-alias", "--api-key", "k", "-t", "1"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        wait_for_status(f"http://127.0.0.1:{port}/health", 200)
        headers = {"Authorization": "Bearer k"}
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models", headers=headers).json()
        assert models["data"][0]["id"] == "tiny-alias" and models["data"][0]["meta"]["n_ctx"] == 256
        body = httpx.post(f"http://127.0.0.1:{port}/completion", headers=headers,
                          json={"prompt": "hi", "n_predict": 2}, timeout=30).json()
        assert body["model"] == "tiny-alias" and body["tokens_evaluated"] == 2
    finally:
        process.send_signal(signal.SIGINT)
        try:
            _, err = process.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            pytest.fail("lamplight serve did not stop on SIGINT")
    assert process.returncode == 0, err
    assert "ready" in err
