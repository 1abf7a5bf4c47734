"""The FastAPI application: routes, the HTTP policy middleware and llama-server's error shape
for everything FastAPI would otherwise answer in its own format (404, 405, 422)."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from lamplight import __version__

# llama-server's and OpenAI's routes, then the other APIs' (Responses, Anthropic Messages, Ollama).
from . import api_anthropic, api_embeddings, api_ollama, api_responses, routes_misc, routes_native, routes_openai, webui
from .errors import ApiError, error_response, invalid_request, not_found
from .generation import ClientDisconnected
from .json_io import json_response
from .middleware import HttpPolicyMiddleware
from .state import ServerState


def create_app(state: ServerState) -> FastAPI:
    app = FastAPI(title="lamplight", version=__version__, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.lamplight = state
    if state.settings.props:  # --props: before routes_misc's POST /props, which answers 501
        app.add_api_route("/props", _props_accepted, methods=["POST"])
    for module in (routes_openai, routes_native, routes_misc, api_responses, api_anthropic, api_ollama):
        app.include_router(module.router)
    app.include_router(api_embeddings.embeddings_router(served=_served_embedder))
    app.include_router(webui.router)  # last: its catch-all GET serves only what no API route took
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(ClientDisconnected, _client_gone)
    app.add_middleware(HttpPolicyMiddleware, state=state)
    return app


def _served_embedder(request: Request) -> api_embeddings.Served:
    """What the embedding routes serve, read at each request (the model loads after the routes exist)."""
    state: ServerState = request.app.state.lamplight
    if state.embedder is None and not state.ready:
        state.require_ready()  # still loading: 503, as every route
    return api_embeddings.Served(state.embedder, state.reranking, state.model_name if state.model is not None else "",
                                 state.settings.embd_normalize)


async def _props_accepted(request: Request) -> Response:
    """As llama-server's POST /props: accepted, and nothing changes."""
    return json_response({"success": True})


async def _api_error(request: Request, exc: ApiError) -> Response:
    return error_response(exc, request.url.path)


async def _http_error(request: Request, exc: HTTPException) -> Response:
    # Unknown paths and wrong methods alike: llama-server's router has no route for them.
    if exc.status_code in (404, 405):
        return error_response(not_found(), request.url.path)
    return error_response(ApiError(exc.status_code, str(exc.detail)), request.url.path)


async def _validation_error(request: Request, exc: RequestValidationError) -> Response:
    return error_response(invalid_request(str(exc)), request.url.path)


async def _client_gone(request: Request, exc: ClientDisconnected) -> Response:
    return Response(status_code=499)  # nobody reads it; the generation is already cancelled
