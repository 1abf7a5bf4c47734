"""JSON that may still be arriving: a scanner that reads a prefix of a JSON text into spans.

Tool-call parsers run on every streamed token, so they must tell "valid so far, not finished"
(keep waiting) from "cannot be JSON" (treat as content). `scan_value` returns a tree of `Node`s
with the source span of every value; an unfinished value reaches the end of the text with
`complete=False`. `JsonMalformed` means no continuation can make the text valid.

Arguments are streamed as `minify(raw text of the value)`: removing the whitespace outside
strings is decided character by character, so the minified prefix of a value is always a prefix
of the minified whole value, and the final arguments equal the concatenated fragments.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

_WS = " \t\n\r"
_LITERALS = ("true", "false", "null")
_ESCAPES = '"\\/bfnrt'
_HEX = "0123456789abcdefABCDEF"


class JsonMalformed(ValueError):
    """The text cannot be (the beginning of) a JSON value."""


@dataclass
class Node:
    kind: str  # object | array | string | number | literal
    start: int
    end: int  # exclusive; the end of the text while incomplete
    complete: bool
    members: list[tuple["Node", "Node | None"]] = field(default_factory=list)  # object: (key, value)
    items: list["Node"] = field(default_factory=list)  # array

    def raw(self, text: str) -> str:
        return text[self.start:self.end]

    def value(self, text: str):
        """The decoded value of a complete node."""
        return json.loads(self.raw(text))

    def get(self, text: str, key: str) -> "Node | None":
        """An object's member value by key (complete keys only); None when absent so far."""
        for key_node, value in self.members:
            if key_node.complete and key_node.value(text) == key:
                return value
        return None

    def keys(self, text: str) -> list[str]:
        return [k.value(text) for k, _ in self.members if k.complete]


def skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WS:
        i += 1
    return i


def scan_value(text: str, i: int) -> Node | None:
    """The value starting at text[i] (after whitespace); None when the text ends before it starts."""
    i = skip_ws(text, i)
    if i >= len(text):
        return None
    char = text[i]
    if char == "{":
        return _object(text, i)
    if char == "[":
        return _array(text, i)
    if char == '"':
        return _string(text, i)
    if char == "-" or char.isdigit():
        return _number(text, i)
    if char in "tfn":
        return _literal(text, i)
    raise JsonMalformed(f"unexpected {char!r} at {i}")


def _object(text: str, start: int) -> Node:
    node = Node("object", start, len(text), False)
    i = skip_ws(text, start + 1)
    if _closes(text, node, i, "}"):
        return node
    while True:
        if i >= len(text):
            return node
        if text[i] != '"':
            raise JsonMalformed(f"expected a key at {i}")
        key = _string(text, i)
        if not key.complete:
            node.members.append((key, None))
            return node
        i = skip_ws(text, key.end)
        if i >= len(text):
            node.members.append((key, None))
            return node
        if text[i] != ":":
            raise JsonMalformed(f"expected ':' at {i}")
        value = scan_value(text, i + 1)
        node.members.append((key, value))
        if value is None or not value.complete:
            return node
        i = _after_item(text, node, value.end, "}")
        if i is None:
            return node
        i = skip_ws(text, i)


def _array(text: str, start: int) -> Node:
    node = Node("array", start, len(text), False)
    i = skip_ws(text, start + 1)
    if _closes(text, node, i, "]"):
        return node
    while True:
        value = scan_value(text, i)
        if value is None:
            return node
        node.items.append(value)
        if not value.complete:
            return node
        i = _after_item(text, node, value.end, "]")
        if i is None:
            return node


def _closes(text: str, node: Node, i: int, closer: str) -> bool:
    """Complete `node` if its closing bracket stands at `i`."""
    if i < len(text) and text[i] == closer:
        node.end, node.complete = i + 1, True
        return True
    return False


def _after_item(text: str, node: Node, end: int, closer: str) -> int | None:
    """After a member or item ending at `end`: the index past the next ',', or None when the
    text ends there or `closer` completes `node`."""
    i = skip_ws(text, end)
    if i >= len(text) or _closes(text, node, i, closer):
        return None
    if text[i] != ",":
        raise JsonMalformed(f"expected ',' or '{closer}' at {i}")
    return i + 1


def _string(text: str, start: int) -> Node:
    i = start + 1
    n = len(text)
    while i < n:
        char = text[i]
        if char == '"':
            return Node("string", start, i + 1, True)
        if char == "\\":
            if i + 1 >= n:
                break
            escape = text[i + 1]
            if escape == "u":
                digits = text[i + 2:i + 6]
                if any(d not in _HEX for d in digits):
                    raise JsonMalformed(f"bad \\u escape at {i}")
                if len(digits) < 4:
                    break
                i += 6
                continue
            if escape not in _ESCAPES:
                raise JsonMalformed(f"bad escape at {i}")
            i += 2
            continue
        if ord(char) < 0x20:
            raise JsonMalformed(f"control character in a string at {i}")
        i += 1
    return Node("string", start, n, False)


def _number(text: str, start: int) -> Node:
    i = start
    n = len(text)
    while i < n and text[i] in "+-0123456789.eE":
        i += 1
    raw = text[start:i]
    if i < n:  # something follows: the number is finished and must be valid
        try:
            json.loads(raw)
        except ValueError:
            raise JsonMalformed(f"bad number {raw!r} at {start}") from None
        return Node("number", start, i, True)
    if not _number_prefix(raw):
        raise JsonMalformed(f"bad number {raw!r} at {start}")
    return Node("number", start, n, False)


def _number_prefix(raw: str) -> bool:
    try:
        json.loads(raw)
        return True
    except ValueError:
        pass
    for suffix in ("0", "1", "e1", "0e1"):
        try:
            json.loads(raw + suffix)
            return True
        except ValueError:
            continue
    return False


def _literal(text: str, start: int) -> Node:
    for word in _LITERALS:
        piece = text[start:start + len(word)]
        if word.startswith(piece) and piece[:1] == word[0]:
            if len(piece) == len(word):
                return Node("literal", start, start + len(word), True)
            if start + len(piece) == len(text):
                return Node("literal", start, len(text), False)
    raise JsonMalformed(f"unexpected literal at {start}")


def partial_string_value(text: str, node: Node) -> str:
    """The decoded characters of a (possibly unfinished) string node, up to its last whole
    character: a trailing incomplete escape or an unpaired high surrogate is left out, so the
    result only ever grows as the string continues."""
    if node.complete:
        return node.value(text)
    body = text[node.start + 1:node.end]
    cut = len(body)
    backslash = body.rfind("\\")
    if backslash >= 0:
        # Count the run of backslashes: an odd run ending at `backslash` starts an escape.
        run = 0
        while backslash - run >= 0 and body[backslash - run] == "\\":
            run += 1
        escape = body[backslash:]
        if run % 2 == 1 and (len(escape) < 2 or (escape[1] == "u" and len(escape) < 6)):
            cut = backslash
    value = json.loads('"' + body[:cut] + '"')
    if value and 0xD800 <= ord(value[-1]) <= 0xDBFF:
        value = value[:-1]  # wait for the low surrogate
    return value


def minify(raw: str) -> str:
    """`raw` without whitespace outside strings (works on prefixes: see the module docstring)."""
    out = []
    in_string = escaped = False
    for char in raw:
        if in_string:
            out.append(char)
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
            out.append(char)
        elif char not in _WS:
            out.append(char)
    return "".join(out)
