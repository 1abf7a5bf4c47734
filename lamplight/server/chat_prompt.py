"""A chat request's `messages` (+ tools, template kwargs) -> the prompt text, via the model's template."""

from __future__ import annotations

from typing import Any

from lamplight.chat import ChatTemplateError

from .constraints import chat_tools
from .errors import invalid_request
from .fields import Fields


def render_chat_prompt(body: dict, chat_template: Any) -> str:
    fields = Fields(body)
    if body.get("messages") is None:
        raise invalid_request("'messages' is required")
    extra = fields.object("chat_template_kwargs")
    add_generation_prompt = fields.boolean("add_generation_prompt", True)
    tools = chat_tools(fields)
    try:
        return chat_template.render(body["messages"], add_generation_prompt=add_generation_prompt,
                                    tools=tools, extra=extra)
    except ChatTemplateError as exc:
        raise invalid_request(str(exc)) from None
