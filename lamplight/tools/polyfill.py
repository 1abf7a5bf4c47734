"""The tool list for templates that render tool calls but not `tools` (DeepSeek R1 distills,
DeepSeek V3.1): the system text llama.cpp's template engine (minja's `chat_template::apply`
"polyfill") added for such templates, so that the model knows the tools it may call in its
native format.

    You can call any of the following tools to satisfy the user's requests: [
      {
        "type": "function",
        "function": {"name": ..., "description": ..., "parameters": {...}}   (indented by 2)
      }
    ]

    Example tool call syntax:

    <what the template renders for a call of `tool_name` with {"arg1": "some_value"}>

The text is appended to the first system message ("\\n\\n" between), or becomes one. The example
is found as minja finds it: the template renders `[user "Hey"]` with the generation prompt, and
`[user "Hey", assistant with the call]` without it; the example is what the second adds after
their common prefix (a divergence right after a `<`, as `<think>` against `<｜tool▁calls▁begin｜>`,
keeps that `<` in the example), less a trailing end-of-sequence token. minja rendered it without
`enable_thinking`, so the example is rendered with thinking off (a V3.1 example does not start with
`</think>`). No example when the rendering fails or does not show the call.

Only prompts for a generation get the text (as the generic protocol's instruction): the
/apply-template rendering stays llama.cpp's own (its current template engine adds nothing).
"""

from __future__ import annotations

import json
from typing import Any

from lamplight.chat import ChatTemplateError

from .base import ToolPlan

INTRO = "You can call any of the following tools to satisfy the user's requests: "
EXAMPLE_INTRO = "\n\nExample tool call syntax:\n\n"
_EXAMPLE_USER = {"role": "user", "content": "Hey"}
_EXAMPLE_CALL = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1___", "type": "function", "function": {"name": "tool_name", "arguments": {"arg1": "some_value"}}}]}


def tools_text(plan: ToolPlan, template: Any) -> str:
    """The system text listing the request's tools (all of them, as llama.cpp passes them)."""
    listing = [{"type": "function", "function": {"name": tool.name, "description": tool.description,
                                                  "parameters": tool.parameters}} for tool in plan.tools]
    text = INTRO + json.dumps(listing, indent=2, ensure_ascii=False)
    example = call_example(template)
    return text + (EXAMPLE_INTRO + example + "\n\n" if example else "")


def call_example(template: Any) -> str:
    """What the template renders for one call (see the module docstring); "" when it cannot."""
    no_thinking = {"enable_thinking": False}
    try:
        prefix = template.render([_EXAMPLE_USER], add_generation_prompt=True, extra=no_thinking)
        # minja rendered its example call with null content (DeepSeek R1 distill Llama renders
        # calls only then); a request's null content renders as "".
        full = template.render([_EXAMPLE_USER, _EXAMPLE_CALL], add_generation_prompt=False, extra=no_thinking,
                               prefill_assistant=False, keep_null_content=True)
    except ChatTemplateError:
        return ""
    eos = getattr(template, "eos_token", "") or ""
    if eos:
        for ending in (eos, eos + "\n"):
            if full.endswith(ending):
                full = full[:-len(ending)]
                break
    common = 0
    for index, (a, b) in enumerate(zip(prefix, full)):
        if a != b:
            break
        if a != "<":
            common = index + 1
    example = full[common:]
    if "tool_name" not in example and "some_value" not in example:
        return ""
    return example


def with_tools_text(messages: list[dict], plan: ToolPlan, template: Any) -> list[dict]:
    """Normalized messages with the tools' system text added (minja's add_system)."""
    text = tools_text(plan, template)
    if messages and messages[0]["role"] == "system":
        first = dict(messages[0])
        first["content"] = f"{first.get('content') or ''}\n\n{text}"
        return [first] + messages[1:]
    return [{"role": "system", "content": text}] + messages
