"""Qwen3-Coder's XML tool calls (also Qwen3.5 and Nemotron 3 Nano): llama.cpp's "Qwen3 Coder"
format, chosen for templates with `<tool_call>`, `<function=` and `<parameter=` (before Hermes,
whose `<tool_call>` JSON these templates do not use).

As the templates write a call (calls separated by a newline, text may come first):

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    <parameter=days>
    2
    </parameter>
    </function>
    </tool_call>

A parameter's value is raw text: a string as it is (one newline after the opening tag and one
before the closing tag belong to the markup), other values as JSON (the templates write objects
and arrays with `tojson`, numbers and booleans with Jinja's `string`, hence `True`/`False` too).
Read back by the parameter's type in the tool's schema: `string` stays text, anything else is
JSON when it parses (`True`/`False` as booleans), else text. Without a schema (a bare format), a
value that parses as a JSON number, boolean, null, object or array is that, else text.

The grammar holds each call to its tool: the parameters in the schema's order, the required ones
present, each value a lazy text up to `</parameter>` for strings and the JSON of its schema
otherwise.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .formats import GrammarSource, ParsedMessage, ToolFormat, hold_back
from .grammar_text import lark_json, lark_literal, marker_grammar, marker_lark
from .spec import ToolCall, ToolSpec

if TYPE_CHECKING:
    from .plan import ToolPlan

OPEN, CLOSE = "<tool_call>", "</tool_call>"
FUNCTION_OPEN, FUNCTION_CLOSE = "<function=", "</function>"
PARAMETER_OPEN, PARAMETER_CLOSE = "<parameter=", "</parameter>"
_NAME = re.compile(r"([^>\n]+)>")  # a function's or parameter's name, up to its `>`


def detects(source: str) -> bool:
    return OPEN in source and FUNCTION_OPEN in source and PARAMETER_OPEN in source


class _Malformed(Exception):
    pass


@dataclass(frozen=True)
class _Progress:
    """Where a call's parse stopped: `end` is where the text continues (None: unfinished)."""

    call: ToolCall | None
    end: int | None


class QwenXmlFormat(ToolFormat):
    name = "qwen3-coder"
    title = "Qwen3 Coder"
    triggers = (OPEN,)

    def __init__(self, tools: list[ToolSpec] | None = None):
        # Each tool's parameter types, for reading values back (ToolFormat.for_tools).
        self.types = {tool.name: _parameter_types(tool) for tool in tools or ()}

    def for_tools(self, tools: list[ToolSpec]) -> "QwenXmlFormat":
        return QwenXmlFormat(tools)

    # -- grammar ----------------------------------------------------------------------------------

    def grammar(self, plan: "ToolPlan", tokenizer: Any) -> GrammarSource:
        open_, open_is_token = marker_lark(tokenizer, OPEN)
        close, _ = marker_lark(tokenizer, CLOSE)
        rules = []
        for i, tool in enumerate(plan.callable_tools):
            rules += _call_rules(f"call{i}", tool)
        rules.append("call: " + " | ".join(f"call{i}" for i in range(len(plan.callable_tools))))
        body = f'"\\n" call "\\n" {close}'
        more = f' ("\\n" {open_} {body})*' if plan.parallel else ""
        return GrammarSource("lark", marker_grammar(plan.choice == "required", open_, open_is_token,
                                                    body + more, rules))

    # -- parsing ----------------------------------------------------------------------------------

    def parse(self, text: str, partial: bool = False) -> ParsedMessage:
        content: list[str] = []
        calls: list[ToolCall] = []
        pos = 0
        while True:
            at = text.find(OPEN, pos)
            if at < 0:
                rest = text[pos:]
                if calls and not rest.strip():
                    rest = ""
                content.append(hold_back(rest, (OPEN,)) if partial else rest)
                break
            before = text[pos:at]
            if not calls or before.strip():
                content.append(before.rstrip())  # the blank line the templates put before a call
            try:
                progress = self._call_at(text, at + len(OPEN), partial)
            except _Malformed:  # not a call: the rest is content
                content.append(text[at:])
                break
            if progress.call is not None:
                calls.append(progress.call)
            if progress.end is None:  # unfinished (partial)
                break
            pos = progress.end
        joined = "".join(content)
        if calls and not joined.strip():
            joined = ""
        return ParsedMessage(joined, calls)

    def _call_at(self, text: str, pos: int, partial: bool) -> _Progress:
        pos = _expect(text, _skip_space(text, pos), FUNCTION_OPEN, partial)
        if pos is None:
            return _Progress(None, None)
        name, pos = _name_at(text, pos, partial)
        if name is None:
            return _Progress(None, None)
        types = self.types.get(name, {})
        arguments: dict[str, Any] = {}
        while True:
            pos = _skip_space(text, pos)
            if text.startswith(FUNCTION_CLOSE, pos):
                break
            if partial and FUNCTION_CLOSE.startswith(text[pos:]):  # the end, or maybe its start
                return _Progress(_call(name, arguments, complete=False), None)
            pos = _expect(text, pos, PARAMETER_OPEN, partial)
            if pos is None:
                return _Progress(_call(name, arguments, complete=False), None)
            key, pos = _name_at(text, pos, partial)
            if key is None:
                return _Progress(_call(name, arguments, complete=False), None)
            end = text.find(PARAMETER_CLOSE, pos)
            if end < 0:
                if partial:
                    return _Progress(_call(name, arguments, complete=False), None)
                raise _Malformed
            arguments[key] = _value(_strip_one_newline(text[pos:end]), types.get(key))
            pos = end + len(PARAMETER_CLOSE)
        pos = _skip_space(text, pos + len(FUNCTION_CLOSE))
        after = _expect(text, pos, CLOSE, partial)
        if after is None:
            return _Progress(_call(name, arguments, complete=False), None)
        return _Progress(_call(name, arguments, complete=True), after)


def _call(name: str, arguments: dict, complete: bool) -> ToolCall:
    """The call with its arguments as minified JSON; unfinished, without the closing brace (so
    each streamed version is a prefix of the next: finished parameters are only ever added)."""
    text = json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))
    return ToolCall(name, text if complete else text[:-1], complete=complete)


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


def _expect(text: str, pos: int, marker: str, partial: bool) -> int | None:
    """Past `marker` at `pos`; None when the text stops inside it (partial); else _Malformed."""
    if text.startswith(marker, pos):
        return pos + len(marker)
    if partial and marker.startswith(text[pos:]):
        return None
    raise _Malformed


def _name_at(text: str, pos: int, partial: bool) -> tuple[str | None, int]:
    match = _NAME.match(text, pos)
    if match is None:
        if partial and "\n" not in text[pos:] and ">" not in text[pos:]:
            return None, pos
        raise _Malformed
    return match.group(1).strip(), match.end()


def _strip_one_newline(value: str) -> str:
    value = value[1:] if value.startswith("\n") else value
    return value[:-1] if value.endswith("\n") else value


def _value(raw: str, kind: str | None) -> Any:
    if kind == "string":
        return raw
    stripped = raw.strip()
    if kind == "boolean" and stripped in ("True", "False"):
        return stripped == "True"
    try:
        value = json.loads(stripped)
    except ValueError:
        return raw
    return raw if isinstance(value, str) and kind is None else value


def _parameter_types(tool: ToolSpec) -> dict[str, str | None]:
    """Each parameter's JSON type when the schema names one type, else None."""
    properties = tool.parameters.get("properties") if isinstance(tool.parameters, dict) else None
    types = {}
    for key, schema in (properties or {}).items():
        kind = schema.get("type") if isinstance(schema, dict) else None
        types[key] = kind if isinstance(kind, str) else None
    return types


def _call_rules(rule: str, tool: ToolSpec) -> list[str]:
    """`rule`: one call of `tool`, its parameters in the schema's order, optional ones optional."""
    parameters = tool.parameters if isinstance(tool.parameters, dict) else {}
    required = set(parameters.get("required") or ())
    properties = parameters.get("properties") or {}
    parts, rules = [], []
    for j, (key, schema) in enumerate(properties.items()):
        name = f"{rule}_p{j}"
        rules += _parameter_rules(name, key, schema if isinstance(schema, dict) else {})
        parts.append(name if key in required else f"{name}?")
    head = lark_literal(f"{FUNCTION_OPEN}{tool.name}>\n")
    rules.insert(0, f"{rule}: {' '.join([head, *parts, lark_literal(FUNCTION_CLOSE)])}")
    return rules


def _parameter_rules(rule: str, key: str, schema: dict) -> list[str]:
    head = lark_literal(f"{PARAMETER_OPEN}{key}>\n")
    if schema.get("type") == "string":
        # Text up to the first closing tag (a lazy lexeme), then the newline the templates write.
        return [f'{rule}: {head} {rule}_text "\\n"',
                f"{rule}_text[lazy]: TEXT {lark_literal(chr(10) + PARAMETER_CLOSE)}"]
    if schema.get("type") == "boolean":
        value = '("true" | "false" | "True" | "False")'
    else:
        value = lark_json(schema)
    return [f"{rule}: {head} {value} {lark_literal(chr(10) + PARAMETER_CLOSE + chr(10))}"]
