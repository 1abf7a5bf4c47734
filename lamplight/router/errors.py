"""The router's error answers, in llama-server's JSON shape `{"error": {"code", "message", "type"}}`.

(lamplight.server.errors has the same shape, but importing it imports the whole server package.)
"""

from __future__ import annotations

import json

from starlette.responses import Response

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
               413: "invalid_request_error", 500: "server_error", 501: "not_supported_error",
               502: "server_error", 503: "unavailable_error"}


class RouterError(Exception):
    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code
        self.message = message

    def response(self) -> Response:
        return json_response({"error": {"code": self.code, "message": self.message,
                                        "type": ERROR_TYPES.get(self.code, "server_error")}}, self.code)


def json_response(body, status: int = 200) -> Response:
    text = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
    return Response(text, status_code=status, media_type="application/json; charset=utf-8")
