"""Chat templates: message validation, llama-server compatible Jinja rendering, template selection."""

from lamplight.chat.builtin import BUILTIN_TEMPLATES
from lamplight.chat.errors import ChatTemplateError, MultimodalNotSupported
from lamplight.chat.messages import normalize_messages
from lamplight.chat.resolve import resolve_chat_template
from lamplight.chat.template import ChatTemplate

__all__ = [
    "BUILTIN_TEMPLATES",
    "ChatTemplate",
    "ChatTemplateError",
    "MultimodalNotSupported",
    "normalize_messages",
    "resolve_chat_template",
]
