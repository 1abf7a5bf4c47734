"""Several models on one Ray Serve, each its own application (router mode with --replicas).

The router (lamplight/router/ray_models.py) keeps deciding which models are loaded; this is
what it asks Ray for: deploy model M as the application `lamplight-M` (the same ingress, replicas
and prefix-aware request router as `lamplight serve --replicas N` for one model, deployments.py)
under the route prefix `/lamplight-M` of Serve's one HTTP proxy, report its status and each
replica's state, delete it. Each application has its own ingress, hence its own prefix table:
prompts of different models never share a replica's cache anyway.

Serve's HTTP proxy listens on loopback (a free port, or the cluster's own proxy when Serve already
runs there): the router's port is the public one, and the router runs on the head node, where
`--ray-address auto` finds the cluster.

Every call blocks (Ray's client is synchronous): the router runs them in threads.
"""

from __future__ import annotations

import os
import re
import socket
import threading
from dataclasses import dataclass

from .launch import init_ray, serve_http_address, shutdown_ray, start_serve, use_cluster_token
from .prefix import DEFAULT_BLOCK_CHARS

APP_PREFIX = "lamplight-"
_NOT_IN_A_NAME = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class ClusterOptions:
    address: str | None = None  # None: a local Ray instance, shut down with the router
    route: str = "prefix"  # --route
    route_imbalance: int | None = None  # --route-imbalance (None: each model's -np)
    block_chars: int = DEFAULT_BLOCK_CHARS  # --route-block-chars
    models_at_once: int = 1  # local: how many models share this machine's CPUs (--models-max)
    idle_timeout: float = 5.0  # the proxy's keep-alive (the router keeps its connections open)


def app_name_for(model: str, taken: set[str]) -> str:
    """`lamplight-<model>`, with the characters a URL path segment should not hold replaced, and
    made unique among `taken`."""
    base = APP_PREFIX + (_NOT_IN_A_NAME.sub("-", model).strip("-") or "model")
    name, n = base, 2
    while name in taken:
        name, n = f"{base}-{n}", n + 1
    return name


class ServeCluster:
    def __init__(self, options: ClusterOptions):
        self.options = options
        self.local = not options.address
        self.http_address: tuple[str, int] | None = None
        self._deployed: set[str] = set()
        # A deploy and a delete of one application never overlap: a load cancelled mid-deploy
        # (its thread runs on) is deleted after its deploy was submitted, not before.
        self._changing = threading.Lock()

    def connect(self) -> None:
        """Ray (local, or the cluster at --ray-address) and Serve's HTTP proxy."""
        if not self.local:
            use_cluster_token()  # before Ray reads its configuration
        init_ray(self.options.address)
        start_serve("127.0.0.1", _free_port(), self.options.idle_timeout)
        self.http_address = serve_http_address()

    @property
    def url(self) -> str:
        host, port = self.http_address
        return f"http://{host}:{port}"

    def deploy(self, app_name: str, serve_argv: list[str], replicas: int) -> None:
        """Start deploying `lamplight serve <serve_argv>` as `replicas` replicas (returns at once;
        `app_status` follows it). ValueError: flags or a model that cannot be used."""
        from ray.serve.api import _run  # serve.run less its wait: the router polls, and can cancel

        from .deployments import build_application

        spec, num_cpus = self._replica_spec(serve_argv, replicas)
        options = self.options
        app = build_application(spec, replicas, options.route_imbalance, options.block_chars, num_cpus,
                                policy=options.route)
        with self._changing:
            self._deployed.add(app_name)
            _run(app, _blocking=False, name=app_name, route_prefix="/" + app_name)

    def _replica_spec(self, serve_argv: list[str], replicas: int):
        from lamplight.serve_options import serve_parser

        from .deployments import spec_from_args, threads_per_replica

        try:
            args = serve_parser().parse_args(serve_argv)
        except SystemExit:
            raise ValueError(f"the model's flags do not parse: {' '.join(serve_argv)}") from None
        args.replicas = replicas
        if self.local and not args.hf_repo:  # an alias is fetched once here, not once per replica
            from lamplight.sources import ModelSourceError, resolve_model

            try:
                args.model = str(resolve_model(args.model))
            except ModelSourceError as exc:
                raise ValueError(str(exc)) from None
        cpus = os.cpu_count() or 1
        threads = threads_per_replica(args, cpus)
        # A local instance is shared by the models loaded at once: each replica reserves its share
        # of the CPUs, so the next model's replicas can still be placed.
        share = cpus / (replicas * max(1, self.options.models_at_once))
        return spec_from_args(args, threads), (min(threads, share) if self.local else threads)

    def app_status(self, app_name: str) -> tuple[str, str]:
        """(Ray Serve's status of the application, its message): NOT_STARTED once it is gone."""
        from ray import serve

        status = serve.status().applications.get(app_name)
        return (status.status.value if hasattr(status.status, "value") else str(status.status),
                status.message or "") if status else ("NOT_STARTED", "")

    def applications(self) -> dict[str, dict]:
        """Ray Serve's details of every application (status, deployments, each replica's state)."""
        from ray.serve.context import _get_global_client

        return _get_global_client().get_serve_details().get("applications") or {}

    def delete(self, app_name: str) -> None:
        from ray import serve

        with self._changing:
            serve.delete(app_name)
            self._deployed.discard(app_name)

    def close(self) -> None:
        """A local instance: shut down with everything it started; a cluster: only our applications deleted."""
        shutdown_ray(self.local, sorted(self._deployed))


def replicas_json(details: dict | None, wanted: int) -> dict:
    """A model's `replicas` in GET /models: how many it asked for, the application's and its
    replica deployment's status, and each replica as Ray reports it."""
    details = details or {}
    deployment = (details.get("deployments") or {}).get("Replica") or {}
    each = [{key: replica.get(key) for key in ("replica_id", "state", "node_id", "node_ip", "pid", "start_time_s")}
            for replica in deployment.get("replicas") or ()]
    return {"count": wanted, "application": details.get("name"), "route_prefix": details.get("route_prefix"),
            "application_status": details.get("status"), "deployment_status": deployment.get("status"),
            "running": sum(1 for replica in each if replica["state"] == "RUNNING"), "each": each}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
