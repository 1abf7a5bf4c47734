"""A chat request's `messages` (+ tools, template kwargs) -> the prompt text, via the model's template.

With tools, lamplight.tools decides what the template gets: the request's tools (templates that
render them) or the generic JSON protocol spelled out in the messages (templates that do not).
"""

from __future__ import annotations

from typing import Any

from lamplight.chat import ChatTemplateError
from lamplight.tools import prompt_inputs

from .constraints import chat_tool_plan
from .errors import invalid_request
from .fields import Fields

_PLAN_FROM_BODY = object()


def render_chat_prompt(body: dict, chat_template: Any, tool_plan: Any = _PLAN_FROM_BODY) -> str:
    """`tool_plan`: the request's lamplight.tools.ToolPlan (or None); read from the body when not given."""
    fields = Fields(body)
    if body.get("messages") is None:
        raise invalid_request("'messages' is required")
    extra = fields.object("chat_template_kwargs")
    add_generation_prompt = fields.boolean("add_generation_prompt", True)
    if tool_plan is _PLAN_FROM_BODY:
        tool_plan = chat_tool_plan(fields, chat_template)
    try:
        messages, tools = prompt_inputs(body["messages"], chat_template, tool_plan)
        return chat_template.render(messages, add_generation_prompt=add_generation_prompt,
                                    tools=tools, extra=extra)
    except ChatTemplateError as exc:
        raise invalid_request(str(exc)) from None
