"""The server, the command line and the router import torch only for a feature that needs it: in
a fresh interpreter whose imports of torch raise, lamplight.server, lamplight.cli, the serve
flags and the router import, `lamplight serve`'s application is built and answers while no model
is loaded, the serve path loads a model on the native kernels with -t's threads, and `lamplight
serve` itself answers a completion on them. Where torch is imported later (a PyTorch backend,
the vision encoder, an embedding encoder), it gets the thread count -t asked for, or the one
thread the native runner leaves it."""

from __future__ import annotations

import os

import pytest
from no_torch import native_library, printed, run_script, run_without_torch  # noqa: F401 (native_library: a fixture)
from tiny_gguf import write_tiny_llama

from lamplight.native.threads import default_threads

# Every module a server or a router process imports before a model is loaded.
SERVER_MODULES = ["lamplight.server", "lamplight.server.app", "lamplight.server.launcher", "lamplight.server.memory",
                  "lamplight.server.media_sources", "lamplight.cli", "lamplight.serve_flags",
                  "lamplight.serve_options", "lamplight.router", "lamplight.router.launch", "lamplight.embeddings",
                  "lamplight.threads"]

# `lamplight serve -t 3` up to the point where it loads the model: its settings, its application
# (create_app through uvicorn's Config, as launcher.serve builds it), answering 503 until a model
# is attached.
BUILD_THE_SERVER = """
import importlib
for module in {modules!r}:
    importlib.import_module(module)

from starlette.testclient import TestClient

from lamplight.cli import build_parser, engine_options, server_settings
from lamplight.server import ServerState
from lamplight.server.launcher import uvicorn_server
from lamplight.threads import request_threads, requested_threads

args = build_parser().parse_args(["serve", "-m", "model.gguf", "-t", "3", "--port", "0"])
request_threads(args.threads)
engine_options(args)
state = ServerState(server_settings(args))
with TestClient(uvicorn_server(state).config.app) as client:
    print("HEALTH", client.get("/health").status_code)
    print("EMBEDDINGS", client.post("/v1/embeddings", json={{"input": "hi"}}).status_code)
print("THREADS", requested_threads())
try:
    import torch  # the guard must refuse it here, or this test proves nothing
except ImportError:
    print("TORCH refused")
"""


def test_the_server_and_its_command_line_import_no_torch():
    out = run_without_torch(BUILD_THE_SERVER.format(modules=SERVER_MODULES))
    assert out.returncode == 0, out.stderr
    assert printed(out) == {"HEALTH": "503", "EMBEDDINGS": "503", "THREADS": "3", "TORCH": "refused"}, out.stdout


def test_the_serve_path_loads_on_native_threads_as_asked(native_library, tmp_path):
    """launcher.load_model, as `lamplight serve -t N` calls it: no torch, and the native pool on
    N threads (a count other than its default, so that the default cannot pass for it)."""
    path = write_tiny_llama(tmp_path / "tiny.gguf")
    script = f"""
from lamplight.native.threads import default_threads
from lamplight.server.launcher import EngineOptions, load_model
from lamplight.threads import request_threads

request_threads(default_threads() + 1)
loaded = load_model({str(path)!r}, EngineOptions())
assert "torch" not in sys.modules
print("ASKED", default_threads() + 1)
print("THREADS", loaded.runner.threads)
print("KERNELS", loaded.kernels)
print("MEDIA", loaded.media, loaded.draft)
"""
    out = run_without_torch(script)
    assert out.returncode == 0, out.stderr
    lines = printed(out)
    assert lines["THREADS"] == lines["ASKED"] and f"; {lines['ASKED']} threads" in lines["KERNELS"], out.stdout
    assert lines["MEDIA"] == "None None"


# Run without the guard: torch imports, after the thread count was set without it.
TORCH_GETS_THE_COUNT = """
from lamplight.threads import request_threads, set_torch_threads

request_threads({asked})
{then}
assert "torch" not in sys.modules
import torch
print("THREADS", torch.get_num_threads())
print("LOADER", type(torch.__spec__.loader).__name__, torch.__loader__ is torch.__spec__.loader)
set_torch_threads(2)  # with torch imported: at once
print("AFTER", torch.get_num_threads())
"""


@pytest.mark.parametrize("then, want", [("", 3), ("set_torch_threads(1)  # dedicate_threads_to_native", 1)])
def test_torch_imported_later_gets_the_thread_count(then, want):
    script = TORCH_GETS_THE_COUNT.format(asked=3, then=then)
    out = run_script(script, guarded=False)
    assert out.returncode == 0, out.stderr
    lines = printed(out)
    assert lines["THREADS"] == str(want), out.stdout
    assert lines["LOADER"] == "SourceFileLoader True"  # torch's own loader, not the hook's
    assert lines["AFTER"] == "2"


# `lamplight serve` in the guarded interpreter's main thread, as the command runs it; a client
# thread waits for /health, asks for a completion, and stops the server with Ctrl-C's signal.
SERVE_AND_ASK = """
import os, signal, threading, time

import httpx

from lamplight.cli import main

def ask():
    try:
        with httpx.Client(transport=httpx.HTTPTransport(uds={sock!r}), base_url="http://lamplight", timeout=60) as c:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                try:
                    if c.get("/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.05)
            reply = c.post("/completion", json={{"prompt": "hi", "n_predict": 4, "temperature": 0}})
            print("COMPLETION", reply.status_code, reply.json().get("tokens_predicted"))
    finally:
        os.kill(os.getpid(), signal.SIGINT)

threading.Thread(target=ask, daemon=True).start()
print("STATUS", main(["serve", "-m", {model!r}, "--host", {sock!r}, "-c", "512", "-t", "{threads}"]))
print("TORCH", "torch" in sys.modules)
"""


def test_lamplight_serve_answers_a_completion_without_torch(native_library, tmp_path):
    """The whole command on the tiny llama: load, engine, HTTP, a completion, Ctrl-C; -t one more
    than the native pool's default, which its kernels line shows."""
    model = write_tiny_llama(tmp_path / "tiny.gguf")
    sock = f"/tmp/lamplight-torch-free-{os.getpid()}.sock"  # short: a socket's path has a small limit
    threads = default_threads() + 1
    out = run_without_torch(SERVE_AND_ASK.format(model=str(model), sock=sock, threads=threads))
    assert out.returncode == 0, out.stderr
    lines = printed(out)
    assert lines.get("COMPLETION") == "200 4" and lines.get("STATUS") == "0", out.stdout + out.stderr
    assert lines["TORCH"] == "False" and not os.path.exists(sock)
    assert "kernels: native" in out.stderr and f"; {threads} threads" in out.stderr, out.stderr
