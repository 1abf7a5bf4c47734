"""Errors of the chat layer; the HTTP layer answers every one of them with a 400."""

from __future__ import annotations


class ChatTemplateError(ValueError):
    """A request or template problem: bad messages, template syntax, raise_exception(), undefined misuse."""


class MultimodalNotSupported(ChatTemplateError):
    """A message carries image/audio/video parts but the model has no multimodal projector."""
