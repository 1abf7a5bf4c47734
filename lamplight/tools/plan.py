"""What a chat request with tools needs: the format, the prompt's messages/tools, the grammar,
and the parser for the answer.

Format detection follows llama.cpp's template-substring checks (semantics doc 5.2), in its
order, for the formats implemented here:
    `message['prefix']` and `thinking`                     -> deepseek-v3.1
    `<｜tool▁calls▁begin｜>`                                 -> deepseek-r1
    template does not use `tools`                          -> generic
    `<|END_THINKING|><|START_ACTION|>`                     -> command-r7b
    `elif thinking` and `<|tool_call|>`                    -> granite (3.x)
    `<tool_call>`, `<function=` and `<parameter=`           -> qwen3-coder (XML; Qwen3-Coder, Qwen3.5)
    `<tool_call>` and `<arg_key>`                          -> glm-4.5 (GLM 4.5-4.7, Laguna)
    `<tool_call>`                                          -> hermes (Hermes 2 Pro, Qwen 2.5/3)
    `<|channel|>`                                          -> gpt-oss (harmony)
    `<|start_header_id|>ipython<|end_header_id|>`          -> llama3 (+ `<|python_tag|>` if present)
    `[TOOL_CALLS]`                                         -> mistral (Nemo)
    `Action:` and `"tool_name"`                            -> command-r-plus (not in llama.cpp's
                                                              hand-written list: it gives Generic)
    anything else                                          -> generic (the template still gets `tools`)

The DeepSeek checks come before the `tools` one, as in llama.cpp, whose DeepSeek handlers take
a template with those markers "in all cases": the real DeepSeek R1 distill and V3.1 templates
render tool calls in the native format but never the tool list. Their prompts get the tool list
as the system text llama.cpp's template engine added for such templates (polyfill.py), and the
conversation untouched (the template renders past calls and results itself).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lamplight.chat import normalize_messages

from . import generic, polyfill
from .formats import (
    CommandR7BFormat,
    CommandRPlusFormat,
    DeepSeekR1Format,
    DeepSeekV31Format,
    GenericFormat,
    GraniteFormat,
    GrammarSource,
    HermesFormat,
    Llama3Format,
    MistralFormat,
    ParsedMessage,
    ToolFormat,
)
from .harmony import CHANNEL as HARMONY_CHANNEL
from .harmony import HarmonyFormat
from . import xml_calls
from .xml_calls import GlmFormat, QwenXmlFormat
from .spec import ToolRequestError, ToolSpec, parse_tool_choice, parse_tools

LLAMA3_IPYTHON = "<|start_header_id|>ipython<|end_header_id|>"


def detect_format(template: Any) -> ToolFormat:
    """The tool-call format of a ChatTemplate (None: no template, i.e. generic)."""
    source = getattr(template, "source", "") or ""
    if template is None:
        return GenericFormat()
    if "message['prefix']" in source and "thinking" in source:
        return DeepSeekV31Format()
    if DeepSeekR1Format.BLOCK_OPEN in source:
        return DeepSeekR1Format()
    if not getattr(template, "supports_tools", False):
        return GenericFormat()
    if "<|END_THINKING|><|START_ACTION|>" in source:
        return CommandR7BFormat()
    if "elif thinking" in source and GraniteFormat.MARKER in source:
        return GraniteFormat()
    # Before Hermes, as llama.cpp: these templates' <tool_call> holds XML-like elements, not JSON.
    if xml_calls.is_qwen_xml(source):
        return QwenXmlFormat()
    if xml_calls.is_glm(source):
        return GlmFormat()
    if HermesFormat.OPEN in source:
        return HermesFormat()
    if HARMONY_CHANNEL in source:
        return HarmonyFormat()
    if LLAMA3_IPYTHON in source:
        return Llama3Format(python_tag=Llama3Format.PYTHON_TAG in source)
    if MistralFormat.MARKER in source:
        return MistralFormat()
    if "Action:" in source and '"tool_name"' in source:
        return CommandRPlusFormat()
    return GenericFormat()


@dataclass
class ToolPlan:
    format: ToolFormat
    tools: list[ToolSpec]
    raw_tools: list[dict]  # as the request sent them (what templates iterate)
    choice: str  # auto | required | none
    forced: str | None  # tool_choice named this function
    parallel: bool

    def __post_init__(self) -> None:
        self.format = self.format.for_tools(self.tools)

    @property
    def active(self) -> bool:
        """Constrained and parsed (tool_choice is not "none")."""
        return self.choice != "none"

    @property
    def callable_tools(self) -> list[ToolSpec]:
        if self.forced is None:
            return self.tools
        return [tool for tool in self.tools if tool.name == self.forced]

    def grammar(self, tokenizer: Any) -> GrammarSource | None:
        return self.format.grammar(self, tokenizer) if self.active else None

    def parse(self, text: str, partial: bool = False) -> ParsedMessage:
        return self.format.parse(text, partial)

    def parse_final(self, text: str, stop_type: str) -> ParsedMessage:
        """The whole reply, by how it ended: cut by max_tokens ("limit", "none"), only its
        finished calls count (ToolFormat.parse_cut)."""
        if stop_type in ("limit", "none"):
            return self.format.parse_cut(text)
        return self.format.parse(text)

    def settings_echo(self) -> dict:
        """generation_settings keys that describe tool calling (llama-server's names)."""
        if not self.active:
            return {}
        lazy = self.choice == "auto" and bool(self.format.triggers)
        return {
            "grammar_lazy": lazy,
            "grammar_triggers": [{"type": 1, "value": trigger} for trigger in self.format.triggers] if lazy else [],
            "chat_format": self.format.title,
        }


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
