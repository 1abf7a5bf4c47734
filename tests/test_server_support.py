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

from lamplight.server import ServerState, create_app


class ServerThread:
    """The app on 127.0.0.1 and a free port, served by uvicorn in a background thread."""

    def __init__(self, state: ServerState):
        self.state = state
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        config = uvicorn.Config(create_app(state), log_level="warning", server_header=False)
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
