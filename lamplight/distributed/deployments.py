"""The two Ray Serve deployments and the application that joins them.

`Ingress` (one replica, no CPU reserved) owns the HTTP side: Ray Serve's proxy hands it every
request on the one port, and it forwards the raw request (method, path, query, headers, body) to
a `Replica` through a streaming deployment handle, relaying the replica's ASGI messages back
unchanged: status, headers and body chunks, so streams stay streams. `Replica` runs lamplight's
own app (create_app, its middleware, every route) in-process on its own engine.

The ingress answers itself only what concerns all replicas: `/health` (ready when any replica
answers it), `/metrics` (each replica's, labelled `replica="ID"`) and `/slots...` (need
`?replica=ID`; each response names its replica in the `X-Lamplight-Replica` header).

Faults: a replica that dies is restarted by Ray Serve. A request it held is sent to another
replica when nothing of its response had reached the client yet; one already streaming ends
(with an SSE error event for an event stream); one that no replica took answers 503.
"""

import asyncio
import dataclasses
import logging
import os
import re
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from ray import serve
from ray.serve.config import RequestRouterConfig
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from lamplight.server.errors import ApiError, body_too_large, model_loading, not_found

from .prefix import DEFAULT_BLOCK_CHARS, prefix_hashes
from . import routing  # by module: Ray Serve pickles the ingress class by value, globals copied

APP_NAME = "lamplight"
REPLICA_HEADER = "x-lamplight-replica"  # on every forwarded response: the replica that served it
RETRIES_HEADER = "x-lamplight-retries"  # on a response served after N replicas failed it
HEALTH_PATHS = frozenset({"/health", "/v1/health"})
RETRIES = 3  # attempts for a request whose replica failed before any of its response was sent
HEALTH_TIMEOUT_S = 5.0
TARGETED_TIMEOUT_S = 120.0  # /slots and /metrics to one named replica
log = logging.getLogger("lamplight.distributed")


@dataclass
class ReplicaSpec:
    """What each replica loads and serves (the per-replica flags)."""

    model: str
    settings: Any  # lamplight.server.ServerSettings
    options: Any  # lamplight.server.launcher.EngineOptions
    threads: int = 1
    chat_template: str | None = None
    chat_template_file: str | None = None
    hf_repo: str | None = None
    hf_file: str | None = None
    hf_token: str | None = None


class Replica:
    """One lamplight server (model, engine, app) inside a Ray Serve replica."""

    def __init__(self, spec: ReplicaSpec):
        from lamplight.server import ServerState
        from lamplight.server.app import create_app
        from lamplight.server.launcher import build_engine, load_model
        from lamplight.threads import request_threads

        context = serve.get_replica_context()
        self.replica_id = context.replica_id.unique_id
        rank = getattr(getattr(context, "rank", None), "rank", None)
        settings = spec.settings
        if settings.slot_save_path:  # one subfolder per replica: replica-<rank>
            folder = os.path.join(settings.slot_save_path, f"replica-{rank if rank is not None else self.replica_id}")
            os.makedirs(folder, exist_ok=True)
            settings = dataclasses.replace(settings, slot_save_path=folder)
        request_threads(max(1, spec.threads))  # before loading, as the CLI's -t
        model = spec.model
        if spec.hf_repo:
            from lamplight.hf_hub import resolve_hf

            model = str(resolve_hf(spec.hf_repo, filename=spec.hf_file, token=spec.hf_token))
        loaded = load_model(model, spec.options, chat_template=spec.chat_template,
                            chat_template_file=spec.chat_template_file)
        self.engine = build_engine(loaded, spec.options)
        self.state = ServerState(settings)
        self.state.attach(loaded, self.engine)
        self.app = create_app(self.state)
        log.info("replica %s (rank %s) ready: %s, %d threads", self.replica_id, rank, loaded.name, spec.threads)

    async def handle(self, request: dict, body: bytes, route: dict | None = None):
        """Run one HTTP request through lamplight's app; yields its ASGI send messages."""
        messages: asyncio.Queue = asyncio.Queue()
        gone = asyncio.Event()
        body_sent = False

        async def receive() -> dict:
            nonlocal body_sent
            if not body_sent:
                body_sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            if message["type"] == "http.response.start":
                # Ray Serve's proxy (uvicorn) sends its own `server` header: lamplight's would be a second.
                headers = [(k, v) for k, v in message.get("headers", ()) if k.lower() != b"server"]
                message = {**message, "headers": [*headers, (REPLICA_HEADER.encode(), self.replica_id.encode())]}
            await messages.put(message)

        async def run() -> None:
            try:
                await self.app(_scope(request), receive, send)
            finally:
                await messages.put(None)

        task = asyncio.create_task(run())
        try:
            while (message := await messages.get()) is not None:
                yield message
        finally:
            gone.set()  # the client went away (or the response is complete): the app sees a disconnect
            if not task.done():
                task.add_done_callback(lambda t: t.cancelled() or t.exception())

    def check_health(self) -> None:
        if not self.engine.is_ready:
            raise RuntimeError("the engine stopped")

    def __del__(self):
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.stop()


def _scope(request: dict) -> Scope:
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "scheme": "http",
            "method": request["method"], "path": request["path"], "raw_path": request["path"].encode(),
            "root_path": "", "query_string": request["query_string"], "headers": request["headers"],
            "client": request.get("client"), "server": request.get("server")}


def app_path(scope: Scope) -> str:
    """The request's path below its application's route prefix (router mode deploys each model
    under its own, `/lamplight-NAME`): what a lamplight server on its own would have been asked."""
    path, prefix = scope["path"], scope.get("root_path", "")
    if prefix and (path == prefix or path.startswith(prefix + "/")):
        return path[len(prefix):] or "/"
    return path


class ForwardedResponse(Response):
    """Relays a replica's ASGI messages: `start` (http.response.start), `first` (the first
    http.response.body), then the rest of `stream`."""

    def __init__(self, start: dict, first: dict, stream):
        self.start, self.first, self.stream = start, first, stream
        self.status_code = start["status"]
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        event_stream = any(k.lower() == b"content-type" and v.startswith(b"text/event-stream")
                           for k, v in self.start.get("headers", ()))
        finished = not self.first.get("more_body", False)
        try:
            await send(self.start)
            await send(self.first)
            if finished:
                return
            async for message in self.stream:
                await send(message)
                finished = not message.get("more_body", False)
            if not finished:
                raise RuntimeError("the replica's response ended early")
        except Exception as exc:  # the replica died mid-response (or the client left)
            log.warning("a response from a replica was cut short: %s", exc)
            if event_stream and not finished:
                error = ApiError(503, "the replica serving this stream failed; try again")
                await _send_quietly(send, {"type": "http.response.body", "more_body": True,
                                           "body": b"data: " + error.response().body + b"\n\n"})
        finally:
            self.stream.cancel()
            if not finished:
                await _send_quietly(send, {"type": "http.response.body", "body": b"", "more_body": False})

    async def read(self) -> bytes:
        chunks = [self.first.get("body", b"")]
        async for message in self.stream:
            chunks.append(message.get("body", b""))
        return b"".join(chunks)


async def _send_quietly(send: Send, message: dict) -> None:
    try:
        await send(message)
    except Exception:  # the client is gone
        pass


async def _read(response: Response) -> bytes:
    return await response.read() if isinstance(response, ForwardedResponse) else response.body


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?(\s.*)$")


def label_metrics(text: str, replica_id: str, seen_meta: set) -> str:
    """Prometheus text with `replica="ID"` added to every sample; HELP/TYPE lines kept once."""
    out = []
    for line in text.splitlines():
        if line.startswith("#"):
            if line not in seen_meta:
                seen_meta.add(line)
                out.append(line)
            continue
        match = _SAMPLE.match(line)
        if not match:
            continue
        name, labels, rest = match.groups()
        inner = labels[1:-1] if labels else ""
        inner = f'replica="{replica_id}"' + (f",{inner}" if inner else "")
        out.append(f"{name}{{{inner}}}{rest}")
    return "\n".join(out) + "\n" if out else ""


# Defined after the helpers it uses: Ray Serve serializes the ingress class when it is decorated.
ingress_app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
ALL_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"]


@serve.ingress(ingress_app)
class Ingress:
    def __init__(self, replicas, max_body_bytes: int, block_chars: int = DEFAULT_BLOCK_CHARS):
        self.replicas = replicas.options(stream=True)
        self.max_body_bytes = max_body_bytes
        self.block_chars = block_chars

    @ingress_app.api_route("/{path:path}", methods=ALL_METHODS)
    async def forward(self, request: Request, path: str) -> Response:
        body = await self._body(request)
        if isinstance(body, Response):
            return body
        raw = {"method": request.method, "path": app_path(request.scope), "headers": list(request.headers.raw),
               "query_string": request.url.query.encode("latin-1"),
               "client": tuple(request.client) if request.client else None, "server": None}
        target = request.query_params.get("replica")
        if raw["path"] in HEALTH_PATHS and not target:
            return await self._health(raw)
        if raw["path"] == "/metrics" and not target and request.method == "GET":
            return await self._metrics(raw)
        if raw["path"].startswith("/slots") and request.method != "OPTIONS":
            if not target:
                ids = await self._replica_ids()
                return ApiError(400, "with replicas, /slots addresses one replica: add ?replica=ID "
                                f"(replicas: {', '.join(ids) or 'none ready'}; each response names its "
                                f"replica in the {REPLICA_HEADER} header)").response()
        if target:
            if target not in await self._replica_ids():
                return ApiError(404, f"no replica {target!r} (replicas: {', '.join(await self._replica_ids())})",
                                "not_found_error").response()
            return await self._forward(raw, body, {"replica": target}, first_timeout=TARGETED_TIMEOUT_S)
        return await self._forward(raw, body, {"prefix": prefix_hashes(body, self.block_chars)})

    async def _body(self, request: Request) -> bytes | Response:
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.max_body_bytes:
                return body_too_large(self.max_body_bytes).response()
            chunks.append(chunk)
        return b"".join(chunks)

    async def _forward(self, raw: dict, body: bytes, route: dict, first_timeout: float | None = None) -> Response:
        failure: BaseException | None = None
        for attempt in range(RETRIES):
            stream = self.replicas.handle.remote(raw, body, route=route)  # a keyword: the router reads it
            try:
                # The status and the first body chunk: until both are here nothing has reached the
                # client, and a replica that fails is replaced by another.
                start = await asyncio.wait_for(stream.__anext__(), first_timeout)
                first = await stream.__anext__()
                if attempt:  # say that another replica failed this request first
                    start = {**start, "headers": [*start["headers"], (RETRIES_HEADER.encode(), str(attempt).encode())]}
                return ForwardedResponse(start, first, stream)
            except asyncio.CancelledError:  # the client left (or /health's deadline passed)
                stream.cancel()
                raise
            except (StopAsyncIteration, asyncio.TimeoutError) as exc:
                stream.cancel()
                failure = exc
                break
            except Exception as exc:  # the replica died or was unreachable: nothing was sent yet
                stream.cancel()
                failure = exc
                log.warning("request %s %s failed on a replica (attempt %d): %s",
                            raw["method"], raw["path"], attempt + 1, exc, exc_info=True)
                await asyncio.sleep(0.2 * (attempt + 1))
        reason = str(failure).strip().splitlines()[-1][:300] if str(failure).strip() else type(failure).__name__
        return ApiError(503, f"no replica could serve the request ({reason}); try again").response()

    async def _replica_ids(self, wait_s: float = 0.0) -> list[str]:
        router = routing.ROUTERS.get(serve.get_replica_context().app_name)
        deadline = asyncio.get_running_loop().time() + wait_s
        while True:
            ids = router.replica_ids() if router is not None else []
            if ids or asyncio.get_running_loop().time() >= deadline:
                return ids
            await asyncio.sleep(0.1)
            router = routing.ROUTERS.get(serve.get_replica_context().app_name)

    async def _health(self, raw: dict) -> Response:
        """Ready when at least one replica is: the first replica to answer /health speaks."""
        try:
            return await asyncio.wait_for(self._forward(raw, b"", {}), HEALTH_TIMEOUT_S)
        except asyncio.TimeoutError:
            return model_loading().response()

    async def _metrics(self, raw: dict) -> Response:
        """Every replica's /metrics, each sample labelled with its replica."""
        ids = await self._replica_ids(wait_s=HEALTH_TIMEOUT_S)
        if not ids:  # the router is created with the first request: route one, then list
            await self._health({**raw, "path": "/health", "query_string": b""})
            ids = await self._replica_ids(wait_s=HEALTH_TIMEOUT_S)
        parts, status, seen = [], 200, set()
        for replica_id in ids:
            response = await self._forward(raw, b"", {"replica": replica_id}, first_timeout=TARGETED_TIMEOUT_S)
            text = (await _read(response)).decode()
            if response.status_code != 200:
                if not parts:
                    return Response(text, status_code=response.status_code, media_type="application/json")
                continue
            parts.append(label_metrics(text, replica_id, seen))
        return Response("".join(parts), status_code=status, media_type="text/plain; version=0.0.4; charset=utf-8")


def build_application(spec: ReplicaSpec, replicas: int, max_imbalance: int | None = None,
                      block_chars: int = DEFAULT_BLOCK_CHARS, num_cpus: float | None = None,
                      policy: str = "prefix"):
    """The Ray Serve application: an ingress over `replicas` replicas of `spec`."""
    options = spec.options
    router = RequestRouterConfig(
        request_router_class="lamplight.distributed.routing.PrefixAffinityRouter",
        request_router_kwargs={"max_imbalance": options.n_parallel if max_imbalance is None else max_imbalance,
                               "policy": policy})
    replica = serve.deployment(Replica, name="Replica").options(
        num_replicas=replicas, max_ongoing_requests=options.n_parallel + options.queue_size,
        ray_actor_options={"num_cpus": spec.threads if num_cpus is None else num_cpus},
        request_router_config=router, health_check_period_s=2, health_check_timeout_s=30,
        graceful_shutdown_timeout_s=5)
    ingress = serve.deployment(Ingress, name="Ingress").options(
        num_replicas=1, max_ongoing_requests=4096, ray_actor_options={"num_cpus": 0})
    return ingress.bind(replica.bind(spec), spec.settings.limits.max_body_bytes, block_chars)


def spec_from_args(args, threads: int) -> ReplicaSpec:
    from lamplight.serve_options import engine_options, server_settings

    return ReplicaSpec(model=args.model, settings=server_settings(args), options=engine_options(args),
                       threads=threads, chat_template=args.chat_template,
                       chat_template_file=args.chat_template_file, hf_repo=args.hf_repo,
                       hf_file=args.hf_file, hf_token=args.hf_token)


def threads_per_replica(args, cpus: int) -> int:
    """-t (or this machine's CPUs) split between the replicas, at least one each."""
    total = args.threads if args.threads > 0 else cpus
    return max(1, total // max(1, args.replicas))


def build_app(config: dict):
    """For `serve run lamplight.distributed:build_app model=M replicas=N ctx-size=2048 ...`:
    every key is a `lamplight serve` flag (without its dashes), `flag=true` for a switch."""
    from lamplight.serve_options import serve_parser

    argv = []
    for key, value in config.items():
        flag = "--" + key.replace("_", "-")
        argv += [flag] if str(value).lower() == "true" else [flag, str(value)]
    args = serve_parser().parse_args(argv)
    args.replicas = args.replicas or 1
    return build_application(spec_from_args(args, threads_per_replica(args, os.cpu_count() or 1)),
                             args.replicas, args.route_imbalance, args.route_block_chars, policy=args.route)
