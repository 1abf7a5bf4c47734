"""What a chat request with tools needs: the format, the prompt's messages/tools, the grammar,
and the parser for the answer.

The format is the one the chat template's family names (lamplight.chat.families, which follows
llama.cpp's template-substring checks, semantics doc 5.2): FORMATS below maps each name to its
format. Templates that do not render `tools` get the generic protocol, except the DeepSeek R1
distills and V3.1, whose templates render tool calls in the native format but never the tool
list (llama.cpp's DeepSeek handlers take a template with those markers "in all cases"). Their
prompts get the tool list as the system text llama.cpp's template engine added for such
templates (polyfill.py), and the conversation untouched (the template renders past calls and
results itself).
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable

from lamplight.chat import normalize_messages

from . import generic, polyfill
from .base import ToolFormat, ToolPlan
from .formats import (
    CommandR7BFormat,
    CommandRPlusFormat,
    DeepSeekR1Format,
    DeepSeekV31Format,
    GenericFormat,
    GraniteFormat,
    HermesFormat,
    Llama3Format,
    MistralFormat,
)
from .harmony import HarmonyFormat
from .spec import ToolRequestError, parse_tool_choice, parse_tools
from .xml_calls import GlmFormat, QwenXmlFormat

# The format of each tool-format name the template families give (lamplight.chat.families).
FORMATS: dict[str, Callable[[], ToolFormat]] = {
    "generic": GenericFormat,
    "deepseek-v3.1": DeepSeekV31Format,
    "deepseek-r1": DeepSeekR1Format,
    "command-r7b": CommandR7BFormat,
    "granite": GraniteFormat,
    "gpt-oss": HarmonyFormat,
    "qwen3-coder": QwenXmlFormat,
    "glm-4.5": GlmFormat,
    "hermes": HermesFormat,
    "llama3-builtin-tools": partial(Llama3Format, python_tag=True),  # the template knows <|python_tag|>
    "llama3": Llama3Format,
    "mistral": MistralFormat,
    "command-r-plus": CommandRPlusFormat,
}


def detect_format(template: Any) -> ToolFormat:
    """The tool-call format of a ChatTemplate (None: no template, i.e. generic)."""
    if template is None:
        return GenericFormat()
    return FORMATS[template.family.tool_format]()


def plan_tool_calling(tools: Any, tool_choice: Any, parallel_tool_calls: Any, template: Any) -> ToolPlan | None:
    """The plan for a chat request, or None when it has no tools. ToolRequestError if malformed."""
    specs = parse_tools(tools)
    choice, forced = parse_tool_choice(tool_choice, specs)
    if parallel_tool_calls is not None and not isinstance(parallel_tool_calls, bool):
        raise ToolRequestError("parallel_tool_calls", f"must be a boolean, got {parallel_tool_calls!r}")
    if not specs:
        return None
    # OpenAI's default is parallel calls; a named function is one call of that function.
    parallel = (True if parallel_tool_calls is None else parallel_tool_calls) and forced is None
    return ToolPlan(detect_format(template), specs, list(tools), choice, forced, parallel)


def prompt_inputs(messages: Any, template: Any, plan: ToolPlan | None) -> tuple[list[dict], list[dict] | None]:
    """-> (messages, tools) to render the template with.

    Templates that render tools get the request's tools (also with tool_choice "none", as
    llama-server does) and the conversation untouched. Templates with a native format that do
    not render tools (DeepSeek R1 distills, V3.1) get the tool list as a system text
    (polyfill.py) and the conversation untouched. Otherwise the generic protocol is spelled out
    in the messages (generic.py)."""
    supports_tools = bool(getattr(template, "supports_tools", False))
    native = not (plan.format if plan is not None else detect_format(template)).generic
    if plan is not None and plan.active and plan.format.generic:
        messages = generic.protocol_messages(normalize_messages(messages), plan)
    elif native and not supports_tools:
        if plan is not None:
            messages = polyfill.with_tools_text(normalize_messages(messages), plan, template)
    elif not supports_tools:
        normalized = normalize_messages(messages)
        if generic.has_tool_turns(normalized):
            messages = generic.history_messages(normalized)
    return messages, template_tools(template, plan)


def template_tools(template: Any, plan: ToolPlan | None) -> list[dict] | None:
    """The request's tools, for templates that render them."""
    supports_tools = bool(getattr(template, "supports_tools", False))
    return plan.raw_tools if plan is not None and supports_tools else None
