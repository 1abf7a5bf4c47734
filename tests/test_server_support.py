"""Helpers for the server tests (no tests here): run the real app with uvicorn in a thread,
parse SSE bodies, and a scripted stand-in for the engine."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from typing import Any

import uvicorn

import contextlib

import httpx

from lamplight.server import ServerSettings, ServerState, create_app
from lamplight.server.launcher import connection_options


class ServerThread:
    """The app on 127.0.0.1 and a free port, served by uvicorn in a background thread."""

    def __init__(self, state: ServerState):
        self.state = state
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        config = uvicorn.Config(create_app(state), log_level="warning", server_header=False,
                                **connection_options(state.settings))
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "ServerThread":
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@contextlib.contextmanager
def tiny_served(folder, **settings):
    """(server, engine) on a tiny random llama model, with metrics on (fuzz, soak, reliability)."""
    import lamplight
    from lamplight.server.launcher import EngineOptions, build_engine
    from tiny_gguf import write_tiny_llama

    loaded = lamplight.load(str(write_tiny_llama(folder / "tiny.gguf")))
    engine = build_engine(loaded, EngineOptions(n_ctx=1024, n_parallel=4, n_ubatch=64))
    server = serve(loaded, engine, ServerSettings(metrics=True, **settings))
    try:
        yield server, engine
    finally:
        server.stop()
        engine.stop()


def wait_all_idle(engine, timeout: float = 30) -> None:
    """Until every slot is idle and nothing waits or runs (AssertionError after `timeout`)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(s.is_idle for s in engine.slots) and not engine.waiting and not engine.active:
            return
        time.sleep(0.02)
    raise AssertionError(f"slots still busy: {engine.slots_json()}")


def serve(loaded, engine, settings: ServerSettings | None = None) -> ServerThread:
    """A started server for an already loaded model and engine."""
    state = ServerState(settings or ServerSettings())
    state.attach(loaded, engine)
    return ServerThread(state).start()


@contextlib.contextmanager
def model_server(path, *, fast: bool = False, n_ctx: int = 2048, n_parallel: int = 4, **engine_options):
    """Load a GGUF, start its engine and a server; stop both afterwards. Yields (server, loaded)."""
    from lamplight.server.launcher import EngineOptions, build_engine, load_model

    options = EngineOptions(n_ctx=n_ctx, n_parallel=n_parallel, weights="fast" if fast else "reference", **engine_options)
    loaded = load_model(str(path), options)
    engine = build_engine(loaded, options)
    server = serve(loaded, engine)
    try:
        yield server, loaded
    finally:
        server.stop()
        engine.stop()


def assert_error(response: httpx.Response, code: int, type_: str, message_part: str = "") -> dict:
    """The response is an error in llama-server's shape with this code, type and message part."""
    assert response.status_code == code, response.text
    error = response.json()["error"]
    assert error["code"] == code and error["type"] == type_, error
    assert message_part in error["message"], error
    return error


def sse_events(text: str) -> list[Any]:
    """The `data:` payloads of an SSE body, JSON-decoded ("[DONE]" kept as the string)."""
    events = []
    for block in text.split("\n\n"):
        for line in block.split("\n"):
            if line.startswith("data: "):
                payload = line[len("data: "):]
                events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


class ScriptedHandle:
    """Plays a script of engine events; a float is a pause, "hang" waits until cancelled."""

    def __init__(self, script: list):
        self.script = script
        self.cancelled = threading.Event()

    async def events(self):
        for step in self.script:
            if step == "hang":
                while not self.cancelled.is_set():
                    await asyncio.sleep(0.01)
                return
            if isinstance(step, (int, float)):
                await asyncio.sleep(step)
            else:
                yield step

    def cancel(self) -> None:
        self.cancelled.set()


class ScriptedEngine:
    """Engine stand-in: `script` is what the next submit plays; `submit_error` is raised instead."""

    n_parallel = 2
    n_ctx_slot = 256
    is_ready = True

    def __init__(self):
        self.script: list = []
        self.submit_error: Exception | None = None
        self.handles: list[ScriptedHandle] = []
        self.requests: list = []

    def submit(self, request):
        if self.submit_error is not None:
            raise self.submit_error
        self.requests.append(request)
        handle = ScriptedHandle(list(self.script))
        self.handles.append(handle)
        return handle

    def slots_json(self) -> list[dict]:
        return [{"id": i, "n_ctx": self.n_ctx_slot, "is_processing": True} for i in range(self.n_parallel)]

    def stop(self) -> None:
        pass
