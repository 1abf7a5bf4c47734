"""lamplight on Ray Serve (lamplight/distributed/): two replicas of a tiny model on a local Ray
instance, behind one port. Needs the `ray` extra (CI installs it); skipped without it."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from tiny_gguf import write_tiny_llama

from lamplight.distributed.prefix import prefix_hashes

REPLICA = "x-lamplight-replica"
RAY_SKIP = "the ray extra is not installed (pip install -c constraints.txt -e '.[ray]')"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_prefix_hashes_follow_a_conversation():
    turn1 = {"messages": [{"role": "system", "content": "S" * 600}, {"role": "user", "content": "hi"}]}
    turn2 = {"messages": turn1["messages"] + [{"role": "assistant", "content": "hello"},
                                               {"role": "user", "content": "more"}]}
    other = {"messages": [{"role": "system", "content": "S" * 600}, {"role": "user", "content": "bye"}]}
    h1, h2, h3 = (prefix_hashes(json.dumps(d).encode()) for d in (turn1, turn2, other))
    assert h1 and h2[:len(h1)] == h1 and len(h2) > len(h1)
    assert h3[:3] == h1[:3] and h3[3] != h1[3]  # the long system prompt's blocks are shared
    long = "x" * 1000
    assert prefix_hashes(json.dumps({"prompt": long}).encode())[:3] == \
        prefix_hashes(json.dumps({"prompt": long + "y" * 50}).encode())[:3]
    assert prefix_hashes(b"not json") == [] and prefix_hashes(b'{"content": "x"}') == []


def test_replica_flags_split_the_threads():
    from lamplight.cli import build_parser

    args = build_parser().parse_args(["serve", "--replicas", "2", "--ray-address", "auto", "-t", "6",
                                      "--route-imbalance", "3"])
    assert (args.replicas, args.ray_address, args.route_imbalance, args.route_block_chars) == (2, "auto", 3, 256)
    assert build_parser().parse_args(["serve"]).replicas == 0  # one process, no Ray
    pytest.importorskip("ray.serve", reason=RAY_SKIP)
    from lamplight.distributed.deployments import threads_per_replica

    assert threads_per_replica(args, cpus=16) == 3
    args.threads = -1
    assert threads_per_replica(args, cpus=2) == 1 and threads_per_replica(args, cpus=16) == 8


def test_metrics_are_labelled_per_replica():
    pytest.importorskip("ray.serve", reason=RAY_SKIP)
    from lamplight.distributed.deployments import label_metrics

    seen = set()
    text = "# HELP a help\n# TYPE a counter\na 1\nb{x=\"1\"} 2\n"
    assert label_metrics(text, "r1", seen) == '# HELP a help\n# TYPE a counter\na{replica="r1"} 1\nb{replica="r1",x="1"} 2\n'
    assert label_metrics(text, "r2", seen) == 'a{replica="r2"} 1\nb{replica="r2",x="1"} 2\n'


def wait_healthy(port: int, process: subprocess.Popen, log_path, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        assert process.poll() is None and time.monotonic() < deadline, log_path.read_text()
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)


# First: it runs its own Ray instance, before the module's one starts.
def test_cli_serves_replicas_and_stops_cleanly_on_sigterm(tmp_path):
    pytest.importorskip("ray.serve", reason=RAY_SKIP)
    from lamplight.distributed.launch import descendants

    model = write_tiny_llama(tmp_path / "tiny.gguf", n_ctx=1024)
    port = free_port()
    log = open(tmp_path / "serve.log", "w+")
    started = time.monotonic()
    process = subprocess.Popen([sys.executable, "-m", "lamplight.cli", "serve", "--replicas", "2", "-m", str(model),
                                "-c", "1024", "-np", "1", "--port", str(port), "--slot-save-path", str(tmp_path)],
                               stdout=log, stderr=subprocess.STDOUT)
    ray_processes = []
    try:
        wait_healthy(port, process, tmp_path / "serve.log")  # one replica is up
        deadline = time.monotonic() + 240
        while "replica(s) ready" not in (tmp_path / "serve.log").read_text():  # and the other
            assert process.poll() is None and time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
            time.sleep(0.5)
        print(f"lamplight serve --replicas 2: ready in {time.monotonic() - started:.1f} s", file=sys.stderr)
        chat(f"http://127.0.0.1:{port}", [{"role": "user", "content": "hi"}])
        assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["replica-0", "replica-1"]
        ray_processes = descendants(process.pid)
        assert ray_processes
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=120) == 0, (tmp_path / "serve.log").read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(30)
        log.close()
    time.sleep(1)
    alive = [pid for pid in ray_processes if os.path.exists(f"/proc/{pid}")
             and open(f"/proc/{pid}/stat", "rb").read().rsplit(b")", 1)[1].split()[0] != b"Z"]
    assert not alive, f"Ray processes left behind: {alive}"


# Before the module's Ray instance too: a cluster of its own, made by `ray start`.
def test_ray_address_joins_an_existing_cluster_and_leaves_it_running(tmp_path):
    pytest.importorskip("ray.serve", reason=RAY_SKIP)
    from lamplight.distributed.launch import descendants, reap

    model = write_tiny_llama(tmp_path / "tiny.gguf", n_ctx=1024)
    gcs_port, port = free_port(), free_port()
    head_log = open(tmp_path / "head.log", "w+")
    head = subprocess.Popen([sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block", f"--port={gcs_port}", "--num-cpus=2",
                             "--include-dashboard=false", "--disable-usage-stats"],
                            stdout=head_log, stderr=subprocess.STDOUT)
    log = open(tmp_path / "serve.log", "w+")
    serve_process = None
    try:
        serve_process = subprocess.Popen(
            [sys.executable, "-m", "lamplight.cli", "serve", "--replicas", "1", "--ray-address",
             f"127.0.0.1:{gcs_port}", "-m", str(model), "-c", "1024", "-np", "1", "--port", str(port)],
            stdout=log, stderr=subprocess.STDOUT)
        wait_healthy(port, serve_process, tmp_path / "serve.log")
        reply = chat(f"http://127.0.0.1:{port}", [{"role": "user", "content": "hi"}])
        assert reply.headers[REPLICA]
        serve_process.send_signal(signal.SIGTERM)
        assert serve_process.wait(timeout=120) == 0, (tmp_path / "serve.log").read_text()
        assert f"on 127.0.0.1:{gcs_port}" in (tmp_path / "serve.log").read_text()
        # Only lamplight's application is gone: the cluster and its Serve proxy keep running.
        assert head.poll() is None, (tmp_path / "head.log").read_text()
        deadline = time.monotonic() + 60
        while (status := httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).status_code) == 200:
            assert time.monotonic() < deadline, "lamplight's application outlived its command"
            time.sleep(0.5)
        assert status in (404, 503), status
    finally:
        if serve_process is not None and serve_process.poll() is None:
            serve_process.kill()
            serve_process.wait(30)
        started = descendants(head.pid)
        head.terminate()
        try:
            head.wait(60)
        except subprocess.TimeoutExpired:
            head.kill()
        reap(started)
        log.close()
        head_log.close()
        current = "/tmp/ray/ray_current_cluster"  # `ray stop` would delete it; SIGTERM does not
        if os.path.exists(current) and open(current).read().strip().endswith(f":{gcs_port}"):
            os.remove(current)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A local Ray instance with two replicas of a tiny model; always shut down."""
    pytest.importorskip("ray.serve", reason=RAY_SKIP)
    import ray
    from ray import serve

    from lamplight.cli import build_parser
    from lamplight.distributed.deployments import APP_NAME, build_application, spec_from_args
    from lamplight.distributed.launch import OBJECT_STORE_BYTES, descendants, reap

    model = write_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny.gguf", n_ctx=2048)
    port = free_port()
    args = build_parser().parse_args(["serve", "-m", str(model), "-c", "4096", "-np", "2", "--metrics",
                                      "--port", str(port), "--replicas", "2"])
    started = time.monotonic()
    environ, handlers = dict(os.environ), {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    ray.init(address="local", num_cpus=2, object_store_memory=OBJECT_STORE_BYTES, include_dashboard=False,
             log_to_driver=False, logging_level="WARNING")
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port}, proxy_location="HeadOnly")
        serve.run(build_application(spec_from_args(args, 1), 2, num_cpus=1), name=APP_NAME, route_prefix="/")
        print(f"2 replicas ready in {time.monotonic() - started:.1f} s", file=sys.stderr)
        yield f"http://127.0.0.1:{port}"
    finally:
        children = descendants(os.getpid())
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
            reap(children)
            os.environ.clear()  # ray.init sets RAY_* and PYTHONBREAKPOINT for the rest of the session
            os.environ.update(environ)
            for sig, handler in handlers.items():
                signal.signal(sig, handler)


def chat(base, messages, **extra):
    response = httpx.post(f"{base}/v1/chat/completions", timeout=120,
                          json={"messages": messages, "max_tokens": 4, "ignore_eos": True, **extra})
    assert response.status_code == 200, response.text
    return response


def test_openai_client_streaming_and_errors_pass_through(cluster):
    from openai import OpenAI

    client = OpenAI(base_url=f"{cluster}/v1", api_key="unused", timeout=120, max_retries=0)
    raw = client.chat.completions.with_raw_response.create(model="x", messages=[{"role": "user", "content": "Hi"}],
                                                           max_tokens=4)
    reply = raw.parse()
    assert reply.choices[0].message.content is not None and reply.usage.completion_tokens >= 1
    assert raw.headers.get_list("server") == ["uvicorn"]  # Ray Serve's proxy's; the replica's is dropped
    chunks = list(client.chat.completions.create(model="x", messages=[{"role": "user", "content": "Hi"}],
                                                 max_tokens=4, stream=True, extra_body={"ignore_eos": True}))
    assert len(chunks) >= 4 and chunks[-1].choices[0].finish_reason == "length"
    assert httpx.get(f"{cluster}/health", timeout=60).json() == {"status": "ok"}
    bad = httpx.post(f"{cluster}/v1/chat/completions", json={"messages": [], "max_tokens": -5}, timeout=60)
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
    assert httpx.get(f"{cluster}/no-such-path", timeout=60).json()["error"]["code"] == 404
    native = httpx.post(f"{cluster}/completion", json={"prompt": "ab", "n_predict": 2, "stream": True}, timeout=60)
    assert native.headers["content-type"].startswith("text/event-stream") and native.text.count("data: ") >= 2


def test_a_conversation_stays_on_its_replica_and_reuses_its_cache(cluster):
    messages = [{"role": "system", "content": "You are terse. " * 10}, {"role": "user", "content": "one"}]
    replicas = set()
    for turn in range(4):
        response = chat(cluster, messages)
        replicas.add(response.headers[REPLICA])
        body = response.json()
        if turn:
            assert body["usage"]["prompt_tokens_details"]["cached_tokens"] > 0, body["usage"]
        messages += [{"role": "assistant", "content": body["choices"][0]["message"]["content"]},
                     {"role": "user", "content": f"turn {turn}"}]
    assert len(replicas) == 1, replicas


def test_unrelated_requests_use_both_replicas_and_slots_are_per_replica(cluster):
    seen = set()
    with ThreadPoolExecutor(6) as pool:
        for response in pool.map(lambda i: chat(cluster, [{"role": "user", "content": f"q{i} " * (i + 1)}],
                                                max_tokens=8), range(12)):
            seen.add(response.headers[REPLICA])
    assert len(seen) == 2, seen
    refused = httpx.get(f"{cluster}/slots", timeout=60)
    assert refused.status_code == 400 and "?replica=" in refused.json()["error"]["message"]
    for replica in seen:
        slots = httpx.get(f"{cluster}/slots", params={"replica": replica}, timeout=60)
        assert slots.status_code == 200, (slots.text, refused.text[:400])
        assert slots.headers[REPLICA] == replica and len(slots.json()) == 2
    metrics = httpx.get(f"{cluster}/metrics", timeout=60)
    assert metrics.status_code == 200
    assert all(f'replica="{replica}"' in metrics.text for replica in seen)


def stream_events(url: str, started: "threading.Event", body: dict) -> list[dict]:
    """The JSON events of an SSE response; sets `started` at the first one."""
    events = []
    with httpx.stream("POST", url, json=body, timeout=120) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
                started.set()
    return events


def replica_actors() -> dict:
    """Replica id -> its Ray actor (Ray Serve names them SERVE_REPLICA::app#Replica#ID)."""
    import ray

    actors = {}
    for entry in ray.util.list_named_actors(all_namespaces=True):
        if "#Replica#" in entry["name"]:
            actors[entry["name"].rsplit("#", 1)[1]] = ray.get_actor(entry["name"], namespace=entry["namespace"])
    return actors


def running_replicas() -> int:
    from ray import serve

    status = serve.status().applications["lamplight"].deployments["Replica"]
    return status.replica_states.get("RUNNING", 0)


def test_a_killed_replica_loses_no_request_that_had_not_started(cluster):
    import ray

    actors = replica_actors()
    assert len(actors) == 2, actors
    victim_id = sorted(actors)[0]
    victim_pid = ray.get(actors[victim_id].__ray_call__.remote(lambda self: os.getpid()), timeout=60)
    conversations = [[{"role": "user", "content": f"question {i} " * 4}] for i in range(6)]
    with ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(chat, cluster, messages, max_tokens=600) for messages in conversations]
        deadline = time.monotonic() + 60
        while not any(slot["is_processing"] for slot in httpx.get(
                f"{cluster}/slots", params={"replica": victim_id}, timeout=60).json()):
            assert time.monotonic() < deadline, "the victim never got a request"
            time.sleep(0.05)
        os.kill(victim_pid, signal.SIGKILL)  # mid-generation: nothing of those responses was sent yet
        served = [future.result(timeout=300) for future in futures]  # each asserts a 200
    assert all(response.json()["usage"]["completion_tokens"] == 600 for response in served)
    assert sorted(actors)[1] in {response.headers[REPLICA] for response in served}
    assert any(response.headers.get("x-lamplight-retries") for response in served)
    for i in range(3):  # the service keeps answering while Ray replaces the dead replica
        assert chat(cluster, [{"role": "user", "content": f"after {i}"}]).headers[REPLICA] != victim_id
    deadline = time.monotonic() + 180
    while running_replicas() < 2 or victim_id in replica_actors():
        assert time.monotonic() < deadline, "Ray Serve did not replace the killed replica"
        time.sleep(1)


def test_a_stream_cut_by_its_replica_dying_ends_with_an_error_event(cluster):
    import ray

    victim_id, victim = sorted(replica_actors().items())[0]
    victim_pid = ray.get(victim.__ray_call__.remote(lambda self: os.getpid()), timeout=60)
    streaming = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        cut = pool.submit(stream_events, f"{cluster}/v1/chat/completions?replica={victim_id}", streaming,
                          {"messages": [{"role": "user", "content": "a long story"}], "max_tokens": 2000,
                           "ignore_eos": True, "stream": True})
        assert streaming.wait(120), "the stream never started"
        os.kill(victim_pid, signal.SIGKILL)
        events = cut.result(timeout=120)  # it ends: no hang
    assert any("choices" in event for event in events), events[:3]
    assert events[-1].get("error", {}).get("code") == 503, events[-3:]  # no [DONE]: the stream was cut
    assert chat(cluster, [{"role": "user", "content": "still there?"}]).headers[REPLICA] != victim_id


def test_serve_run_entry_point_takes_serve_flags(monkeypatch, tmp_path):
    """`serve run lamplight.distributed:build_app model=M replicas=N ...`: each key a serve flag."""
    pytest.importorskip("ray.serve", reason=RAY_SKIP)
    from lamplight.distributed import deployments

    built = {}
    monkeypatch.setattr(deployments, "build_application",
                        lambda spec, replicas, imbalance, block_chars, policy: built.update(
                            spec=spec, replicas=replicas, imbalance=imbalance, block_chars=block_chars, policy=policy))
    deployments.build_app({"model": "m.gguf", "replicas": 3, "ctx-size": 1024, "parallel": 2, "route": "random",
                           "route_imbalance": 5, "metrics": "true", "threads": 6})
    spec = built["spec"]
    assert (built["replicas"], built["imbalance"], built["policy"], built["block_chars"]) == (3, 5, "random", 256)
    assert (spec.model, spec.threads, spec.options.n_ctx, spec.options.n_parallel, spec.settings.metrics) == \
        ("m.gguf", 2, 1024, 2, True)
