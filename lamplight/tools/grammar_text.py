"""Pieces of the tool-call grammars: call schemas (llama.cpp's JSON-schema rules) and Lark text.

Native formats are llguidance Lark grammars with the JSON parts inlined as `%json {...}`; the
generic format is a plain JSON schema. Schemas get llama.cpp's treatment (objects listing
`properties` are closed; whitespace as llama.cpp's `space` rule) so a tool's `parameters`
constrain the same way whether they come in `json_schema` or in `tools`.
"""

from __future__ import annotations

import json
from typing import Any

from lamplight.grammar.json_schema import LLAMA_CPP_JSON_OPTIONS, llama_cpp_schema

from .spec import ToolSpec

# Any text, before a trigger or as a whole reply (special tokens excluded: llguidance never
# matches control tokens with text).
ANY_TEXT = r"TEXT: /(.|\n)*/"


def call_schema(tool: ToolSpec, arguments_key: str = "arguments", extra: dict | None = None,
                name_key: str = "name") -> dict:
    """`{"name": <the tool's name>, <arguments_key>: <its parameters>}` as a closed object; `extra`
    properties (required) come first, as formats that write an id before the name need."""
    properties: dict[str, Any] = dict(extra or {})
    properties.update({name_key: {"const": tool.name}, arguments_key: tool.parameters})
    required = list(properties)
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


def one_of(schemas: list[dict]) -> dict:
    return schemas[0] if len(schemas) == 1 else {"anyOf": schemas}


# Tool schemas come from an agent's tool definitions, not from the user: a keyword llguidance
# cannot enforce (Claude Code's `propertyNames`, say) is ignored there, as llama.cpp ignores it,
# and the call follows the rest of the schema. A request's own `json_schema` stays strict.
TOOL_JSON_OPTIONS = {**LLAMA_CPP_JSON_OPTIONS, "lenient": True}


def lark_json(schema: dict) -> str:
    """An inline `%json` block with llama.cpp's JSON rules, for tool calls."""
    return "%json " + json.dumps(tool_schema(schema), ensure_ascii=False)


def tool_schema(schema: dict) -> dict:
    """A tool-call schema as its grammar takes it: llama.cpp's rules, leniently (TOOL_JSON_OPTIONS)."""
    return {"x-guidance": dict(TOOL_JSON_OPTIONS), **llama_cpp_schema(schema)}


def lark_literal(text: str) -> str:
    return json.dumps(text)


def marker_lark(tokenizer: Any, marker: str) -> tuple[str, bool]:
    """How a grammar spells a format's marker: `<[id]>` when the vocabulary has it as one control
    token (llguidance never matches those with text), else a string literal. -> (lark, is_token)."""
    if tokenizer is not None:
        ids = tokenizer.encode(marker, add_special=False, parse_special=True)
        if len(ids) == 1 and tokenizer.is_control(ids[0]):
            return f"<[{ids[0]}]>", True
    return lark_literal(marker), False


def mixed_marker_lark(tokenizer: Any, marker: str) -> str:
    """A marker that may mix control tokens and text, as a sequence: each control token of the
    vocabulary as `<[id]>`, the text around them as string literals (Gemma 4's `<|channel>thought`
    is the token `<|channel>` then the text `thought`; as one literal it could never match, since
    llguidance never matches a control token with text). For a grammar rule, not inside a lazy
    lexeme (a lexeme holds text only)."""
    whole, is_token = marker_lark(tokenizer, marker)
    if is_token or tokenizer is None:
        return whole
    pieces: list[str] = []
    rest = marker
    for token in tokenizer.encode(marker, add_special=False, parse_special=True):
        if not tokenizer.is_control(token):
            continue
        at = rest.find(tokenizer.piece(token))
        if at < 0:  # not spelled as its piece: leave the marker as text
            return whole
        if at:
            pieces.append(lark_literal(rest[:at]))
        pieces.append(f"<[{token}]>")
        rest = rest[at + len(tokenizer.piece(token)):]
    if rest:
        pieces.append(lark_literal(rest))
    return " ".join(pieces)


def markers_lark(tokenizer: Any, *pieces: str) -> str:
    """Pieces of a marker in sequence, each spelled as marker_lark does (empty pieces skipped)."""
    return " ".join(marker_lark(tokenizer, piece)[0] for piece in pieces if piece)


def text_then(marker: str, marker_is_token: bool, rule: str = "trigger") -> tuple[str, list[str]]:
    """Free text ending with `marker`, as a grammar expression plus the rules it needs.

    With a control token the text simply stops before the token. With a text marker the text is
    a *lazy* lexeme: it ends at the first occurrence of the marker, so the constrained part starts
    right there, even when the marker's last characters came inside a larger token."""
    if marker_is_token:
        return f"TEXT {marker}", []
    return rule, [f"{rule}[lazy]: TEXT {marker}"]


def marker_grammar(required: bool, marker: str, marker_is_token: bool, calls: str, rules: list[str]) -> str:
    """Lark for formats whose calls follow a marker: `calls` (an expression over `rules`) right
    after the marker; with tool_choice "required" from the first token, else free text first and
    the constrained part from the marker on."""
    lines = ["%llguidance {}"]
    if required:
        lines.append(f"start: {marker} {calls}")
    else:
        first, extra = text_then(marker, marker_is_token)
        lines.append(f"start: TEXT | {first} {calls}")
        lines += extra
    lines.append(ANY_TEXT)
    lines += rules
    return "\n".join(lines) + "\n"
