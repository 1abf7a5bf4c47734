r"""Template families: what llama.cpp recognises in a chat template's source, and what follows.

A family is recognised by markers in the template source (all of `markers`, none of `absent`)
and says what llama.cpp does for its templates:
- `thinking`: the thinking section of its dedicated format, written when an assistant reply is
  continued (lamplight.chat.prefill); None: llama.cpp finds it by analysing the template;
- `answer_wrapper`: markers around the answer, taken off the content (lamplight.chat.answer_wrappers);
- `tool_format`: the tool-call format, by its name in lamplight.tools.FORMATS (this layer does not
  import the tools); `native_without_tools`: that format holds even for a template that never
  renders `tools` (DeepSeek's), where any other gets the generic protocol.

`detect_family` reads a source once (ChatTemplate does it when it is made) into a TemplateFamily.
FAMILIES is in llama.cpp's order of detection, and each of the three above comes from the first
family that recognises the template and says something about it. That keeps two orders of
llama.cpp's in one list: lamplight's thinking sections follow its current code (its specialised
templates, `common_chat_try_specialized_template`), the tool formats its older hand-written
handlers (`common_chat_templates_apply_jinja`). So a template can be Granite 3.3 for its thinking
and Granite 3.x for its tools, or MiniMax-M3 for its thinking and Hermes for its tools; and
gpt-oss has two entries, its thinking among the specialised templates and its tool calls after
Hermes's, where the older handlers checked them. The order matters where one family's markers
include another's: Qwen3-Coder XML's and GLM 4.5's come before Hermes's bare `<tool_call>`,
DeepSeek's before the check that the template renders tools (the real R1 distill and V3.1
templates render calls, never the tool list).

The thinking markers a reply is split at (lamplight.chat.reasoning_markers) are the first pair the
source names (`<think>`, `[THINK]`, ...); a template that names none thinks in the markers of its
family's thinking section where that section is one of the pairs (Kimi K2 and LFM2: `<think>`;
Devstral, as Ministral 3: `[THINK]`).

Adding a family: one entry in FAMILIES, at its place in llama.cpp's order; a new tool format
also needs its name in lamplight.tools.FORMATS (tests/test_template_families.py checks both).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from lamplight.chat import answer_wrappers as answers
from lamplight.chat.answer_wrappers import AnswerWrapper
from lamplight.chat.prefill import NO_THINKING, THINK_TAGS, ThinkingSection
from lamplight.chat.reasoning_markers import (
    COMMAND_R7B,
    GEMMA4,
    HARMONY,
    MARKER_PAIRS,
    MINIMAX_M3,
    MISTRAL,
    THINK,
    ReasoningMarkers,
)

_MENTIONS_TOOLS = re.compile(r"\btools\b")


@dataclass(frozen=True)
class Family:
    """One entry of FAMILIES (the module docstring says what each field means)."""

    name: str
    markers: tuple[str, ...]  # all of them in the source
    absent: tuple[str, ...] = ()  # none of them in the source
    thinking: ThinkingSection | None = None
    answer_wrapper: AnswerWrapper | None = None
    tool_format: str | None = None
    native_without_tools: bool = False

    def recognises(self, source: str) -> bool:
        return all(m in source for m in self.markers) and not any(m in source for m in self.absent)


def _tags(markers: ReasoningMarkers) -> ThinkingSection:
    """The pair's markers as a thinking section, with no whitespace around the reasoning."""
    return ThinkingSection(markers.start, markers.end)


_HARMONY = ("<|channel|>",)
_QWEN_XML = ("<tool_call>", "<function=", "<parameter=")
_QWEN_THINKING = ThinkingSection(THINK.start + "\n", "\n" + THINK.end + "\n\n")

FAMILIES = (
    # llama.cpp's older handlers check these first.
    Family("DeepSeek V3.1", ("message['prefix']", "thinking"), tool_format="deepseek-v3.1",
           native_without_tools=True),
    Family("DeepSeek R1", ("<｜tool▁calls▁begin｜>",), tool_format="deepseek-r1", native_without_tools=True),
    Family("Command R7B", ("<|END_THINKING|><|START_ACTION|>",), answer_wrapper=answers.COMMAND_R7B,
           tool_format="command-r7b"),
    Family("Granite 3.x", ("elif thinking", "<|tool_call|>"), answer_wrapper=answers.GRANITE, tool_format="granite"),
    # llama.cpp's specialised templates, in its order; the sections are what its parsers write for
    # a continuation.
    Family("Ministral 3", ("[SYSTEM_PROMPT]", "[TOOL_CALLS]", "[ARGS]"), absent=("[CALL_ID]",),
           thinking=_tags(MISTRAL)),
    # Its tool calls: after Hermes's, below.
    Family("gpt-oss", _HARMONY, thinking=ThinkingSection(HARMONY.start, HARMONY.end + HARMONY.answer_prefix)),
    Family("Muse Glimmer", ("<atem:function_calls>", "<|eom|>"),
           thinking=ThinkingSection(" to=self<|message|>", "<|eom|><|start|>assistant to=user<|message|>")),
    Family("Functionary v3.2", (">>>all", ">>>${recipient}"), thinking=ThinkingSection(bare="all\n")),
    Family("Kimi K2", ("<|tool_calls_section_begin|>", "<|tool_call_begin|>"), thinking=THINK_TAGS),
    Family("Kimi K3", ("<|open|>", "<|close|>", "<|end_of_msg|>"),
           thinking=ThinkingSection("<|open|>think<|sep|>", "<|close|>think<|sep|><|open|>response<|sep|>")),
    Family("Cohere2 MoE", ("<|START_TEXT|>", "<|START_ACTION|>"),
           thinking=ThinkingSection(COMMAND_R7B.start, COMMAND_R7B.end + "<|START_TEXT|>")),
    Family("LFM2", ("<|tool_list_start|>", "<|tool_list_end|>"), thinking=THINK_TAGS),
    Family("LFM2.5", ("List of tools: [",), absent=("<|tool_list_start|>",), thinking=THINK_TAGS),
    Family("GigaChat v3", ("<|role_sep|>", "<|message_sep|>"), absent=("<|function_call|>",), thinking=NO_THINKING),
    Family("MiniMax-M3", ("]<]minimax[>[", "<tool_call>", "<invoke name="), thinking=_tags(MINIMAX_M3)),
    Family("DeepSeek V3.2", ("dsml_token", "DSML", "function_calls"), thinking=THINK_TAGS),
    Family("DeepSeek V4", ("dsml_token", "DSML", "tool_calls"),
           thinking=ThinkingSection(THINK.start, THINK.end, bare=THINK.end)),
    Family("Gemma 4", ("'<|tool_call>call:'",), thinking=ThinkingSection(GEMMA4.start + "\n", GEMMA4.end)),
    Family("MiniCPM5", ("Tool usage guidelines:", '<function name="', '<param name="'), thinking=_QWEN_THINKING),
    # Their calls are llama.cpp's Qwen3-Coder XML, checked before GLM's and Hermes's (below).
    Family("Qwen3.5 / Nemotron 3 Nano", (*_QWEN_XML, "<think>"), thinking=_QWEN_THINKING, tool_format="qwen3-coder"),
    Family("Qwen3-Coder", _QWEN_XML, thinking=NO_THINKING, tool_format="qwen3-coder"),
    # Not parsers of their own in llama.cpp, but fixed markers its analysis is told to use.
    Family("Nemotron Nano v2", ("<SPECIAL_10>", "<SPECIAL_11>", "<SPECIAL_12>", "<TOOL_RESPONSE>"),
           thinking=ThinkingSection(THINK.start + "\n", THINK.end)),
    Family("Granite 3.3", ("Write your thoughts between <think></think> and write your response between "
                           "<response></response>",), thinking=THINK_TAGS),
    # The rest of llama.cpp's older handlers.
    Family("GLM 4.5", ("<tool_call>", "<arg_key>"), tool_format="glm-4.5"),
    Family("Hermes 2 Pro", ("<tool_call>",), tool_format="hermes"),
    # gpt-oss again: llama.cpp's older handlers, which the tool formats follow, checked its calls
    # after Hermes's (its current code checks gpt-oss among the specialised templates, above).
    Family("gpt-oss tool calls", _HARMONY, tool_format="gpt-oss"),
    Family("Llama 3.x with builtin tools", ("<|start_header_id|>ipython<|end_header_id|>", "<|python_tag|>"),
           tool_format="llama3-builtin-tools"),
    Family("Llama 3.x", ("<|start_header_id|>ipython<|end_header_id|>",), tool_format="llama3"),
    Family("Mistral Nemo", ("[TOOL_CALLS]",), tool_format="mistral"),
    # Not in llama.cpp's hand-written list (it gives these templates the generic format).
    Family("Command R+", ("Action:", '"tool_name"'), tool_format="command-r-plus"),
)


@dataclass(frozen=True)
class TemplateFamily:
    """What a template's families say about it (detect_family)."""

    name: str  # the first family that recognises the template; "" when none does
    thinking: ThinkingSection | None  # None: found by analysing the template (lamplight.chat.prefill)
    reasoning: ReasoningMarkers | None  # None: the template does not think
    answer_wrapper: AnswerWrapper | None
    tool_format: str  # a name in lamplight.tools.FORMATS


def renders_tools(source: str) -> bool:
    """The template uses `tools` (llama.cpp's check before it picks most tool formats)."""
    return bool(_MENTIONS_TOOLS.search(source))


def detect_family(source: str) -> TemplateFamily:
    """What the families that recognise `source` say about it, each thing from the first that says it."""
    recognised = [family for family in FAMILIES if family.recognises(source)]
    thinking = next((f for f in recognised if f.thinking is not None), None)
    answer = next((f.answer_wrapper for f in recognised if f.answer_wrapper is not None), None)
    return TemplateFamily(recognised[0].name if recognised else "", thinking.thinking if thinking else None,
                          _reasoning(source, thinking), answer, _tool_format(recognised, renders_tools(source)))


def _reasoning(source: str, thinking: Family | None) -> ReasoningMarkers | None:
    """The first marker pair the source names, else the pair its family's thinking section writes."""
    named = next((pair for pair in MARKER_PAIRS if pair.probe in source), None)
    if named is not None or thinking is None:
        return named
    section = thinking.thinking
    return next((pair for pair in MARKER_PAIRS if (pair.start, pair.end) == (section.start, section.end)), None)


def _tool_format(recognised: list[Family], renders_tools: bool) -> str:
    family = next((f for f in recognised if f.tool_format is not None), None)
    if family is None or not (renders_tools or family.native_without_tools):
        return "generic"
    return family.tool_format
