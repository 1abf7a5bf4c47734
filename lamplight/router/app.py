"""The router's HTTP API (llama-server's router mode):

- GET /models and /v1/models: every model with its status; POST /models/load and
  /models/unload with `{"model": NAME}`;
- GET /health: the router's own; GET /props: the router's, or with `?model=` the model's (a
  sleeping model's last one, `is_sleeping: true`, without waking it);
- everything else goes to a model's child: GET (and other bodiless) routes name it in `?model=`,
  POST routes in the body's `"model"`; it is loaded first where needed (--models-autoload, or
  `?autoload=true|false` on the request), and a request for a model that is loading waits for it.

The API key (and CORS) are checked here; children listen on loopback only.
"""

from __future__ import annotations

import contextlib
import hmac
import json
from dataclasses import dataclass

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from lamplight import __version__

from .errors import RouterError, json_response
from .instance import LOADED, SLEEPING
from .models import Models
from .proxy import forward

PUBLIC_PATHS = frozenset({"/health", "/v1/health"})
# Routes that do not count as using a model (llama-server's sleeping exemptions): they neither
# wake a sleeping model nor restart its idle timer.
NOT_USE = frozenset({"/health", "/v1/health", "/props", "/metrics", "/slots"})


@dataclass(frozen=True)
class HttpOptions:
    api_keys: tuple[str, ...] = ()
    cors_origins: tuple[str, ...] = ("*",)
    max_body_bytes: int = 16 * 2**20
    timeout: float = 3600.0  # reading a child's answer: as long as the server's --timeout


def create_app(models: Models, options: HttpOptions) -> Starlette:
    client = httpx.AsyncClient(timeout=httpx.Timeout(options.timeout, connect=10.0), limits=httpx.Limits(
        max_connections=None, max_keepalive_connections=64))
    api = RouterApi(models, options, client)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        models.start_background()
        await api.load_on_startup()
        yield
        await models.close()
        await client.aclose()

    routes = [Route("/health", api.health), Route("/v1/health", api.health),
              Route("/models", api.list_models), Route("/v1/models", api.list_models),
              Route("/models/load", api.load, methods=["POST"]), Route("/models/unload", api.unload, methods=["POST"]),
              Route("/props", api.props, methods=["GET"]),
              Route("/{path:path}", api.proxy, methods=["GET", "POST", "PUT", "DELETE", "PATCH"])]
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={RouterError: lambda request, exc: exc.response()})
    return PolicyMiddleware(app, options)


class RouterApi:
    def __init__(self, models: Models, options: HttpOptions, client: httpx.AsyncClient):
        self.models = models
        self.options = options
        self.client = client

    async def load_on_startup(self) -> None:
        for instance in self.models.instances.values():
            if instance.entry.preset.load_on_startup:
                await self.models.load(instance)

    async def health(self, request: Request) -> Response:
        return json_response({"status": "ok"})

    async def list_models(self, request: Request) -> Response:
        return json_response(await self.models.listing())

    async def load(self, request: Request) -> Response:
        instance = self.models.get(_body_model(await _json_body(request, self.options)), code=404)
        if instance.running:  # llama-server's answer: no second process for a loading model
            raise RouterError(400, f"model '{instance.name}' is already running ({instance.status})")
        await self.models.load(instance)
        return json_response({"success": True})

    async def unload(self, request: Request) -> Response:
        instance = self.models.get(_body_model(await _json_body(request, self.options)))
        if not instance.running and instance.status != SLEEPING:
            raise RouterError(400, f"model '{instance.name}' is not running ({instance.status})")
        await self.models.unload(instance)
        return json_response({"success": True})

    async def props(self, request: Request) -> Response:
        name = request.query_params.get("model")
        if not name:
            return json_response(self.router_props())
        instance = self.models.get(name)
        if instance.status == SLEEPING:
            return json_response({**(instance.props or {}), "is_sleeping": True})
        return await self.proxy(request)

    def router_props(self) -> dict:
        options = self.models.options
        return {"role": "router", "max_instances": options.models_max, "models_autoload": options.autoload,
                "sleep_idle_seconds": options.sleep_idle_seconds, "model_alias": "lamplight", "model_path": "none",
                "default_generation_settings": {"params": {}, "n_ctx": 0}, "build_info": f"lamplight {__version__}"}

    async def proxy(self, request: Request) -> Response:
        body = await _read_body(request, self.options)
        if request.method == "GET" or not body:
            name = request.query_params.get("model")
        else:
            name = _body_model(_parse_json(body))
        instance = self.models.get(name)
        uses_model = request.url.path not in NOT_USE
        if uses_model or instance.status != LOADED:
            await self.models.ensure_ready(instance, _autoload(request, self.models.options.autoload))
        return await forward(request, body, instance, self.client, counts_as_use=request.method == "POST",
                             on_unload_after=lambda seconds: self.models.set_unload_timer(instance.name, seconds))


def _autoload(request: Request, default: bool) -> bool:
    value = request.query_params.get("autoload")
    return default if value is None else value.lower() in ("true", "1")


async def _read_body(request: Request, options: HttpOptions) -> bytes:
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > options.max_body_bytes:
            raise RouterError(413, f"the request body is larger than the limit of {options.max_body_bytes} bytes "
                                   f"(--max-body-size)")
    return body


async def _json_body(request: Request, options: HttpOptions):
    return _parse_json(await _read_body(request, options))


def _parse_json(body: bytes):
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RouterError(400, f"the request body is not valid JSON: {exc}") from None


def _body_model(body) -> str | None:
    if not isinstance(body, dict):
        raise RouterError(400, "the request body must be a JSON object with a \"model\" field")
    return body.get("model")


class PolicyMiddleware:
    """CORS headers, OPTIONS preflights, the API key, the Server header. A plain ASGI middleware, so that streamed answers pass straight through."""

    def __init__(self, app, options: HttpOptions):
        self.app = app
        self.options = options

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        origin = request.headers.get("origin")

        async def send_with_headers(message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"server"]
                headers.append((b"server", b"lamplight"))
                if origin and self._origin_allowed(origin):
                    headers += [(b"access-control-allow-origin", origin.encode("latin-1")),
                                (b"access-control-allow-credentials", b"true"), (b"vary", b"Origin")]
                message = {**message, "headers": headers}
            await send(message)

        if scope["method"] == "OPTIONS":
            await self._preflight(request)(scope, receive, send_with_headers)
            return
        if self.options.api_keys and scope["path"] not in PUBLIC_PATHS and not self._authorized(request):
            await RouterError(401, "Invalid API Key").response()(scope, receive, send_with_headers)
            return
        await self.app(scope, receive, send_with_headers)

    def _authorized(self, request: Request) -> bool:
        """`Authorization: Bearer <key>` (OpenAI) or `X-Api-Key: <key>` (Anthropic), as lamplight's server."""
        authorization = request.headers.get("authorization", "")
        given = [request.headers.get("x-api-key", "")]
        if authorization[:7].lower() == "bearer ":
            given.append(authorization[7:].strip())
        return any(hmac.compare_digest(candidate.encode(), key.encode())
                   for candidate in given if candidate for key in self.options.api_keys)

    def _origin_allowed(self, origin: str) -> bool:
        return "*" in self.options.cors_origins or origin in self.options.cors_origins

    def _preflight(self, request: Request) -> Response:
        return Response(status_code=200, headers={
            "Access-Control-Allow-Methods": "GET, POST",
            "Access-Control-Allow-Headers": request.headers.get("access-control-request-headers") or "*",
            "Access-Control-Max-Age": "86400"})
