"""Router mode (lamplight/router/): several models behind one server, each a child process loaded
on demand, as llama-server's router.

Two routers run in this process (each a uvicorn thread; their children are real `lamplight
serve` processes), one per module-scoped fixture, so each child's start (torch's import) is paid
as few times as the behaviour needs: `--models-max 1` with requests alternating between two
models; `--models-max 2 --no-models-autoload` for explicit loads, a child killed with SIGKILL,
and idle models going to sleep.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest
from conftest import reference_path
from tiny_gguf import write_tiny_llama

from lamplight.cli import build_parser
from lamplight.router.catalog import build_catalog, scan_models_dir
from lamplight.router.flag_table import load_flag_table
from lamplight.router.launch import build_router, router_spec, run_router
from lamplight.router.presets import PresetError, flags_from_argv, merged_flags, read_preset_file

CHILD_FLAGS = ["-c", "512", "-np", "2", "-t", "1"]


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    """a.gguf, a folder b/ with its model and its projector (a tiny random LLaVA mlp one), and a
    file that is no GGUF."""
    from lamplight.bench.random_mmproj import write_random_mmproj

    root = tmp_path_factory.mktemp("models")
    write_tiny_llama(root / "a.gguf", seed=1)
    (root / "b").mkdir()
    write_tiny_llama(root / "b" / "b-Q8_0.gguf", seed=2)
    write_random_mmproj("siglip-b16-mlp", root / "b" / "mmproj-b-f16.gguf", "F16", layers=2,
                        overrides=["image_size=32", "n_embd=64", "n_ff=128", "n_head=2", "text_n_embd=64"])
    (root / "broken.gguf").write_bytes(b"not a model")
    return root


@pytest.fixture(scope="module")
def empty_caches(tmp_path_factory):
    """No cached models (`lamplight pull`'s cache is $LAMPLIGHT_CACHE): the listing is the folder's."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LAMPLIGHT_CACHE", str(tmp_path_factory.mktemp("lamplight-cache")))
        yield


class RunningRouter:
    """A router serving on a free port in a thread of this process."""

    def __init__(self, argv: list[str]):
        self.port = free_port()
        self.argv = [*argv, "--port", str(self.port)]
        args = build_parser().parse_args(["serve", *self.argv])
        self.router = build_router(router_spec(args, self.argv))
        self.models = self.router.models
        self.server = self.router.uvicorn_server()
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "the router did not start"
            time.sleep(0.05)
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=120)

    def statuses(self) -> dict[str, str]:
        return {m["id"]: m["status"]["value"] for m in self.http.get("/v1/models").json()["data"]}

    def model(self, name: str) -> dict:
        return next(m for m in self.http.get("/v1/models").json()["data"] if m["id"] == name)

    def wait_for(self, name: str, status: str, seconds: float = 90) -> dict:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            model = self.model(name)
            if model["status"]["value"] == status:
                return model
            time.sleep(0.1)
        raise AssertionError(f"{name} never became {status}: {self.model(name)['status']}")

    def pid(self, name: str) -> int:
        return self.models.find(name).process.pid

    def stop(self) -> None:
        self.http.close()
        self.server.should_exit = True
        self.thread.join(60)
        assert not self.thread.is_alive(), "the router did not stop"
        assert all(instance.process is None for instance in self.models.instances.values()), "a child outlived it"


@pytest.fixture(scope="module")
def preset_file(models_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("preset") / "models.ini"
    path.write_text(f"""version = 1
; every model
[*]
c = 512
np = 3
LLAMA_ARG_THREADS = 1
no-webui = true

[b]
ctx-size = 384   ; b's own context
context-shift = false

[extra]
model = {models_dir / "a.gguf"}
alias = extra-alias
stop-timeout = 5
""")
    return path


@pytest.fixture(scope="module")
def lru_router(models_dir, preset_file, empty_caches):
    router = RunningRouter(["--models-dir", str(models_dir), "--models-preset", str(preset_file),
                            "--models-max", "1", "-np", "2"])
    yield router
    router.stop()


@pytest.fixture(scope="module")
def manual_router(models_dir, empty_caches):
    router = RunningRouter(["--models-dir", str(models_dir), "--models-max", "2", "--no-models-autoload",
                            "--sleep-idle-seconds", "2", *CHILD_FLAGS])
    for name in ("a", "b"):  # awake through the kill test; the sleep test gives b back the router's 2 s
        router.models.set_unload_timer(name, -1)
    yield router
    router.stop()


# -- the preset file and the command line, without processes -------------------------------------

def test_preset_layers_and_the_command_line(models_dir, preset_file):
    table = load_flag_table()
    every, sections = read_preset_file(str(preset_file), table)
    catalog = build_catalog([], scan_models_dir(str(models_dir)), sections, every)
    cli = flags_from_argv(["--models-dir", str(models_dir), "--port", "9", "-np", "2", "--temp", "0.5"], table)
    b = merged_flags(every.flags, catalog["b"].preset.flags, cli)
    # b's section over [*], the router's command line over both; its own flags (port, models-dir) dropped
    assert b == {"ctx_size": ["--ctx-size", "384"], "parallel": ["-np", "2"], "threads": ["--threads", "1"],
                 "webui": ["--no-webui"], "context_shift": ["--no-context-shift"], "temp": ["--temp", "0.5"]}
    assert sorted(catalog) == ["a", "b", "broken", "extra"]
    assert catalog["extra"].source == "preset" and catalog["extra"].aliases == ("extra-alias",)
    assert catalog["b"].mmproj.endswith("mmproj-b-f16.gguf") and catalog["b"].path.endswith("b-Q8_0.gguf")
    assert "not a GGUF file" in catalog["broken"].problem and catalog["a"].problem is None


def test_unknown_preset_key_is_a_startup_error(models_dir, tmp_path):
    preset = tmp_path / "bad.ini"
    preset.write_text("[*]\nc = 512\n\n[a]\nctx-size = 256\nbogus-key = 1\n")
    # the real command: parsed, then the lean router process (run_router's exec) finds the bad key
    command = [sys.executable, "-m", "lamplight.cli", "serve", "--models-dir", str(models_dir),
               "--models-preset", str(preset), "--port", str(free_port())]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "bogus-key" in done.stderr and "[a]" in done.stderr and "Traceback" not in done.stderr
    preset.write_text("[nothing-here]\nc = 512\n")
    argv = ["--models-dir", str(models_dir), "--models-preset", str(preset)]
    with pytest.raises(PresetError, match=r"\[nothing-here\] names no model"):
        build_router(router_spec(build_parser().parse_args(["serve", *argv]), argv))


def test_router_mode_on_ray_is_not_refused(models_dir, monkeypatch):
    # --replicas turns the models into Ray Serve applications (tests/test_router_ray.py); the
    # router keeps its process (no lean exec) and starts Ray only once it serves.
    pytest.importorskip("ray.serve", reason="the ray extra is not installed")
    monkeypatch.setattr("lamplight.router.launch._become_lean_router", lambda spec: pytest.fail("exec'd the router"))
    monkeypatch.setattr("lamplight.router.launch.Router.serve", lambda router: 0)
    assert run_router(_args_with_argv(["--models-dir", str(models_dir), "--replicas", "2"])) == 0


def _args_with_argv(argv: list[str]):
    args = build_parser().parse_args(["serve", *argv])
    args.serve_argv = argv
    return args


# -- --models-max 1: requests alternating between two models -----------------------------------

def test_requests_alternate_between_models_with_models_max_1(lru_router):
    http = lru_router.http
    before = lru_router.statuses()
    assert before == {"a": "unloaded", "b": "unloaded", "broken": "unloaded", "extra": "unloaded"}
    transcript = [("start", before, None)]
    for name, path in (("a", "/completion"), ("b", "/v1/chat/completions"), ("a", "/completion")):
        body = {"model": name, "max_tokens": 2, "n_predict": 2, "seed": 1}
        body.update({"prompt": "hi"} if path == "/completion" else {"messages": [{"role": "user", "content": "hi"}]})
        reply = http.post(path, json=body)
        assert reply.status_code == 200, reply.text
        assert reply.json()["model"] == name  # the child serves under the router's name
        statuses = lru_router.statuses()
        other = "b" if name == "a" else "a"
        assert statuses[name] == "loaded" and statuses[other] == "unloaded", statuses
        assert "failed" not in lru_router.model(other)["status"]  # unloaded by the LRU rule, not failed
        transcript.append((f"POST {path} model={name}", statuses, lru_router.model(name)["status"]["load_seconds"]))
    for step, statuses, load_seconds in transcript:
        print(f"{step:42} {statuses}" + (f"  (loaded in {load_seconds:.2f} s)" if load_seconds else ""))
    # each child was started with the preset's layers: b's section over [*], the router's -np over [*]'s
    a_args, b_args = lru_router.model("a")["status"]["args"], lru_router.model("b")["status"]["args"]
    assert " --ctx-size 384 " in " ".join(b_args) + " " and " --no-context-shift" in " ".join(b_args)
    assert " --ctx-size 512 " in " ".join(a_args) and " -np 2 " in " ".join(a_args) and "--no-webui" in a_args
    assert lru_router.model("a")["meta"]["n_ctx"] == 256  # 512 over 2 slots: the child's own listing, merged


def test_a_streamed_request_passes_through_event_by_event(lru_router):
    body = {"model": "a", "prompt": "hi", "n_predict": 24, "seed": 7, "temperature": 1.0, "ignore_eos": True}
    whole = lru_router.http.post("/completion", json={**body, "return_tokens": True}).json()
    chunks = []
    with lru_router.http.stream("POST", "/completion", json={**body, "stream": True}) as reply:
        assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")
        chunks = list(reply.iter_raw())
    assert b'"stop":true' not in chunks[0]  # the first event came before the last was written
    events = [line for line in b"".join(chunks).split(b"\n") if line.startswith(b"data: ")]
    assert len(events) == 25
    streamed = [token for event in events for token in json.loads(event[6:])["tokens"]]
    assert streamed == whole["tokens"] and len(streamed) == 24  # same seed, same tokens: streaming changes nothing
    direct = httpx.post(lru_router.models.find("a").base_url + "/completion", json={**body, "return_tokens": True})
    assert direct.json()["tokens"] == whole["tokens"]  # the router changes nothing either


def test_unknown_models_and_paths_are_refused(lru_router, models_dir, tmp_path):
    http = lru_router.http
    before = lru_router.statuses()
    outside = write_tiny_llama(tmp_path / "outside.gguf")
    for name in ("nope", str(outside), "../a.gguf", str(models_dir / "a.gguf"), "a.gguf"):
        reply = http.post("/completion", json={"model": name, "prompt": "x"})
        assert reply.status_code == 400, (name, reply.text)
        message = reply.json()["error"]["message"]
        assert f"'{name}' not found" in message and all(f" {known}," in message for known in ("a", "b", "broken"))
    assert http.post("/models/load", json={"model": "nope"}).status_code == 404
    assert http.get("/props", params={"model": "nope"}).status_code == 400
    missing = http.post("/completion", json={"prompt": "x"})
    assert missing.status_code == 400 and "model name is missing" in missing.json()["error"]["message"]
    assert lru_router.statuses() == before  # no process started for any of them


def test_an_unreadable_model_is_reported_and_the_others_serve(lru_router):
    broken = lru_router.model("broken")["status"]
    assert broken["value"] == "unloaded" and broken["failed"] is True and "not a GGUF file" in broken["exit_reason"]
    reply = lru_router.http.post("/completion", json={"model": "broken", "prompt": "x"})
    assert reply.status_code == 500 and "not a GGUF file" in reply.json()["error"]["message"]
    assert lru_router.http.post("/completion", json={"model": "a", "prompt": "x", "n_predict": 1}).status_code == 200


def test_aliases_and_router_props(lru_router):
    assert lru_router.models.find("extra-alias").name == "extra"
    props = lru_router.http.get("/props").json()
    assert props["role"] == "router" and props["max_instances"] == 1 and props["models_autoload"] is True
    listed = lru_router.model("extra")
    assert listed["aliases"] == ["extra-alias"] and listed["source"] == "preset"
    assert "alias" not in listed["status"]["preset"] and "[extra]" in listed["status"]["preset"]


# -- --models-max 2, autoload off: explicit loads, a crash, sleeping ---------------------------

def test_autoload_off_explicit_loads_and_a_load_under_way(manual_router):
    http = manual_router.http
    refused = http.post("/completion", json={"model": "a", "prompt": "x"})
    assert refused.status_code == 400 and "not loaded" in refused.json()["error"]["message"]
    assert http.post("/models/load", json={"model": "a"}).json() == {"success": True}
    again = http.post("/models/load", json={"model": "a"})
    assert again.status_code == 400 and "already running (loading)" in again.json()["error"]["message"]
    assert manual_router.statuses()["a"] == "loading"
    # autoload off, but a is loading: the request waits for it instead of failing
    waited = http.post("/completion", json={"model": "a", "prompt": "x", "n_predict": 1})
    assert waited.status_code == 200, waited.text
    # ?autoload=true on one request loads b; a stays loaded (--models-max 2)
    loaded = http.post("/completion?autoload=true", json={"model": "b", "prompt": "x", "n_predict": 1})
    assert loaded.status_code == 200, loaded.text
    assert {name: manual_router.statuses()[name] for name in ("a", "b")} == {"a": "loaded", "b": "loaded"}


def test_a_killed_child_is_failed_the_other_serves_and_it_reloads(manual_router):
    http = manual_router.http
    a_pid, b_pid = manual_router.pid("a"), manual_router.pid("b")
    os.kill(a_pid, signal.SIGKILL)
    failed = manual_router.wait_for("a", "unloaded", seconds=20)["status"]
    assert failed["failed"] is True and failed["exit_code"] == 128 + signal.SIGKILL
    assert "SIGKILL" in failed["exit_reason"] and failed["log_tail"]
    served = http.post("/completion", json={"model": "b", "prompt": "x", "n_predict": 1})
    assert served.status_code == 200 and manual_router.pid("b") == b_pid  # b never noticed
    reloaded = http.post("/completion", params={"autoload": "true"}, json={"model": "a", "prompt": "x", "n_predict": 1})
    assert reloaded.status_code == 200, reloaded.text
    assert manual_router.pid("a") != a_pid and "failed" not in manual_router.model("a")["status"]


def test_idle_models_sleep_and_wake_on_the_next_request(manual_router):
    http = manual_router.http
    manual_router.models.set_unload_timer("a", 0)  # Ollama's keep_alive 0: unloaded once idle
    manual_router.models.set_unload_timer("b", None)  # back to the router's --sleep-idle-seconds 2
    manual_router.wait_for("a", "sleeping", seconds=10)
    manual_router.wait_for("b", "sleeping", seconds=20)
    props = http.get("/props", params={"model": "b"}).json()
    assert props["is_sleeping"] is True and props["default_generation_settings"]["n_ctx"] == 256
    assert manual_router.statuses()["b"] == "sleeping"  # /props does not wake it
    # autoload is off, but a sleeping model is woken by the next request that needs it
    woken = http.post("/completion", json={"model": "b", "prompt": "x", "n_predict": 1})
    assert woken.status_code == 200, woken.text
    # b's folder holds its projector: its server took it (--mmproj) and reads an image
    assert http.get("/props", params={"model": "b"}).json()["modalities"]["vision"] is True
    png = (reference_path("vision/images") / "square_64.png").read_bytes()
    seen = http.post("/completion", json={"model": "b", "n_predict": 1, "prompt": {
        "prompt_string": "look: <__media__> ok", "multimodal_data": [base64.b64encode(png).decode()]}})
    assert seen.status_code == 200 and seen.json()["tokens_evaluated"] > 6, seen.text
    assert manual_router.statuses()["b"] == "loaded" and http.get("/props", params={"model": "b"}).json()["is_sleeping"] is False
