"""Tool-call formats: how calls look in a model's output, the grammar that makes them valid, and
the parser that reads them back (on the final text, and on every streamed prefix).

Formats (the one a chat template's family names, lamplight.chat.families; plan.py's FORMATS):
- generic: the whole reply is JSON, `{"tool_call": {"name", "arguments"}}`, `{"tool_calls": [...]}`
  (parallel) or `{"response": "<text>"}` (tool_choice auto). See generic.py for the prompt side.
- hermes (Hermes 2 Pro, Qwen 2.5/3): `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`,
  several separated by a newline; text may come before the first call.
- llama3 (Llama 3.1+): `{"name": ..., "parameters": {...}}` as the whole reply, or after
  `<|python_tag|>` when the template has that token; one call per reply.
- mistral (Mistral Nemo): `[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": "<9 alnum>"}, ...]`.
- granite, command-r7b, command-r-plus (MarkerArrayFormat), deepseek-r1, deepseek-v3.1
  (HeadedCallsFormat): see README.md. gpt-oss (harmony): harmony.py.

Parsing: `parse(text, partial)`. With partial=True (streaming) an unfinished call is reported with
the arguments so far (a prefix of its final arguments), text that may be the start of a call
marker is held back, and calls whose name is not known yet are left out. With partial=False
anything that is not a well-formed call (e.g. cut by max_tokens) is content, as llama-server
falls back to content when its parser fails.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from lamplight.chat.text import marker_prefix_length

from .base import GrammarSource, ParsedMessage, ToolFormat, ToolPlan
from .grammar_text import call_schema, lark_json, marker_grammar, marker_lark, markers_lark, one_of, tool_schema
from .json_scan import JsonMalformed, Node, minify, partial_string_value, scan_value, skip_ws
from .spec import ToolCall, ToolSpec


class _Malformed(Exception):
    pass


def hold_back(text: str, markers: tuple[str, ...]) -> str:
    """Streamed content: without a trailing partial marker, nor trailing whitespace (it may be
    the separator before a call; it is sent once more text or the end shows it is content)."""
    cut = max((marker_prefix_length(text, m) for m in markers), default=0)
    return text[:len(text) - cut].rstrip()


# call_at(text, start, partial) -> (call or None, where the text goes on or None while
# unfinished), or None when what follows the marker is no call.
CallAt = Callable[[str, int, bool], "tuple[ToolCall | None, int | None] | None"]


def parse_tagged_calls(text: str, partial: bool, marker: str, call_at: CallAt,
                       trim_before: bool = False) -> ParsedMessage:
    """Text, then calls that each begin with `marker` (whitespace or text between them);
    `trim_before` drops the whitespace that ends the text before a call."""
    content: list[str] = []
    calls: list[ToolCall] = []
    pos = 0
    while True:
        at = text.find(marker, pos)
        if at < 0:
            rest = text[pos:]
            if calls and not rest.strip():
                rest = ""
            content.append(hold_back(rest, (marker,)) if partial else rest)
            break
        before = text[pos:at]
        if not calls or before.strip():
            content.append(before.rstrip() if trim_before else before)
        outcome = call_at(text, at + len(marker), partial)
        if outcome is None:  # not a call: the rest is content
            content.append(text[at:])
            break
        call, next_pos = outcome
        if call is not None:
            calls.append(call)
        if next_pos is None:  # unfinished (partial)
            break
        pos = next_pos
    joined = "".join(content)
    if calls and not joined.strip():
        joined = ""
    return ParsedMessage(joined, calls)


@dataclass(frozen=True)
class CallKeys:
    """The keys of a call object: `{"name", "arguments"}` in most formats."""

    name: str = "name"
    arguments: tuple[str, ...] = ("arguments",)
    id: str = "id"


def call_from_object(text: str, node: Node, partial: bool, arguments_keys: tuple[str, ...] = ("arguments",),
                     needs_id: bool = False, keys: CallKeys | None = None) -> ToolCall | None:
    """A call object -> ToolCall. None while partial and not yet reportable (name unknown, or
    `needs_id` and the id not yet known); _Malformed when it can never be a call."""
    keys = keys or CallKeys(arguments=arguments_keys)
    if node.kind != "object":
        raise _Malformed
    if not node.complete and not partial:
        raise _Malformed
    name_node = node.get(text, keys.name)
    if name_node is None or not name_node.complete:
        if node.complete or (name_node is not None and name_node.kind != "string"):
            raise _Malformed
        return None
    name = name_node.value(text)
    if not isinstance(name, str) or not name:
        raise _Malformed
    id_node = node.get(text, keys.id)
    call_id = None
    if id_node is not None and id_node.complete:
        call_id = id_node.value(text)
        if not isinstance(call_id, str):
            raise _Malformed
    elif needs_id and not node.complete:
        return None
    args_node = next((n for key in keys.arguments if (n := node.get(text, key)) is not None), None)
    return ToolCall(name, _arguments_text(text, node, args_node), call_id, complete=node.complete)


def _arguments_text(text: str, call_node: Node, args_node: Node | None) -> str:
    """A call's arguments as (a prefix of) their minified JSON text."""
    if args_node is None:
        return "{}" if call_node.complete else ""
    if args_node.kind == "string":  # arguments given as a JSON text
        return args_node.value(text) if args_node.complete else ""
    return minify(args_node.raw(text))


# -- generic ------------------------------------------------------------------------------------

class GenericFormat(ToolFormat):
    """The whole reply is one JSON object (llama.cpp's generic format)."""

    name = "generic"
    title = "Generic"
    generic = True

    def schema(self, plan: ToolPlan) -> dict:
        calls = one_of([call_schema(tool) for tool in plan.callable_tools])
        if plan.parallel:
            call = {"type": "object", "properties": {"tool_calls": {"type": "array", "items": calls, "minItems": 1}},
                    "required": ["tool_calls"]}
        else:
            call = {"type": "object", "properties": {"tool_call": calls}, "required": ["tool_call"]}
        if plan.choice == "required":
            return call
        response = {"type": "object", "properties": {"response": {"type": "string"}}, "required": ["response"]}
        return {"anyOf": [call, response]}

    def grammar(self, plan: ToolPlan, tokenizer: Any) -> GrammarSource:
        return GrammarSource("json_schema", tool_schema(self.schema(plan)))

    def parse(self, text: str, partial: bool = False) -> ParsedMessage:
        try:
            return self._parse(text, partial)
        except (_Malformed, JsonMalformed):
            return ParsedMessage(content=text)

    def _parse(self, text: str, partial: bool) -> ParsedMessage:
        root = scan_value(text, 0)
        if root is None:
            if partial:
                return ParsedMessage()
            raise _Malformed
        if root.kind != "object":
            raise _Malformed
        if root.complete and skip_ws(text, root.end) != len(text):
            raise _Malformed
        if not root.complete and not partial:
            raise _Malformed
        if not root.members:
            if root.complete:
                raise _Malformed
            return ParsedMessage()
        key_node, value = root.members[0]
        if not key_node.complete:
            return ParsedMessage()
        key = key_node.value(text)
        if key not in ("tool_call", "tool_calls", "response") or (root.complete and len(root.members) != 1):
            raise _Malformed
        if value is None:
            return ParsedMessage()
        if key == "response":
            if value.kind == "string":
                return ParsedMessage(content=partial_string_value(text, value))
            return ParsedMessage(content=value.raw(text) if value.complete else "")
        if key == "tool_call":
            call = call_from_object(text, value, partial)
            return ParsedMessage(tool_calls=[call] if call is not None else [])
        if value.kind != "array":
            raise _Malformed
        calls = []
        for item in value.items:
            call = call_from_object(text, item, partial)
            if call is None:
                break
            calls.append(call)
        if value.complete and not calls:
            raise _Malformed
        return ParsedMessage(tool_calls=calls)


# -- Hermes / Qwen --------------------------------------------------------------------------------

class HermesFormat(ToolFormat):
    name = "hermes"
    title = "Hermes 2 Pro"
    OPEN = "<tool_call>"
    CLOSE = "</tool_call>"
    triggers = (OPEN,)

    def grammar(self, plan: ToolPlan, tokenizer: Any) -> GrammarSource:
        open_, open_is_token = marker_lark(tokenizer, self.OPEN)
        close, _ = marker_lark(tokenizer, self.CLOSE)
        body = f'"\\n" call_json "\\n" {close}'
        more = f' ("\\n" {open_} {body})*' if plan.parallel else ""
        call_json = "call_json: " + lark_json(one_of([call_schema(t) for t in plan.callable_tools]))
        return GrammarSource("lark", marker_grammar(plan.choice == "required", open_, open_is_token,
                                                    body + more, [call_json]))

    def parse(self, text: str, partial: bool = False) -> ParsedMessage:
        return parse_tagged_calls(text, partial, self.OPEN, self._call_at)

    def _call_at(self, text: str, start: int, partial: bool) -> tuple[ToolCall | None, int | None] | None:
        """-> (call, where the text continues; None while unfinished), or None if malformed."""
        try:
            node = scan_value(text, start)
            if node is None:
                return (None, None) if partial else None
            call = call_from_object(text, node, partial)
        except (_Malformed, JsonMalformed):
            return None
        if not node.complete:
            return (call, None) if partial else None
        after = skip_ws(text, node.end)
        if text.startswith(self.CLOSE, after):
            return call, after + len(self.CLOSE)
        rest = text[after:]
        if not rest or (partial and self.CLOSE.startswith(rest)):
            return call, (None if partial and rest else len(text))
        return None


# -- Llama 3.x ------------------------------------------------------------------------------------

class Llama3Format(ToolFormat):
    name = "llama3"
    PYTHON_TAG = "<|python_tag|>"

    def __init__(self, python_tag: bool = False):
        self.python_tag = python_tag  # the template knows <|python_tag|>
        self.title = "Llama 3.x with builtin tools" if python_tag else "Llama 3.x"
        self.triggers = ("{", self.PYTHON_TAG) if python_tag else ("{",)

    def grammar(self, plan: ToolPlan, tokenizer: Any) -> GrammarSource:
        schemas = [call_schema(t, "parameters") for t in plan.callable_tools]
        rules = ["%llguidance {}"]
        if plan.choice == "required":
            rules.append("start: call")
        else:
            # A reply that starts with "{" is a call; any other text is content. No text lexeme
            # may start with "{": the JSON's lexemes must be the only reading of a leading brace.
            alternatives = ["PLAIN?", "WS", "WS? call"]
            if self.python_tag:
                tag, tag_is_token = marker_lark(tokenizer, self.PYTHON_TAG)
                if tag_is_token:
                    alternatives.append(f"(PLAIN | WS)? {tag} call")
                else:
                    alternatives.append("trigger call")
                    rules.append(f"trigger[lazy]: LEAD {tag}")
                    rules.append(r"LEAD: /([ \t\n]*[^{ \t\n](.|\n)*)?/")
            rules.append("start: " + " | ".join(alternatives))
            rules.append(r"PLAIN: /[ \t\n]*[^{ \t\n](.|\n)*/")
            rules.append(r"WS: /[ \t\n]+/")
        rules.append("call: " + lark_json(one_of(schemas)))
        return GrammarSource("lark", "\n".join(rules) + "\n")

    def parse(self, text: str, partial: bool = False) -> ParsedMessage:
        at = text.find(self.PYTHON_TAG)
        if at >= 0:
            content, start = text[:at], at + len(self.PYTHON_TAG)
        else:
            start = skip_ws(text, 0)
            if start == len(text) or text[start] != "{":
                if partial:
                    return ParsedMessage(hold_back(text, (self.PYTHON_TAG,)))
                return ParsedMessage(text)
            content = ""
        try:
            node = scan_value(text, start)
            if node is None:
                if partial:
                    return ParsedMessage(content)
                raise _Malformed
            call = call_from_object(text, node, partial, ("parameters", "arguments"))
            if node.complete and skip_ws(text, node.end) != len(text):
                raise _Malformed
        except (_Malformed, JsonMalformed):
            return ParsedMessage(text)
        return ParsedMessage(content, [call] if call is not None else [])


# -- a marker, then a JSON array of calls (Mistral Nemo, Granite, Command R7B) ---------------------

class MarkerArrayFormat(ToolFormat):
    """`MARKER[{call}, ...]END`: text may come before the marker; END (if any) closes the array."""

    MARKER = ""
    END = ""
    END_LEAD = ""  # what the grammar writes between the array and END (parsing allows any whitespace)
    KEYS = CallKeys()
    ID_SCHEMA: dict | None = None  # the model writes ids (required in the grammar) when set
    ID_FIRST = False  # the id is the object's first key

    @property
    def triggers(self) -> tuple[str, ...]:  # type: ignore[override]
        return (self.MARKER,)

    def call_schema(self, tool: ToolSpec) -> dict:
        extra = {self.KEYS.id: self.ID_SCHEMA} if self.ID_SCHEMA and self.ID_FIRST else None
        schema = call_schema(tool, self.KEYS.arguments[0], extra, self.KEYS.name)
        if self.ID_SCHEMA and not self.ID_FIRST:
            schema["properties"][self.KEYS.id] = self.ID_SCHEMA
            schema["required"].append(self.KEYS.id)
        return schema

    def grammar(self, plan: ToolPlan, tokenizer: Any) -> GrammarSource:
        marker, marker_is_token = marker_lark(tokenizer, self.MARKER)
        items = one_of([self.call_schema(t) for t in plan.callable_tools])
        array: dict[str, Any] = {"type": "array", "items": items, "minItems": 1}
        if not plan.parallel:
            array["maxItems"] = 1
        calls = "calls"
        if self.END:
            calls += " " + markers_lark(tokenizer, self.END_LEAD, self.END)
        return GrammarSource("lark", marker_grammar(plan.choice == "required", marker, marker_is_token,
                                                    calls, ["calls: " + lark_json(array)]))

    def parse(self, text: str, partial: bool = False) -> ParsedMessage:
        at = text.find(self.MARKER)
        if at < 0:
            return ParsedMessage(hold_back(text, (self.MARKER,)) if partial else text)
        content = text[:at]
        try:
            node = scan_value(text, at + len(self.MARKER))
            if node is None:
                if partial:
                    return ParsedMessage(content)
                raise _Malformed
            if node.kind != "array" or (not node.complete and not partial):
                raise _Malformed
            if node.complete and not self._ends_well(text, node.end, partial):
                raise _Malformed
            calls = []
            for item in node.items:
                call = call_from_object(text, item, partial, needs_id=self.ID_SCHEMA is not None, keys=self.KEYS)
                if call is None:
                    break
                calls.append(call)
            if node.complete and not calls:
                raise _Malformed
        except (_Malformed, JsonMalformed):
            return ParsedMessage(text)
        return ParsedMessage(content, calls)

    def _ends_well(self, text: str, end: int, partial: bool) -> bool:
        """After the array: nothing, or the END marker (a prefix of it while streaming)."""
        rest = text[skip_ws(text, end):]
        if not self.END:
            return not rest
        return rest.startswith(self.END) and not rest[len(self.END):].strip() \
            or (partial and self.END.startswith(rest))


class MistralFormat(MarkerArrayFormat):
    """Mistral Nemo: `[TOOL_CALLS][{"name", "arguments", "id": 9 alphanumerics}, ...]`."""

    name = "mistral"
    title = "Mistral Nemo"
    MARKER = "[TOOL_CALLS]"
    ID_SCHEMA = {"type": "string", "pattern": "^[a-zA-Z0-9]{9}$"}


class GraniteFormat(MarkerArrayFormat):
    """IBM Granite 3.x: `<|tool_call|>[{"name", "arguments"}, ...]`."""

    name = "granite"
    title = "Granite"
    MARKER = "<|tool_call|>"


class CommandR7BFormat(MarkerArrayFormat):
    """Command R7B: `<|START_ACTION|>[{"tool_call_id": "0", "tool_name", "parameters"}, ...]<|END_ACTION|>`;
    its tool_call_id is the call's id (as llama-server takes it)."""

    name = "command-r7b"
    title = "Command R7B"
    MARKER = "<|START_ACTION|>"
    END = "<|END_ACTION|>"
    KEYS = CallKeys(name="tool_name", arguments=("parameters",), id="tool_call_id")
    ID_SCHEMA = {"type": "string", "pattern": "^[0-9]{1,10}$"}
    ID_FIRST = True


class CommandRPlusFormat(MarkerArrayFormat):
    """Command R+ (tool_use template): `Action:\n```json\n[{"tool_name", "parameters"}, ...]\n```` after
    an optional plan in text; the template writes past calls the same way."""

    name = "command-r-plus"
    title = "Command R+"
    MARKER = "Action:\n```json\n"
    END = "```"
    END_LEAD = "\n"
    KEYS = CallKeys(name="tool_name", arguments=("parameters",))


# -- a block of headed calls (DeepSeek R1, V3.1) ---------------------------------------------------

class HeadedCallsFormat(ToolFormat):
    """`BLOCK_OPEN (CALL_OPEN name NAME_END {arguments} CALL_CLOSE)+ BLOCK_CLOSE`, calls separated
    by SEPARATOR. Markers are tuples of pieces: each piece that is one control token of the
    vocabulary is matched as that token in the grammar. Whitespace between the arguments and
    CALL_CLOSE's pieces is allowed when parsing (llama.cpp's close regexes allow it)."""

    BLOCK_OPEN = ""
    BLOCK_CLOSE = ""
    CALL_OPEN: tuple[str, ...] = ()
    NAME_END = ""
    CALL_CLOSE: tuple[str, ...] = ()
    SEPARATOR = ""

    @property
    def triggers(self) -> tuple[str, ...]:  # type: ignore[override]
        return (self.BLOCK_OPEN,)

    def grammar(self, plan: ToolPlan, tokenizer: Any) -> GrammarSource:
        def lark(*pieces: str) -> str:
            return markers_lark(tokenizer, *pieces)

        block_open, open_is_token = marker_lark(tokenizer, self.BLOCK_OPEN)
        named = [f"{lark(tool.name, self.NAME_END)} {lark_json(tool.parameters)}" for tool in plan.callable_tools]
        rules = [f"call: {lark(*self.CALL_OPEN)} ({' | '.join(named)}) {lark(*self.CALL_CLOSE)}"]
        more = f" ({lark(self.SEPARATOR)} call)*" if plan.parallel and self.SEPARATOR else " call*" if plan.parallel else ""
        calls = f"call{more} {lark(self.BLOCK_CLOSE)}"
        return GrammarSource("lark", marker_grammar(plan.choice == "required", block_open, open_is_token, calls, rules))

    def parse(self, text: str, partial: bool = False) -> ParsedMessage:
        at = text.find(self.BLOCK_OPEN)
        if at < 0:
            return ParsedMessage(hold_back(text, (self.BLOCK_OPEN,)) if partial else text)
        try:
            calls = self._calls(text, at + len(self.BLOCK_OPEN), partial)
        except (_Malformed, JsonMalformed):
            return ParsedMessage(text)
        return ParsedMessage(text[:at], calls)

    def _calls(self, text: str, pos: int, partial: bool) -> list[ToolCall]:
        call_open = "".join(self.CALL_OPEN)
        calls: list[ToolCall] = []
        while True:
            pos = skip_ws(text, pos)
            rest = text[pos:]
            if rest.startswith(self.BLOCK_CLOSE) and calls:
                if rest[len(self.BLOCK_CLOSE):].strip():
                    raise _Malformed
                return calls
            if partial and (self.BLOCK_CLOSE.startswith(rest) or call_open.startswith(rest)):
                return calls  # also: the end of the text
            if not rest and calls:
                return calls  # generation ended without closing the block: the calls stand
            if not rest.startswith(call_open):
                raise _Malformed
            call, next_pos = self._call(text, pos + len(call_open), partial)
            if call is not None:
                calls.append(call)
            if next_pos is None:
                return calls
            pos = next_pos

    def _call(self, text: str, pos: int, partial: bool) -> tuple[ToolCall | None, int | None]:
        """One call from its name on -> (the call or None while its name is unfinished, where the
        text continues or None at its end)."""
        name_end = text.find(self.NAME_END, pos)
        if name_end < 0:
            tail = text[pos:]
            if partial and "\n" not in tail[:len(tail) - marker_prefix_length(tail, self.NAME_END)]:
                return None, None  # the name, perhaps followed by the start of NAME_END
            raise _Malformed
        name = text[pos:name_end].strip()
        if not name or "\n" in name:
            raise _Malformed
        node = scan_value(text, name_end + len(self.NAME_END))
        if node is None or not node.complete:
            if not partial:
                raise _Malformed
            arguments = minify(node.raw(text)) if node is not None else ""
            if node is not None and node.kind != "object":
                raise _Malformed
            return ToolCall(name, arguments, complete=False), None
        if node.kind != "object":
            raise _Malformed
        return ToolCall(name, minify(node.raw(text))), self._after_close(text, node.end, partial)

    def _after_close(self, text: str, pos: int, partial: bool) -> int | None:
        for piece in (piece.strip() for piece in self.CALL_CLOSE):
            pos = skip_ws(text, pos)
            rest = text[pos:]
            if rest.startswith(piece):
                pos += len(piece)
            elif (partial and piece.startswith(rest)) or not rest:
                return None
            else:
                raise _Malformed
        return pos


class DeepSeekR1Format(HeadedCallsFormat):
    """DeepSeek R1: `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{...}\n```
    <｜tool▁call▁end｜>` (calls separated by a newline) `<｜tool▁calls▁end｜>`."""

    name = "deepseek-r1"
    title = "DeepSeek R1"
    BLOCK_OPEN = "<｜tool▁calls▁begin｜>"
    BLOCK_CLOSE = "<｜tool▁calls▁end｜>"
    CALL_OPEN = ("<｜tool▁call▁begin｜>", "function", "<｜tool▁sep｜>")
    NAME_END = "\n```json\n"
    CALL_CLOSE = ("\n```", "<｜tool▁call▁end｜>")
    SEPARATOR = "\n"


class DeepSeekV31Format(HeadedCallsFormat):
    """DeepSeek V3.1: `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>`."""

    name = "deepseek-v3.1"
    title = "DeepSeek V3.1"
    BLOCK_OPEN = DeepSeekR1Format.BLOCK_OPEN
    BLOCK_CLOSE = DeepSeekR1Format.BLOCK_CLOSE
    CALL_OPEN = ("<｜tool▁call▁begin｜>",)
    NAME_END = "<｜tool▁sep｜>"
    CALL_CLOSE = ("<｜tool▁call▁end｜>",)

