"""Router mode on Ray Serve (lamplight/router/ray_models.py, lamplight/distributed/cluster.py):
`lamplight serve --models-dir DIR --replicas 2 --models-max 1`, two tiny models, each loaded as a
Ray Serve application of 2 replicas behind the router's one port, on a local Ray instance the
server starts and stops. One server for the module (Ray's start-up is the slow part); skipped
without the ray extra."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import httpx
import pytest
from tiny_gguf import write_tiny_llama

from lamplight.cli import build_parser
from lamplight.router.launch import RouterStartupError, build_router, router_spec

RAY_SKIP = "the ray extra is not installed (pip install -c constraints.txt -e '.[ray]')"
REPLICA = "x-lamplight-replica"


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    write_tiny_llama(root / "a.gguf", seed=1, n_ctx=512)
    write_tiny_llama(root / "b.gguf", seed=2, n_ctx=512)
    return root


@pytest.fixture(scope="module")
def empty_caches(tmp_path_factory):
    """No cached models: the listing is the folder's."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LAMPLIGHT_CACHE", str(tmp_path_factory.mktemp("lamplight-cache")))
        yield


def _spec(argv: list[str]):
    return router_spec(build_parser().parse_args(["serve", *argv]), argv)


# -- without Ray running: the settings a router on Ray is built from ----------------------------

def test_preset_replicas_refine_the_command_line(models_dir, tmp_path, empty_caches):
    pytest.importorskip("ray.serve", reason=RAY_SKIP)
    preset = tmp_path / "models.ini"
    preset.write_text("[*]\nc = 512\n\n[b]\nreplicas = 3\n")
    argv = ["--models-dir", str(models_dir), "--models-preset", str(preset), "--replicas", "2", "-np", "1"]
    router = build_router(_spec(argv))  # builds the backend; Ray starts only when it serves
    a, b = router.models.find("a"), router.models.find("b")
    assert (a.replicas, b.replicas) == (2, 3) and (a.app_name, b.app_name) == ("lamplight-a", "lamplight-b")
    assert a.listing_extras()["replicas"] == {"count": 2, "application": None, "route_prefix": None,
                                              "application_status": None, "deployment_status": None,
                                              "running": 0, "each": []}
    preset.write_text("[b]\nreplicas = 0\n")
    with pytest.raises(ValueError, match=r"preset \[b\]: key 'replicas': must be a whole number"):
        build_router(_spec(argv))


def test_preset_replicas_without_ray_are_refused(models_dir, tmp_path, empty_caches):
    preset = tmp_path / "models.ini"
    preset.write_text("[a]\nreplicas = 2\n")
    with pytest.raises(RouterStartupError, match=r"preset \[a\]: key 'replicas' needs Ray Serve"):
        build_router(_spec(["--models-dir", str(models_dir), "--models-preset", str(preset)]))


# -- one server on a local Ray instance ----------------------------------------------------------

class RayRouter:
    def __init__(self, models_dir, log_path):
        self.port = free_port()
        self.log_path = log_path
        self.log = open(log_path, "w+")
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "lamplight.cli", "serve", "--models-dir", str(models_dir), "--replicas", "2",
             "--models-max", "1", "-c", "512", "-np", "1", "--port", str(self.port)],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=180)
        self._wait_healthy()
        self.ready_s = time.monotonic() - self.started
        self.serve_url = re.search(r"its HTTP proxy: (\S+)", self.text()).group(1)

    def text(self) -> str:
        return self.log_path.read_text()

    def _wait_healthy(self, timeout_s: float = 180) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            assert self.process.poll() is None and time.monotonic() < deadline, self.text()
            try:
                if self.http.get("/health", timeout=5).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.3)

    def models(self) -> dict[str, dict]:
        reply = self.http.get("/v1/models")
        assert reply.status_code == 200, reply.text
        return {model["id"]: model for model in reply.json()["data"]}

    def statuses(self) -> dict[str, str]:
        return {name: model["status"]["value"] for name, model in self.models().items()}

    def app_answers(self, model: str) -> int:
        """Ray Serve's own answer for the model's application (404 once it is deleted)."""
        return httpx.get(f"{self.serve_url}/lamplight-{model}/health", timeout=30).status_code

    def stop(self) -> float:
        from lamplight.distributed.launch import descendants

        ray_processes = descendants(self.process.pid)
        started = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout=90)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait(30)
            self.http.close()
            self.log.close()
        assert code == 0, self.text()
        time.sleep(1)
        alive = [pid for pid in ray_processes if os.path.exists(f"/proc/{pid}")
                 and open(f"/proc/{pid}/stat", "rb").read().rsplit(b")", 1)[1].split()[0] != b"Z"]
        assert not alive, f"Ray processes left behind: {alive}"
        return time.monotonic() - started


@pytest.fixture(scope="module")
def ray_router(models_dir, empty_caches, tmp_path_factory):
    pytest.importorskip("ray.serve", reason=RAY_SKIP)
    router = RayRouter(models_dir, tmp_path_factory.mktemp("router") / "serve.log")
    print(f"\nrouter on Ray: listening after {router.ready_s:.1f} s", file=sys.stderr)
    yield router
    print(f"router on Ray: stopped in {router.stop():.1f} s", file=sys.stderr)


def _assert_two_running_replicas(model: dict) -> None:
    replicas = model["replicas"]
    assert replicas["count"] == 2 and replicas["running"] == 2, replicas
    assert replicas["application"] == f"lamplight-{model['id']}" and replicas["application_status"] == "RUNNING"
    assert [replica["state"] for replica in replicas["each"]] == ["RUNNING", "RUNNING"], replicas
    assert len({replica["replica_id"] for replica in replicas["each"]}) == 2


def test_both_models_load_as_two_replicas_each_with_models_max_1(ray_router):
    assert ray_router.statuses() == {"a": "unloaded", "b": "unloaded"}
    assert ray_router.models()["a"]["replicas"]["count"] == 2 and ray_router.models()["a"]["replicas"]["each"] == []
    timings = {}
    for name, path in (("a", "/completion"), ("b", "/v1/chat/completions")):
        body = {"model": name, "max_tokens": 2, "n_predict": 2, "seed": 1}
        body.update({"prompt": "hi"} if path == "/completion" else {"messages": [{"role": "user", "content": "hi"}]})
        started = time.monotonic()
        reply = ray_router.http.post(path, json=body)
        timings[name] = time.monotonic() - started
        assert reply.status_code == 200, reply.text + ray_router.text()[-3000:]
        assert reply.json()["model"] == name and reply.headers[REPLICA]  # served by one of its replicas
        models = ray_router.models()
        other = "b" if name == "a" else "a"
        assert models[name]["status"]["value"] == "loaded" and models[other]["status"]["value"] == "unloaded"
        _assert_two_running_replicas(models[name])
        assert models[other]["replicas"]["each"] == [] and "failed" not in models[other]["status"]
        assert ray_router.app_answers(name) == 200
    assert ray_router.app_answers("a") == 404  # --models-max 1: a's application was deleted from Ray Serve
    print(f"first request, deploy included: {', '.join(f'{k} {v:.1f} s' for k, v in timings.items())}",
          file=sys.stderr)
    status = ray_router.models()["b"]["status"]
    assert status["args"][:4] == ["-m", status["args"][1], "--alias", "b"] and status["load_seconds"] > 0


def test_a_prompt_prefix_stays_on_its_replica(ray_router):
    system = {"role": "system", "content": "You answer in one word. " * 4}
    replicas = set()
    for question in ("one", "two", "three"):
        body = {"model": "b", "max_tokens": 1, "messages": [system, {"role": "user", "content": question}]}
        reply = ray_router.http.post("/v1/chat/completions", json=body)
        assert reply.status_code == 200, reply.text
        replicas.add(reply.headers[REPLICA])
    assert len(replicas) == 1  # the shared system prompt's blocks belong to the first one's replica


def test_a_streamed_request_is_the_whole_one_event_by_event(ray_router):
    body = {"model": "b", "prompt": "hi", "n_predict": 12, "seed": 7, "temperature": 1.0, "ignore_eos": True}
    whole = ray_router.http.post("/completion", json={**body, "return_tokens": True})
    assert whole.status_code == 200, whole.text
    with ray_router.http.stream("POST", "/completion", json={**body, "stream": True, "return_tokens": True}) as reply:
        assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")
        chunks = list(reply.iter_raw())
    events = [line for line in b"".join(chunks).split(b"\n") if line.startswith(b"data: ")]
    assert len(events) == 13 and b'"stop":true' in events[-1] and b'"stop":true' not in events[0]
    streamed = [token for event in events for token in json.loads(event[6:])["tokens"]]
    assert streamed == whole.json()["tokens"] and len(streamed) == 12  # same seed: the same tokens


def test_unknown_models_and_unloading(ray_router):
    before = ray_router.statuses()
    reply = ray_router.http.post("/completion", json={"model": "nope", "prompt": "x"})
    assert reply.status_code == 400 and "'nope' not found" in reply.json()["error"]["message"]
    assert " a, b " in reply.json()["error"]["message"] + " "  # what exists, named
    assert ray_router.http.post("/models/load", json={"model": "nope"}).status_code == 404
    assert ray_router.statuses() == before  # nothing deployed for it
    again = ray_router.http.post("/models/load", json={"model": "b"})
    assert again.status_code == 400 and "already running (loaded)" in again.json()["error"]["message"]
    assert ray_router.http.post("/models/unload", json={"model": "b"}).json() == {"success": True}
    assert ray_router.statuses() == {"a": "unloaded", "b": "unloaded"}
    assert ray_router.app_answers("b") == 404  # its application is gone from Ray Serve too
    refused = ray_router.http.post("/models/unload", json={"model": "b"})
    assert refused.status_code == 400 and "not running (unloaded)" in refused.json()["error"]["message"]
