"""A chat request's `messages` (+ tools, template kwargs) -> the prompt text, via the model's template;
and the reasoning budget that goes with that prompt.

With tools, lamplight.tools decides what the template gets: the request's tools (templates that
render them) or the generic JSON protocol spelled out in the messages (templates that do not).
"""

from __future__ import annotations

from typing import Any

from lamplight.chat import ChatTemplateError
from lamplight.chat.messages import with_media_markers
from lamplight.chat.reasoning import opens_thinking, plan_reasoning
from lamplight.sampling.reasoning_budget import ReasoningBudgetSpec
from lamplight.tools import prompt_inputs, template_tools

from .constraints import chat_tool_plan
from .errors import invalid_request
from .fields import Fields

_PLAN_FROM_BODY = object()


def render_chat_prompt(body: dict, chat_template: Any, tool_plan: Any = _PLAN_FROM_BODY,
                       *, for_generation: bool = True, reasoning_budget: int = -1,
                       template_kwargs: Any = None, media_marker: str | None = None) -> str:
    """`tool_plan`: the request's lamplight.tools.ToolPlan (or None); read from the body when not given.

    `media_marker`: the server's marker when it has a vision model: each image part renders as
    it (lamplight.chat.messages.with_media_markers); None: image parts are refused.

    `for_generation` False (/apply-template) renders the template as llama.cpp does, without the
    generic tool protocol: its instruction and its rewriting of tool turns are added only when
    the prompt is for a generation (/v1/chat/completions) with a template that has no native
    tool format. `template_kwargs`: ServerSettings.template_kwargs (the server's template
    variables under the request's chat_template_kwargs); None: the request's alone."""
    fields = Fields(body)
    if body.get("messages") is None:
        raise invalid_request("'messages' is required")
    extra = fields.object("chat_template_kwargs")
    if template_kwargs is not None:  # --chat-template-kwargs, --reasoning-effort
        extra = template_kwargs(extra)
    if reasoning_budget == 0 and "enable_thinking" not in (extra or {}):
        extra = {**(extra or {}), "enable_thinking": False}
    add_generation_prompt = fields.boolean("add_generation_prompt", True)
    if tool_plan is _PLAN_FROM_BODY:
        tool_plan = chat_tool_plan(fields, chat_template)
    try:
        messages = body["messages"] if media_marker is None else with_media_markers(body["messages"], media_marker)
        if for_generation:
            messages, tools = prompt_inputs(messages, chat_template, tool_plan)
        else:
            tools = template_tools(chat_template, tool_plan)
        prompt = chat_template.render(messages, add_generation_prompt=add_generation_prompt,
                                      tools=tools, extra=extra)
    except ChatTemplateError as exc:
        raise invalid_request(str(exc)) from None
    return _close_thinking(prompt, chat_template) if reasoning_budget == 0 else prompt


def continues_thinking(body: dict) -> bool:
    """The prompt continues a final assistant message that has reasoning but no content: it ends
    inside that message's thinking block (lamplight.chat.prefill), so the reply starts there."""
    messages = body.get("messages")
    last = messages[-1] if isinstance(messages, list) and messages else None
    return (isinstance(last, dict) and last.get("role") == "assistant" and not last.get("content")
            and bool(last.get("reasoning_content")))


def _close_thinking(prompt: str, chat_template: Any) -> str:
    """The prompt with an open thinking block at its end closed (no budget for thinking)."""
    markers = getattr(chat_template, "reasoning", None)
    if markers is not None and opens_thinking(prompt, markers):
        return prompt + markers.end
    return prompt


def reasoning_budget_spec(chat_template: Any, prompt: str, budget: int, message: str,
                          tokenizer: Any, continues: bool = False) -> ReasoningBudgetSpec | None:
    """The reasoning budget of a chat reply to `prompt` (lamplight.sampling.reasoning_budget), or
    None when thinking is unlimited (-1) or the template has no thinking markers.

    The markers are tokenized as llama.cpp tokenizes its thinking tags (no BOS, special tokens
    parsed). Forced when the budget runs out: `message`, the end marker, then the answer prefix
    of families that open the answer with one (gpt-oss's final channel). The budget counts from
    the prompt's end when the prompt opened the thinking (the reasoning parser's rule)."""
    markers = getattr(chat_template, "reasoning", None)
    if budget < 0 or markers is None:
        return None

    def tokens(text: str) -> tuple[int, ...]:
        return tuple(tokenizer.encode(text, add_special=False, parse_special=True)) if text else ()

    end = tokens(markers.end)
    opened = plan_reasoning(markers, "auto", prompt, continues).opened
    return ReasoningBudgetSpec(budget=budget, start=tokens(markers.start), end=end,
                               forced=tokens(message) + end + tokens(markers.answer_prefix), opened=opened)
