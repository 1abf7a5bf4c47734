"""llama.cpp's GBNF dialect, parsed as `llama-grammar.cpp` parses it, into a small syntax tree."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NoReturn, Union

from .errors import GrammarError

MAX_REPETITION = 2000  # llama.cpp's MAX_REPETITION_THRESHOLD
# Parenthesised groups inside groups. llama.cpp has no limit (its parser recurses on the C++
# stack); ours and the conversion to Lark recurse in Python, so deeper grammars are refused.
MAX_NESTING = 64


@dataclass(frozen=True)
class Chars:
    """One code point out of a set of inclusive ranges (or outside it, when negated)."""

    ranges: tuple[tuple[int, int], ...]
    negated: bool


@dataclass(frozen=True)
class Literal:
    text: str


@dataclass(frozen=True)
class AnyChar:
    pass


@dataclass(frozen=True)
class RuleRef:
    name: str


@dataclass(frozen=True)
class TokenRef:
    """`<[id]>` or `<text>` (one token of the vocabulary); `!` in front negates it."""

    spelling: str
    negated: bool


@dataclass(frozen=True)
class Group:
    alternatives: tuple[tuple["Node", ...], ...]


@dataclass(frozen=True)
class Repeat:
    node: "Node"
    min: int
    max: int | None  # None: unbounded


Node = Union[Chars, Literal, AnyChar, RuleRef, TokenRef, Group, Repeat]
Rules = dict[str, Group]


def parse_gbnf(source: str) -> Rules:
    """Rules by name, in order of definition; raises GrammarError with llama.cpp's wording."""
    rules = _Parser(source).parse_rules()
    _check_references(rules)
    return rules


# -- parsing ------------------------------------------------------------------------------------


def _is_word_char(char: str) -> bool:
    return char.isascii() and (char.isalnum() or char == "-")


class _Parser:
    def __init__(self, source: str):
        self.src = source
        self.pos = 0
        self.depth = 0  # open groups around the current position

    def parse_rules(self) -> Rules:
        rules: Rules = {}
        self.skip_space(newline_ok=True)
        while not self.at_end():
            name, body = self.parse_rule()
            rules[name] = body  # a later definition replaces an earlier one, as in llama.cpp
        if "root" not in rules:
            raise GrammarError("grammar does not contain a 'root' rule")
        return rules

    def parse_rule(self) -> tuple[str, Group]:
        name = self.parse_name()
        self.skip_space(newline_ok=False)
        if not self.src.startswith("::=", self.pos):
            self.fail("expecting ::=")
        self.pos += 3
        self.skip_space(newline_ok=True)
        body = self.parse_alternates(nested=False)
        if self.peek() in ("\r", "\n"):
            self.pos += 2 if self.src.startswith("\r\n", self.pos) else 1
        elif not self.at_end():
            self.fail("expecting newline or end")
        self.skip_space(newline_ok=True)
        return name, body

    def parse_alternates(self, nested: bool) -> Group:
        alternatives = [self.parse_sequence(nested)]
        while self.peek() == "|":
            self.pos += 1
            self.skip_space(newline_ok=True)
            alternatives.append(self.parse_sequence(nested))
        return Group(tuple(alternatives))

    def parse_sequence(self, nested: bool) -> tuple[Node, ...]:
        items: list[Node] = []
        while not self.at_end():
            char = self.peek()
            if char in "*+?{":
                if not items:
                    self.fail("expecting preceding item to */+/?/{")
                items[-1] = self.parse_repetition(items[-1], nested)
                continue
            item = self.parse_item(char)
            if item is None:
                break
            items.append(item)
            self.skip_space(newline_ok=nested)
        return tuple(items)

    def parse_item(self, char: str) -> Node | None:
        if char == '"':
            return self.parse_literal()
        if char == "[":
            return self.parse_char_class()
        if char in "<!":
            return self.parse_token_ref()
        if _is_word_char(char):
            return RuleRef(self.parse_name())
        if char == "(":
            return self.parse_group()
        if char == ".":
            self.pos += 1
            return AnyChar()
        return None

    def parse_literal(self) -> Literal:
        self.pos += 1
        chars = []
        while self.peek() != '"':
            if self.at_end():
                self.fail("unexpected end of input")
            chars.append(self.parse_char())
        self.pos += 1
        return Literal("".join(chars))

    def parse_char_class(self) -> Chars:
        self.pos += 1
        negated = self.peek() == "^"
        if negated:
            self.pos += 1
        ranges = []
        while self.peek() != "]":
            if self.at_end():
                self.fail("unexpected end of input")
            low = high = ord(self.parse_char())
            if self.peek() == "-" and self.peek(1) not in ("]", ""):
                self.pos += 1
                high = ord(self.parse_char())
            elif self.peek() == "-" and self.peek(1) == "":
                self.fail("unexpected end of input")
            ranges.append((low, high))
        self.pos += 1
        return Chars(tuple(ranges), negated)

    def parse_token_ref(self) -> TokenRef:
        negated = self.peek() == "!"
        if negated:
            self.pos += 1
        if self.peek() != "<":
            self.fail("expecting '<'")
        end = self.src.find(">", self.pos)
        if end < 0:
            self.fail("expecting '>'")
        spelling = self.src[self.pos : end + 1]
        self.pos = end + 1
        return TokenRef(spelling, negated)

    def parse_group(self) -> Group:
        if self.depth >= MAX_NESTING:
            self.fail(f"groups nested more than {MAX_NESTING} deep")
        self.pos += 1
        self.depth += 1
        self.skip_space(newline_ok=True)
        group = self.parse_alternates(nested=True)
        if self.peek() != ")":
            self.fail("expecting ')'")
        self.pos += 1
        self.depth -= 1
        return group

    def parse_repetition(self, node: Node, nested: bool) -> Repeat:
        op = self.peek()
        self.pos += 1
        self.skip_space(newline_ok=nested)
        if op == "*":
            return Repeat(node, 0, None)
        if op == "+":
            return Repeat(node, 1, None)
        if op == "?":
            return Repeat(node, 0, 1)
        return self.parse_braces(node, nested)

    def parse_braces(self, node: Node, nested: bool) -> Repeat:
        # `{,n}` is accepted too (llama.cpp's README shows it; its parser wants the minimum)
        low = self.parse_int() if self.peek() != "," else 0
        self.skip_space(newline_ok=nested)
        high: int | None = low
        if self.peek() == ",":
            self.pos += 1
            self.skip_space(newline_ok=nested)
            high = self.parse_int() if self.peek().isdigit() else None
            self.skip_space(newline_ok=nested)
        if self.peek() != "}":
            self.fail("expecting '}'")
        self.pos += 1
        self.skip_space(newline_ok=nested)
        if low > MAX_REPETITION:
            self.fail("number of repetitions exceeds sane defaults, please reduce the number of repetitions")
        if high is not None and high > MAX_REPETITION:
            high = None  # llama.cpp's rule: such a maximum means no maximum
        if high is not None and high < low:
            self.fail(f"repetition maximum {high} is below its minimum {low}")
        return Repeat(node, low, high)

    def parse_char(self) -> str:
        char = self.peek()
        if char != "\\":
            self.pos += 1
            return char
        escape = self.peek(1)
        hex_digits = {"x": 2, "u": 4, "U": 8}.get(escape)
        if hex_digits:
            return self.parse_hex(hex_digits)
        simple = {"t": "\t", "r": "\r", "n": "\n"}.get(escape, escape)
        if escape not in 'trn\\"[]-':
            self.fail("unknown escape")
        self.pos += 2
        return simple

    def parse_hex(self, size: int) -> str:
        digits = self.src[self.pos + 2 : self.pos + 2 + size]
        if len(digits) != size or any(c not in "0123456789abcdefABCDEF" for c in digits):
            self.fail(f"expecting {size} hex chars")
        value = int(digits, 16)
        if value > 0x10FFFF:
            self.fail("code point out of range")
        self.pos += 2 + size
        return chr(value)

    def parse_name(self) -> str:
        start = self.pos
        while not self.at_end() and _is_word_char(self.peek()):
            self.pos += 1
        if self.pos == start:
            self.fail("expecting name")
        return self.src[start : self.pos]

    def parse_int(self) -> int:
        start = self.pos
        while self.peek().isascii() and self.peek().isdigit():
            self.pos += 1
        if self.pos == start:
            self.fail("expecting an int")
        return int(self.src[start : self.pos])

    def skip_space(self, newline_ok: bool) -> None:
        while not self.at_end():
            char = self.peek()
            if char == "#":
                while not self.at_end() and self.peek() not in "\r\n":
                    self.pos += 1
            elif char in " \t" or (newline_ok and char in "\r\n"):
                self.pos += 1
            else:
                return

    def peek(self, offset: int = 0) -> str:
        index = self.pos + offset
        return self.src[index] if index < len(self.src) else ""

    def at_end(self) -> bool:
        return self.pos >= len(self.src)

    def fail(self, what: str) -> NoReturn:
        line = self.src.count("\n", 0, self.pos) + 1
        column = self.pos - (self.src.rfind("\n", 0, self.pos) + 1) + 1
        snippet = self.src[self.pos : self.pos + 24]
        raise GrammarError(f"{what} at line {line}, column {column}: {snippet!r}")


def _check_references(rules: Rules) -> None:
    for body in rules.values():
        for name in _references(body):
            if name not in rules:
                raise GrammarError(f"Undefined rule identifier '{name}'")


def _references(node: Node):
    if isinstance(node, RuleRef):
        yield node.name
    elif isinstance(node, Group):
        for sequence in node.alternatives:
            for item in sequence:
                yield from _references(item)
    elif isinstance(node, Repeat):
        yield from _references(node.node)
