"""The error of an input an embedding model cannot take, apart from the models (no torch): the
server's API layer catches it without importing them."""

from __future__ import annotations


class EmbeddingInputError(ValueError):
    """An input the model cannot embed; `kind` is the API error type, `extra` its fields."""

    def __init__(self, message: str, kind: str = "invalid_request_error", **extra):
        super().__init__(message)
        self.kind = kind
        self.extra = extra
