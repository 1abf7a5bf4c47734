"""llama-server's pre-routing rules, in its order: `--api-prefix` taken off the path -> CORS
headers -> OPTIONS preflight answered -> 503 while the model loads -> API key; then the body's
limits (size: 413, read deadline: 408). Every response also gets `Server: lamplight`.

A plain ASGI middleware (not BaseHTTPMiddleware) so streaming responses pass straight through.
"""

from __future__ import annotations

import asyncio
import hmac
import logging

from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import ApiError, body_too_large, body_too_slow, error_response, invalid_api_key, model_loading
from .state import ServerState
from .webui import is_static_request

PUBLIC_PATHS = frozenset({"/health", "/v1/health"})
SERVER_NAME = "lamplight"
log = logging.getLogger("lamplight.server")


class HttpPolicyMiddleware:
    def __init__(self, app: ASGIApp, state: ServerState):
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        scope = without_prefix(scope, self.state.settings.api_prefix)
        request_headers = Headers(scope=scope)
        started = False

        async def send_with_headers(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = MutableHeaders(scope=message)
                headers["Server"] = SERVER_NAME
                self._add_cors_headers(headers, request_headers)
            await send(message)

        try:
            rejection = self._reject(scope, request_headers)
            if rejection is not None:
                await error_response(rejection, scope["path"])(scope, receive, send_with_headers)
            elif scope["method"] == "OPTIONS":
                await self._preflight(scope, receive, send_with_headers, request_headers)
            else:
                await self.app(scope, self._limited_receive(receive), send_with_headers)
        except Exception as exc:  # the last resort: a JSON 500 instead of a bare connection error
            log.exception("unhandled error on %s %s", scope["method"], scope["path"])
            if not started:
                error = exc if isinstance(exc, ApiError) else ApiError(500, f"{type(exc).__name__}: {exc}")
                await error_response(error, scope["path"])(scope, receive, send_with_headers)

    def _reject(self, scope: Scope, headers: Headers) -> ApiError | None:
        if scope["method"] == "OPTIONS":
            return None
        if is_static_request(self.state.settings, scope["method"], scope["path"]):
            return None  # the chat page is public and shows the loading state itself
        if not self.state.ready:
            return model_loading()
        if self.state.settings.api_keys and scope["path"] not in PUBLIC_PATHS and not self._authorized(headers):
            return invalid_api_key()
        limit = self.state.settings.limits.max_body_bytes
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > limit:
            return body_too_large(limit)
        return None

    def _limited_receive(self, receive: Receive) -> Receive:
        """`receive`, but the body must stay within the size limit and arrive within `-to`
        seconds (a trickling client times out; it never holds anyone else up)."""
        limit = self.state.settings.limits.max_body_bytes
        timeout = self.state.settings.timeout
        received = 0
        deadline: float | None = None
        body_done = False

        async def limited() -> Message:
            nonlocal received, deadline, body_done
            if body_done:  # after the body: disconnect notices, which may come at any time
                return await receive()
            loop = asyncio.get_running_loop()
            deadline = deadline or loop.time() + timeout
            try:
                message = await asyncio.wait_for(receive(), max(deadline - loop.time(), 0.0))
            except asyncio.TimeoutError:
                raise body_too_slow(timeout) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise body_too_large(limit)
                body_done = not message.get("more_body", False)
            return message

        return limited

    def _authorized(self, headers: Headers) -> bool:
        """`Authorization: Bearer <key>` (OpenAI) or `X-Api-Key: <key>` (Anthropic)."""
        authorization = headers.get("authorization", "")
        given = [headers.get("x-api-key", "")]
        if authorization[:7].lower() == "bearer ":
            given.append(authorization[7:].strip())
        return any(hmac.compare_digest(candidate.encode(), key.encode())
                   for candidate in given if candidate for key in self.state.settings.api_keys)

    def _add_cors_headers(self, headers: MutableHeaders, request_headers: Headers) -> None:
        origin = request_headers.get("origin")
        settings = self.state.settings
        if origin and settings.origin_allowed(origin):
            headers["Access-Control-Allow-Origin"] = origin
            if settings.cors_credentials:
                headers["Access-Control-Allow-Credentials"] = "true"
            headers.append("Vary", "Origin")

    async def _preflight(self, scope: Scope, receive: Receive, send: Send, request_headers: Headers) -> None:
        from starlette.responses import Response

        settings = self.state.settings
        allow_headers = settings.cors_headers
        if allow_headers == "*":  # llama-server's default: whatever the preflight asks for
            allow_headers = request_headers.get("access-control-request-headers") or "*"
        response = Response(status_code=200, headers={
            "Access-Control-Allow-Methods": settings.cors_methods,
            "Access-Control-Allow-Headers": allow_headers,
            "Access-Control-Max-Age": "86400",
        })
        await response(scope, receive, send)


def without_prefix(scope: Scope, prefix: str) -> Scope:
    """`--api-prefix`: a path under the prefix is served as the path without it (the routes also
    answer without the prefix, as before)."""
    path = scope["path"]
    if not prefix or not (path == prefix or path.startswith(prefix + "/")):
        return scope
    raw_prefix = prefix.encode()
    raw_path = scope.get("raw_path") or path.encode()
    return {**scope, "path": path[len(prefix):] or "/",
            "raw_path": raw_path[len(raw_prefix):] if raw_path.startswith(raw_prefix) else raw_path}
