"""A local stand-in for the part of the Hugging Face Hub's HTTP API that huggingface_hub uses to
find and download files (point HF_ENDPOINT at it): model info with file sizes and LFS sha256s,
HEAD/GET of `resolve/` URLs with ETags, commits and byte ranges, and the Hub's error headers
(`X-Error-Code`) for a missing repo, a missing file and a gated repo. It can also misbehave: cut
transfers off, stall them mid-way until released (for Ctrl-C), ignore Range requests, serve
corrupt bytes."""

from __future__ import annotations

import hashlib
import json
import re
import select
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class FakeRepo:
    files: dict[str, bytes]
    gated_token: str | None = None  # set: only `Authorization: Bearer <token>` gets in
    corrupt: set[str] = field(default_factory=set)  # served bytes differ from the reported sha256
    # GETs of a file, in turn, send at most these many body bytes and drop the connection; then whole
    cut_after: dict[str, list[int]] = field(default_factory=dict)
    # GETs of a file send no byte past offset N and stall there until hub.release is set (or the
    # client hangs up), then drop the connection
    hold_after: dict[str, int] = field(default_factory=dict)
    ignore_range: bool = False  # answer Range requests with 200 and the whole file


class FakeHub:
    def __init__(self, repos: dict[str, FakeRepo]):
        self.repos = repos
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Range header)
        self.holding = threading.Event()  # set once a transfer stalls at its hold_after offset
        self.release = threading.Event()  # ends the stalls (hold_after) and serves files whole from then on
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                hub._handle(self, body=True)

            def do_HEAD(self):
                hub._handle(self, body=False)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "FakeHub":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()

    def _handle(self, handler: BaseHTTPRequestHandler, body: bool) -> None:
        path = unquote(urlparse(handler.path).path)
        self.requests.append((handler.command, path, handler.headers.get("Range")))
        info = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/[^/]+)?", path)
        resolve = re.fullmatch(r"/([^/]+/[^/]+)/resolve/[^/]+/(.+)", path)
        repo_id = (info or resolve).group(1) if (info or resolve) else None
        repo = self.repos.get(repo_id)
        if repo is None:
            return _error(handler, 401, "RepoNotFound", "Repository not found")
        if repo.gated_token and handler.headers.get("Authorization") != f"Bearer {repo.gated_token}":
            return _error(handler, 401, "GatedRepo", "Access to this model is restricted")
        if info:
            return _send(handler, 200, json.dumps(_model_info(repo_id, repo)).encode(), "application/json", body)
        name = resolve.group(2)
        if name not in repo.files:
            return _error(handler, 404, "EntryNotFound", "Entry not found")
        self._send_file(handler, repo, name, body)

    def _send_file(self, handler, repo: FakeRepo, name: str, body: bool) -> None:
        data = repo.files[name]
        sha = hashlib.sha256(data).hexdigest()
        served = bytes(reversed(data)) if name in repo.corrupt else data
        match = re.fullmatch(r"bytes=(\d+)-", handler.headers.get("Range") or "")
        ranged = bool(match) and not repo.ignore_range
        start = int(match.group(1)) if ranged else 0
        if start and start >= len(served):
            handler.send_response(416)
            handler.send_header("Content-Range", f"bytes */{len(served)}")
            handler.send_header("Content-Length", "0")
            handler.end_headers()
            return
        handler.send_response(206 if ranged else 200)
        handler.send_header("Content-Type", "application/octet-stream")
        handler.send_header("Content-Length", str(len(served) - start))
        handler.send_header("ETag", f'"{sha}"')
        handler.send_header("X-Linked-Etag", f'"{sha}"')
        handler.send_header("X-Linked-Size", str(len(data)))
        handler.send_header("X-Repo-Commit", COMMIT)
        handler.send_header("Accept-Ranges", "bytes")
        if ranged:
            handler.send_header("Content-Range", f"bytes {start}-{len(served) - 1}/{len(served)}")
        handler.end_headers()
        if not body:
            return
        cuts = repo.cut_after.get(name)
        hold = repo.hold_after.get(name)
        if cuts:
            self._send_part(handler, served[start:start + cuts.pop(0)])
        elif hold is not None and start <= hold and not self.release.is_set():
            self._send_part(handler, served[start:hold], stall=True)
        else:
            handler.wfile.write(served[start:])

    def _send_part(self, handler, part: bytes, stall: bool = False) -> None:
        """Part of the body, then (a stall and) a dropped connection."""
        handler.wfile.write(part)
        handler.wfile.flush()
        if stall:
            self.holding.set()
            _wait_for_release_or_hangup(handler.connection, self.release)
        handler.close_connection = True
        try:
            handler.connection.shutdown(socket.SHUT_RDWR)
        except OSError:  # the client is gone already
            pass


def _wait_for_release_or_hangup(connection: socket.socket, release: threading.Event) -> None:
    """However long it takes: the test decides when the stall ends, never a timer."""
    while not release.wait(0.05):
        readable, _, _ = select.select([connection], [], [], 0)
        try:
            if readable and not connection.recv(1, socket.MSG_PEEK):
                return  # the client closed the connection (a Ctrl-C'd process exits)
        except OSError:
            return


def _model_info(repo_id: str, repo: FakeRepo) -> dict:
    siblings = [{"rfilename": name, "size": len(data),
                 "lfs": {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}}
                for name, data in sorted(repo.files.items())]
    return {"id": repo_id, "modelId": repo_id, "sha": COMMIT, "private": False,
            "gated": "auto" if repo.gated_token else False, "siblings": siblings, "tags": ["gguf"]}


def _error(handler, status: int, code: str, message: str) -> None:
    body = json.dumps({"error": message}).encode()
    handler.send_response(status)
    handler.send_header("X-Error-Code", code)
    handler.send_header("X-Error-Message", message)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    if handler.command != "HEAD":
        handler.wfile.write(body)


def _send(handler, status: int, data: bytes, content_type: str, body: bool) -> None:
    handler.send_response(status)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    if body:
        handler.wfile.write(data)
