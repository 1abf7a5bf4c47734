"""gpt-oss (OpenAI harmony) tool calls, as llama.cpp's gpt-oss handler reads and constrains them.

A harmony reply is a run of messages, each `HEADER<|message|>BODY`, the later ones after
`<|start|>assistant` (the generation prompt already ends with it). A call names its recipient,
either in the role part or in the channel part of the header:

    <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>
     to=functions.NAME<|channel|>commentary json<|message|>{...}<|call|>

`<|call|>` and `<|return|>` end the generation (they are end-of-generation tokens, so the text
normally stops before them); `<|end|>` closes a message that the reply goes on after. One call per
reply, whatever parallel_tool_calls says: the call's `<|call|>` ends the generation.

The leading analysis message is the thinking: lamplight.chat.reasoning splits it off (markers
`<|channel|>analysis<|message|>` ... `<|end|>`) before the answer reaches this parser, and takes
off the final channel's header. What reaches here: final and commentary (preamble) bodies are
content, a call is a call, an analysis message that was not split off (reasoning_format none)
is content with its markers, as llama.cpp keeps it.
"""

from __future__ import annotations

import re
from typing import Any

from .base import GrammarSource, ParsedMessage, ToolFormat, ToolPlan
from .formats import _Malformed, hold_back
from .grammar_text import lark_json, lark_literal, marker_grammar, marker_lark, markers_lark, text_then
from .json_scan import JsonMalformed, minify, scan_value
from .spec import ToolCall

START = "<|start|>assistant"
CHANNEL = "<|channel|>"
MESSAGE = "<|message|>"
END = "<|end|>"
CALL = "<|call|>"
CONSTRAIN = "<|constrain|>"
RECIPIENT = " to=functions."
ANALYSIS = CHANNEL + "analysis"

# llama.cpp's two header shapes of a call (recipient in the role, or in the channel part).
_CONSTRAINT = r"(?: (?:<\|constrain\|>)?[a-zA-Z0-9_-]+)?"
_CALL_IN_ROLE = re.compile(r" to=functions\.([^<\s]+)<\|channel\|>(?:analysis|commentary)" + _CONSTRAINT)
_CALL_IN_CHANNEL = re.compile(r"<\|channel\|>(?:analysis|commentary) to=functions\.([^<\s]+)" + _CONSTRAINT)
_TEXT_HEADER = re.compile(r"<\|channel\|>(?:final" + _CONSTRAINT + "|commentary)")
_HEADS = (START, CHANNEL, RECIPIENT)  # what opens a harmony message in the text


class HarmonyFormat(ToolFormat):
    name = "gpt-oss"
    title = "GPT-OSS"
    triggers = (RECIPIENT,)

    def grammar(self, plan: ToolPlan, tokenizer: Any) -> GrammarSource:
        rules = ["call: " + " | ".join(self._call_rule(tokenizer, tool.name, tool.parameters)
                                       for tool in plan.callable_tools)]
        recipient = lark_literal(RECIPIENT)
        if plan.choice != "required":
            return GrammarSource("lark", marker_grammar(False, recipient, False, "call", rules))
        # Required: the thinking (analysis message) may come first, then the call (llama.cpp's
        # non-lazy gpt-oss grammar, without the commentary preamble).
        thinking, thinking_rules = text_then(*marker_lark(tokenizer, END), rule="thinking")
        lead = f"({markers_lark(tokenizer, CHANNEL, 'analysis', MESSAGE)} {thinking} {markers_lark(tokenizer, START)})?"
        channel = f"({markers_lark(tokenizer, CHANNEL)} (\"commentary\" | \"analysis\"))?"
        lines = ["%llguidance {}", f"start: {lead} {channel} {recipient} call", *thinking_rules,
                 r"TEXT: /(.|\n)*/", *rules]
        return GrammarSource("lark", "\n".join(lines) + "\n")

    @staticmethod
    def _call_rule(tokenizer: Any, name: str, parameters: dict) -> str:
        """NAME, the channel when the recipient came in the role, `json` (optionally after
        `<|constrain|>`), then the arguments."""
        channel = f"({markers_lark(tokenizer, CHANNEL)} (\"commentary\" | \"analysis\"))?"
        content_type = f"(\" \" {markers_lark(tokenizer, CONSTRAIN)}? \"json\")?"
        return (f"{lark_literal(name)} {channel} {content_type} {markers_lark(tokenizer, MESSAGE)} "
                f"{lark_json(parameters)}")

    def parse(self, text: str, partial: bool = False) -> ParsedMessage:
        first = min((at for at in (text.find(head) for head in _HEADS) if at >= 0), default=-1)
        if first < 0:
            return ParsedMessage(hold_back(text, _HEADS) if partial else text)
        try:
            content, calls = self._messages(text, first, partial)
        except (_Malformed, JsonMalformed):
            return ParsedMessage(text)
        return ParsedMessage(text[:first] + content, calls)

    def _messages(self, text: str, pos: int, partial: bool) -> tuple[str, list[ToolCall]]:
        """The messages from `pos` on -> (their content, their calls)."""
        content, calls = "", []
        while pos is not None and pos < len(text):
            if text.startswith(START, pos):
                pos += len(START)
            elif partial and START.startswith(text[pos:]):
                break
            body = text.find(MESSAGE, pos)
            if body < 0:
                if partial:
                    break  # the header is still being written
                raise _Malformed
            header = text[pos:body]
            name = _call_name(header)
            if name is not None:
                call, pos = self._call(text, name, body + len(MESSAGE), partial)
                calls.append(call)
                continue
            piece, pos = self._text_message(text, pos, header, body + len(MESSAGE), partial)
            content += piece
        return content, calls

    def _call(self, text: str, name: str, start: int, partial: bool) -> tuple[ToolCall, int | None]:
        node = scan_value(text, start)
        if node is None or not node.complete:
            if not partial or (node is not None and node.kind != "object"):
                raise _Malformed
            return ToolCall(name, minify(node.raw(text)) if node else "", complete=False), None
        if node.kind != "object":
            raise _Malformed
        after = node.end
        if text.startswith(CALL, after):
            after += len(CALL)
        rest = text[after:]
        if rest and not rest.startswith(START) and not (partial and (START.startswith(rest) or CALL.startswith(rest))):
            raise _Malformed  # only another message may follow a call
        return ToolCall(name, minify(node.raw(text))), after

    def _text_message(self, text: str, header_at: int, header: str, start: int,
                      partial: bool) -> tuple[str, int | None]:
        """A final, commentary or analysis message -> (its content, where the next one starts)."""
        if header.startswith(ANALYSIS):
            start = header_at  # kept whole, markers included (llama.cpp)
        elif not _TEXT_HEADER.fullmatch(header):
            raise _Malformed
        end = text.find(END, start)
        if end < 0:
            body = text[start:]
            return (hold_back(body, (END,)) if partial else body), None
        if header.startswith(ANALYSIS):
            return text[start:end + len(END)], end + len(END)
        return text[start:end], end + len(END)


def _call_name(header: str) -> str | None:
    for pattern in (_CALL_IN_ROLE, _CALL_IN_CHANNEL):
        match = pattern.fullmatch(header)
        if match:
            return match.group(1)
    return None
