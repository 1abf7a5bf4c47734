"""llama-server's error responses: `{"error": {"code", "message", "type", ...}}`; and the other
APIs' shapes for their own paths (register_error_shape: Anthropic's, Ollama's ...)."""

from __future__ import annotations

from typing import Any, Callable

from starlette.responses import Response

from lamplight.engine.types import ContextExceededError, EngineError, InvalidRequestError, QueueFullError

from .json_codec import json_response  # not json_io: that one raises these errors

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    500: "server_error",
    501: "not_supported_error",
    503: "unavailable_error",
}


class ApiError(Exception):
    """Raised anywhere in a handler; answered with the error JSON and its HTTP status."""

    def __init__(self, code: int, message: str, type: str | None = None, **extra: Any):
        super().__init__(message)
        self.code = code
        self.message = message
        self.type = type or ERROR_TYPES.get(code, "server_error")
        self.extra = extra

    def body(self) -> dict:
        return {"error": {"code": self.code, "message": self.message, "type": self.type, **self.extra}}

    def response(self) -> Response:
        return json_response(self.body(), status_code=self.code)


ErrorShape = Callable[[ApiError], Response]
_SHAPES: list[tuple[tuple[str, ...], ErrorShape]] = []


def register_error_shape(paths: tuple[str, ...], shape: ErrorShape) -> None:
    """Errors on these paths (and below them) are answered by `shape` instead of llama-server's
    JSON: an API's own error shape, whichever layer refuses the request (API key, body limits,
    the handler)."""
    _SHAPES.append((paths, shape))


def error_response(exc: ApiError, path: str) -> Response:
    for paths, shape in _SHAPES:
        if any(path == p or path.startswith(p + "/") for p in paths):
            return shape(exc)
    return exc.response()


def invalid_request(message: str) -> ApiError:
    return ApiError(400, message)


def field_error(name: str, reason: str) -> ApiError:
    return ApiError(400, f"Field '{name}': {reason}")


def body_too_large(limit: int) -> ApiError:
    return ApiError(413, f"the request body is larger than the limit of {limit} bytes (--max-body-size)")


def body_too_slow(timeout: float) -> ApiError:
    return ApiError(408, f"the request body did not arrive within {timeout:g} seconds (--timeout)")


def not_found() -> ApiError:
    return ApiError(404, "File Not Found")


def model_loading() -> ApiError:
    return ApiError(503, "Loading model")


def invalid_api_key() -> ApiError:
    return ApiError(401, "Invalid API Key")


def not_supported(message: str) -> ApiError:
    return ApiError(501, message)


def from_engine_error(exc: EngineError) -> ApiError:
    """The HTTP answer to an error `Engine.submit` raised."""
    if isinstance(exc, ContextExceededError):
        return ApiError(400, str(exc), "exceed_context_size_error",
                        n_prompt_tokens=exc.n_prompt_tokens, n_ctx=exc.n_ctx)
    if isinstance(exc, QueueFullError):
        return ApiError(503, str(exc))
    if isinstance(exc, InvalidRequestError):
        return ApiError(400, str(exc))
    return ApiError(500, str(exc))
