"""`lamplight serve --replicas N [--ray-address ADDR]`: the replicas on Ray Serve, one port.

Without `--ray-address`: a local Ray instance sized for this machine (its CPUs, an object store
capped at OBJECT_STORE_BYTES, no dashboard), shut down with everything it started on exit.
With one: joins that cluster (`auto` for the local one `ray start` made), deploys the
application there, and deletes it (only it) on exit. Ctrl-C or SIGTERM stops either cleanly.
"""

from __future__ import annotations

import os
import signal
import sys
import time

OBJECT_STORE_BYTES = 256 * 2**20  # responses pass through it in small pieces; Ray's minimum is 75 MiB


def _say(message: str) -> None:
    print(f"lamplight: {message}", file=sys.stderr, flush=True)


def _stop(signum, frame):
    raise KeyboardInterrupt


def run_replicas(args) -> int:
    if args.ray_address:
        use_cluster_token()  # before Ray reads its configuration
    try:
        from ray import serve
    except ImportError:
        _say("error: --replicas needs Ray Serve: pip install -c constraints.txt -e '.[ray]'")
        return 1
    from .deployments import APP_NAME, build_application, spec_from_args, threads_per_replica

    if args.replicas < 1:
        _say("error: --replicas must be at least 1")
        return 1
    local = not args.ray_address
    cpus = os.cpu_count() or 1
    threads = threads_per_replica(args, cpus)
    if local and not args.hf_repo:  # fetch an alias once here, not once per replica
        from lamplight.sources import ModelSourceError, resolve_model

        try:
            args.model = str(resolve_model(args.model, progress=_say))
        except ModelSourceError as exc:
            _say(f"error: {exc}")
            return 1
    spec = spec_from_args(args, threads)
    num_cpus = min(threads, cpus / args.replicas) if local else threads
    previous = signal.getsignal(signal.SIGTERM)
    started = time.monotonic()
    try:
        init_ray(args.ray_address)
        signal.signal(signal.SIGTERM, _stop)  # after ray.init, which installs its own
        start_serve(args.host, args.port, args.idle_timeout)
        _say(f"starting {args.replicas} replica(s) of {args.model}, {threads} thread(s) each, on "
             f"{'a local Ray instance' if local else args.ray_address}")
        serve.run(build_application(spec, args.replicas, args.route_imbalance, args.route_block_chars, num_cpus,
                                    policy=args.route),
                  name=APP_NAME, route_prefix="/")
        _say(f"{args.replicas} replica(s) ready in {time.monotonic() - started:.1f} s; "
             f"listening on http://{args.host}:{args.port}")
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    except Exception as exc:  # a replica that cannot start (bad model, ...) fails the deployment
        _say(f"error: {exc}")
        return 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the shutdown short
        _say("shutting down the replicas")
        try:
            shutdown_ray(local, [APP_NAME])
        finally:
            signal.signal(signal.SIGTERM, previous)
    return 0


def init_ray(address: str | None) -> None:
    """Join the cluster at `address`, or (None) start a local Ray instance sized for this machine."""
    import ray

    if address:
        ray.init(address=address, log_to_driver=False, logging_level="WARNING")
    else:  # address="local": a new instance, even where `ray start` left a cluster address behind.
        ray.init(address="local", num_cpus=os.cpu_count() or 1, object_store_memory=OBJECT_STORE_BYTES,
                 include_dashboard=False, log_to_driver=False, logging_level="WARNING")


def start_serve(host: str, port: int, idle_timeout: float) -> None:
    """Ray Serve's controller and its HTTP proxy on host:port (on the head node). A cluster whose
    Serve already runs keeps its own proxy: serve_http_address says where it is."""
    from ray import serve

    serve.start(http_options={"host": host, "port": port, "keep_alive_timeout_s": max(1, int(idle_timeout))},
                proxy_location="HeadOnly")


def serve_http_address() -> tuple[str, int]:
    """Where Ray Serve's HTTP proxy listens, as a client on this machine reaches it."""
    from ray.serve.context import _get_global_client

    http = _get_global_client().get_serve_details().get("http_options") or {}
    host = http.get("host") or "127.0.0.1"
    return ("127.0.0.1" if host in ("0.0.0.0", "::", "") else host), int(http.get("port") or 8000)


def shutdown_ray(local: bool, app_names: list[str]) -> None:
    """A local instance: Serve and Ray shut down, and every process they left behind ended. A
    cluster: only `app_names` deleted, the cluster and its Serve left running."""
    import ray
    from ray import serve

    started_here = descendants(os.getpid()) if local else []
    try:
        if ray.is_initialized():
            if local:
                serve.shutdown()
            else:
                for name in app_names:
                    serve.delete(name)
    finally:
        ray.shutdown()
        reap(started_here)


def use_cluster_token() -> None:
    """`ray start` (2.60) turns token authentication on and keeps the token in ~/.ray/auth_token,
    but a driver joining with ray.init(address=...) sends it only when RAY_AUTH_MODE=token:
    set that when a token is at hand and the user chose no mode."""
    if "RAY_AUTH_MODE" in os.environ:
        return
    path = os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.expanduser("~/.ray/auth_token")
    if os.environ.get("RAY_AUTH_TOKEN") or os.path.isfile(path):
        os.environ["RAY_AUTH_MODE"] = "token"


def descendants(pid: int) -> list[int]:
    """The processes below `pid` (Linux /proc; [] elsewhere)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


def reap(pids: list[int], grace_s: float = 5.0) -> None:
    """Ends the local Ray instance's processes that outlived ray.shutdown() (its dashboard and
    runtime-env agents do): SIGTERM, then SIGKILL after `grace_s`."""
    def alive(pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
        except OSError:
            return False

    for sig in (signal.SIGTERM, signal.SIGKILL):
        left = [pid for pid in pids if alive(pid)]
        for pid in left:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + grace_s
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = [pid for pid in left if alive(pid)]
        if not left:
            return
