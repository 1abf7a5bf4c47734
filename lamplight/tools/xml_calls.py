"""Tool calls whose arguments are XML-like elements inside `<tool_call>`, one element per argument,
not Hermes's JSON (both are detected before Hermes, as llama.cpp does: lamplight.chat.families):

Qwen3-Coder's (also Qwen3.5, Nemotron 3 Nano, StepFun 3.5): llama.cpp's "Qwen3 Coder" format,
chosen for templates with `<tool_call>`, `<function=` and `<parameter=`. As the templates write a
call (calls separated by a newline, text may come first):

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

GLM 4.5-4.7's (also poolside Laguna): llama.cpp's "GLM 4.5" format, chosen here for templates
with `<tool_call>` and `<arg_key>`; the name follows the opening tag, newlines between the
elements are optional (GLM 4.6 writes them, 4.7 does not):

    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Paris</arg_value>
    <arg_key>days</arg_key>
    <arg_value>2</arg_value>
    </tool_call>

A value is raw text: a string as it is (Qwen: one newline after the opening tag and one before
the closing tag belong to the markup), other values as JSON (the templates write objects and
arrays with `tojson`; Qwen's write numbers and booleans with Jinja's `string`, hence `True`/`False`
too). The JSON types a parameter's values may have come from its schema as llama.cpp reads them
(`value_types`: `type`, else the types of its `const` or `enum` values, else the union over
`anyOf`/`oneOf`; none of these: any type). Read back by those types: a parameter that can only
be a string stays text, anything else is JSON when it parses as one of its types (`True`/`False`
as booleans), else text. Without a schema (a bare format), a value that parses as a JSON number,
boolean, null, object or array is that, else text.

The grammars hold each call to its tool: the parameters in the schema's order, the required ones
present; each value one of the literal strings of a string `enum` or `const` (`Paris`, never
`"Paris"`), a lazy text up to its closing tag where it may be any other string (llama.cpp's
grammar does the same), the JSON of its schema where it cannot be a string.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .base import GrammarSource, ParsedMessage, ToolFormat, ToolPlan
from .formats import parse_tagged_calls
from .grammar_text import lark_json, lark_literal, marker_grammar, marker_lark
from .spec import ToolCall, ToolSpec

OPEN, CLOSE = "<tool_call>", "</tool_call>"
FUNCTION_OPEN, FUNCTION_CLOSE = "<function=", "</function>"
PARAMETER_OPEN, PARAMETER_CLOSE = "<parameter=", "</parameter>"
KEY_OPEN, KEY_CLOSE = "<arg_key>", "</arg_key>"
VALUE_OPEN, VALUE_CLOSE = "<arg_value>", "</arg_value>"
_NAME = re.compile(r"([^>\n]+)>")  # a function's or parameter's name, up to its `>`
_STRING = frozenset({"string"})  # the value types of a parameter that is text


class _Malformed(Exception):
    pass


class _XmlCallsFormat(ToolFormat):
    """`<tool_call>` blocks, separated by whitespace, text before the first; `_call_at` reads one."""

    triggers = (OPEN,)
    separator = '"\\n"'  # between two calls, in the grammar

    def __init__(self, tools: list[ToolSpec] | None = None):
        # Each tool's parameter types, for reading values back (ToolFormat.for_tools).
        self.types = {tool.name: _parameter_types(tool) for tool in tools or ()}

    def for_tools(self, tools: list[ToolSpec]) -> "_XmlCallsFormat":
        return type(self)(tools)

    def grammar(self, plan: ToolPlan, tokenizer: Any) -> GrammarSource:
        open_, open_is_token = marker_lark(tokenizer, OPEN)
        close, _ = marker_lark(tokenizer, CLOSE)
        rules = []
        for i, tool in enumerate(plan.callable_tools):
            rules += self._call_rules(f"call{i}", tool)
        rules.append("call: " + " | ".join(f"call{i}" for i in range(len(plan.callable_tools))))
        body = self._body(close)
        more = f" ({self.separator} {open_} {body})*" if plan.parallel else ""
        return GrammarSource("lark", marker_grammar(plan.choice == "required", open_, open_is_token,
                                                    body + more, rules))

    def _body(self, close: str) -> str:
        raise NotImplementedError

    def _call_rules(self, rule: str, tool: ToolSpec) -> list[str]:
        raise NotImplementedError

    def _call_at(self, text: str, pos: int, partial: bool) -> tuple[ToolCall | None, int | None]:
        raise NotImplementedError

    def parse(self, text: str, partial: bool = False) -> ParsedMessage:
        return parse_tagged_calls(text, partial, OPEN, self._call_or_none, trim_before=True)

    def _call_or_none(self, text: str, pos: int, partial: bool) -> tuple[ToolCall | None, int | None] | None:
        try:
            return self._call_at(text, pos, partial)
        except _Malformed:
            return None


class QwenXmlFormat(_XmlCallsFormat):
    name = "qwen3-coder"
    title = "Qwen3 Coder"

    def _body(self, close: str) -> str:
        return f'"\\n" call "\\n" {close}'

    def _call_rules(self, rule: str, tool: ToolSpec) -> list[str]:
        return _call_rules(rule, tool, lark_literal(f"{FUNCTION_OPEN}{tool.name}>\n"), _qwen_parameter_rules,
                           lark_literal(FUNCTION_CLOSE))

    def _call_at(self, text: str, pos: int, partial: bool) -> tuple[ToolCall | None, int | None]:
        pos = _expect(text, _skip_space(text, pos), FUNCTION_OPEN, partial)
        if pos is None:
            return (None, None)
        name, pos = _name_at(text, pos, partial)
        if name is None:
            return (None, None)
        types = self.types.get(name, {})
        arguments: dict[str, Any] = {}
        while True:
            pos = _skip_space(text, pos)
            if text.startswith(FUNCTION_CLOSE, pos):
                break
            if partial and FUNCTION_CLOSE.startswith(text[pos:]):  # the end, or maybe its start
                return (_call(name, arguments, complete=False), None)
            pos = _expect(text, pos, PARAMETER_OPEN, partial)
            if pos is None:
                return (_call(name, arguments, complete=False), None)
            key, pos = _name_at(text, pos, partial)
            value, pos = _until(text, pos, PARAMETER_CLOSE, partial) if key is not None else (None, None)
            if value is None:
                return (_call(name, arguments, complete=False), None)
            arguments[key] = _value(_strip_one_newline(value), types.get(key))
        pos = _skip_space(text, pos + len(FUNCTION_CLOSE))
        after = _expect(text, pos, CLOSE, partial)
        if after is None:
            return (_call(name, arguments, complete=False), None)
        return (_call(name, arguments, complete=True), after)


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


def _value(raw: str, types: frozenset[str] | None) -> Any:
    """A parameter's text read back by the JSON types its schema allows (None: any type)."""
    if types == _STRING:
        return raw
    stripped = raw.strip()
    if types is not None and "boolean" in types and stripped in ("True", "False"):
        return stripped == "True"
    try:
        value = json.loads(stripped)
    except ValueError:
        return raw
    may_be_text = types is None or "string" in types
    if may_be_text and (isinstance(value, str) or (types is not None and _json_type(value) not in types)):
        return raw
    return value



def _json_type(value: Any) -> str:
    """The JSON type of a decoded value, as a schema names it."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    for kind, python in (("number", float), ("string", str), ("array", list), ("object", dict)):
        if isinstance(value, python):
            return kind
    return "null"


def _value_types(schema: Any) -> frozenset[str] | None:
    """The JSON types a parameter's values may have (llama.cpp's `value_types`); None: any."""
    if not isinstance(schema, dict):
        return None
    kind, alternatives = schema.get("type"), schema.get("anyOf", schema.get("oneOf"))
    if isinstance(kind, str) or (isinstance(kind, list) and kind and all(isinstance(k, str) for k in kind)):
        kinds = {kind} if isinstance(kind, str) else set(kind)
    elif "const" in schema:
        kinds = {_json_type(schema["const"])}
    elif isinstance(schema.get("enum"), list) and schema["enum"]:
        kinds = {_json_type(value) for value in schema["enum"]}
    elif isinstance(alternatives, list) and alternatives:
        children = [_value_types(child) for child in alternatives]
        if None in children:
            return None
        kinds = set().union(*children)
    else:
        return None
    return frozenset(kinds | ({"integer"} if "number" in kinds else set()))


def _string_choices(schema: dict) -> list[str]:
    """The literal strings a string parameter's `const` or `enum` allows ([]: any text)."""
    if isinstance(schema.get("const"), str):
        return [schema["const"]]
    values = schema.get("enum")
    return [value for value in values if isinstance(value, str)] if isinstance(values, list) else []


def _parameter_types(tool: ToolSpec) -> dict[str, frozenset[str] | None]:
    """Each parameter's value types (_value_types)."""
    properties = tool.parameters.get("properties") if isinstance(tool.parameters, dict) else None
    return {key: _value_types(schema) for key, schema in (properties or {}).items()}


def _call_rules(rule: str, tool: ToolSpec, head: str, parameter_rules, tail: str) -> list[str]:
    """`rule`: one call of `tool` (`head`, its parameters in the schema's order, optional ones
    optional, `tail`); `parameter_rules(rule, key, schema)` spells one parameter."""
    parameters = tool.parameters if isinstance(tool.parameters, dict) else {}
    required = set(parameters.get("required") or ())
    properties = parameters.get("properties") or {}
    parts, rules = [], []
    for j, (key, schema) in enumerate(properties.items()):
        name = f"{rule}_p{j}"
        rules += parameter_rules(name, key, schema if isinstance(schema, dict) else {})
        parts.append(name if key in required else f"{name}?")
    rules.insert(0, f"{rule}: {' '.join([head, *parts, tail])}")
    return rules


def _value_rule(rule: str, schema: dict, close: str) -> tuple[str, list[str]]:
    """A parameter's value then `close`: one of a string enum's literal strings, lazy text up to
    `close` for any other value that may be a string (as llama.cpp's grammar, which reads such a
    value back by its types), else the schema's JSON."""
    types = _value_types(schema)
    choices = _string_choices(schema) if types == _STRING else []
    if choices:
        return f"({' | '.join(lark_literal(c) for c in choices)}) {lark_literal(close)}", []
    if types is None or "string" in types:
        return f"{rule}_text", [f"{rule}_text[lazy]: TEXT {lark_literal(close)}"]
    value = '("true" | "false" | "True" | "False")' if types == {"boolean"} else lark_json(schema)
    return f"{value} {lark_literal(close)}", []


def _qwen_parameter_rules(rule: str, key: str, schema: dict) -> list[str]:
    value, extra = _value_rule(rule, schema, "\n" + PARAMETER_CLOSE)
    return [f'{rule}: {lark_literal(f"{PARAMETER_OPEN}{key}>{chr(10)}")} {value} "\\n"', *extra]


def _glm_parameter_rules(rule: str, key: str, schema: dict) -> list[str]:
    value, extra = _value_rule(rule, schema, VALUE_CLOSE)
    key_lit = lark_literal(f"{KEY_OPEN}{key}{KEY_CLOSE}")
    return [f'{rule}: {key_lit} "\\n"? {lark_literal(VALUE_OPEN)} {value} "\\n"?', *extra]


class GlmFormat(_XmlCallsFormat):
    name = "glm-4.5"
    title = "GLM 4.5"
    separator = '"\\n"?'  # GLM 4.7 writes its calls back to back

    def _body(self, close: str) -> str:
        return "call"  # the name follows the opening tag; the call rule ends with the closing tag

    def _call_rules(self, rule: str, tool: ToolSpec) -> list[str]:
        return _call_rules(rule, tool, f'{lark_literal(tool.name)} "\\n"?', _glm_parameter_rules,
                           lark_literal(CLOSE))

    def _call_at(self, text: str, pos: int, partial: bool) -> tuple[ToolCall | None, int | None]:
        ends = [at for at in (text.find("\n", pos), text.find(KEY_OPEN, pos), text.find(CLOSE, pos)) if at >= 0]
        if not ends:  # the name is not known yet
            if partial:
                return (None, None)
            raise _Malformed
        name = text[pos:min(ends)].strip()
        if not name or any(c in name for c in "<>{}\"\n"):
            raise _Malformed
        pos = min(ends)
        types = self.types.get(name, {})
        arguments: dict[str, Any] = {}
        while True:
            pos = _skip_space(text, pos)
            if text.startswith(CLOSE, pos):
                return (_call(name, arguments, complete=True), pos + len(CLOSE))
            if partial and CLOSE.startswith(text[pos:]):
                return (_call(name, arguments, complete=False), None)
            pos = _expect(text, pos, KEY_OPEN, partial)
            key, pos = _until(text, pos, KEY_CLOSE, partial) if pos is not None else (None, pos)
            if key is not None:
                pos = _expect(text, _skip_space(text, pos), VALUE_OPEN, partial)
            value, pos = _until(text, pos, VALUE_CLOSE, partial) if key is not None and pos is not None else (None, None)
            if value is None:
                return (_call(name, arguments, complete=False), None)
            arguments[key.strip()] = _value(value, types.get(key.strip()))


def _until(text: str, pos: int, close: str, partial: bool) -> tuple[str | None, int | None]:
    """The text up to `close` and the position after it; (None, None) while unfinished (partial)."""
    end = text.find(close, pos)
    if end < 0:
        if partial:
            return None, None
        raise _Malformed
    return text[pos:end], end + len(close)
