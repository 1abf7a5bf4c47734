"""GBNF rewritten into llguidance's Lark, accepting exactly the strings llama.cpp accepts.

GBNF has no lexer: llama.cpp matches it character by character, so a repetition gives
characters back to what follows it (`[a-z]+ "s"` accepts "cats"). llguidance lexes greedily,
so a lexeme per character is the exact translation, and the slow one (an Earley step per
byte). Regular pieces proven safe by `gbnf_lexemes` become single lexemes instead.
"""

from __future__ import annotations

import json
from typing import Callable

from .errors import GrammarError
from .gbnf import AnyChar, Chars, Group, Literal, Node, Repeat, RuleRef, Rules, TokenRef, parse_gbnf
from .gbnf_lexemes import (
    GrammarSets,
    TooComplex,
    analyse,
    extension_bytes,
    lead_bytes,
    node_ranges,
    repeat_follow,
)

TokenResolver = Callable[[str], int]


def gbnf_to_lark(source: str, token_id: TokenResolver | None = None) -> str:
    """`token_id` resolves `<text>` token references (None: only `<[id]>` works)."""
    rules = parse_gbnf(source)
    sets = analyse(rules)
    rejected: set[tuple] = set()
    extensions: dict[tuple[Node, ...], tuple[bool, int] | None] = {}  # shared by all passes
    while True:
        emitter = _LarkEmitter(rules, sets, token_id, rejected, extensions)
        lark = emitter.grammar()
        clashing = emitter.clashing_lexemes()
        if not clashing:
            return lark
        rejected |= clashing


def _lark_rule_name(index: int, name: str) -> str:
    # GBNF names are case-sensitive and may hold '-'; Lark rule names are lower-case words
    return f"r{index}_{name.lower().replace('-', '_')}"


class _LarkEmitter:
    def __init__(self, rules: Rules, sets: GrammarSets, token_id: TokenResolver | None,
                 rejected: set, extensions: dict):
        self.rules = rules
        self.extensions = extensions
        self.sets = sets
        self.token_id = token_id
        self.rejected = rejected
        self.names = {name: _lark_rule_name(i, name) for i, name in enumerate(rules)}
        self.lexemes: list[tuple[tuple | None, str, int]] = []  # (key if merged, regex, first bytes)

    def grammar(self) -> str:
        """Only rules still referenced after merging are emitted: unused ones would clash."""
        lines = [f"start: {self.names['root']}"]
        self.pending, emitted = ["root"], set()
        while self.pending:
            name = self.pending.pop()
            if name not in emitted:
                emitted.add(name)
                body = self.alternatives(self.rules[name], self.sets.follow[name], (name,))
                lines.append(f"{self.names[name]}: {body}")
        return "\n".join(lines) + "\n"

    def clashing_lexemes(self) -> set[tuple]:
        """Merged lexemes sharing a first byte with a different lexeme (condition (c))."""
        owners = [0] * 256  # per byte: how many distinct lexemes start with it
        firsts: dict[str, int] = {}
        for _, regex, first in self.lexemes:
            firsts[regex] = firsts.get(regex, 0) | first
        for first in firsts.values():
            for byte in _bits(first):
                owners[byte] += 1
        return {
            key
            for key, regex, first in self.lexemes
            if key is not None and any(owners[byte] > 1 for byte in _bits(first))
        }

    # -- structure ------------------------------------------------------------------------------

    def alternatives(self, group: Group, after: int, path: tuple) -> str:
        return " | ".join(
            self.sequence(items, after, path + (i,)) for i, items in enumerate(group.alternatives)
        )

    def sequence(self, items: tuple[Node, ...], after: int, path: tuple) -> str:
        follows = self.sets.follows_in_sequence(items, after)
        parts: list[str] = []
        index = 0
        while index < len(items):
            end = index
            while end < len(items) and self.sets.is_regular(items[end]):
                end += 1
            if end == index:
                parts.append(self.node(items[index], follows[index], path + (index,)))
                end = index + 1
            else:
                parts += self.regular_run(items, index, end, follows, path)
            index = end
        parts = [part for part in parts if part]
        return " ".join(parts) if parts else '""'

    def regular_run(self, items, start: int, end: int, follows: list[int], path: tuple) -> list[str]:
        whole = self.merged(items[start:end], follows[end - 1], path + ("run", start, end))
        if whole:
            return [whole]
        parts = []
        for i in range(start, end):
            single = None
            if end - start > 1:
                single = self.merged(items[i : i + 1], follows[i], path + ("run", i, i + 1))
            parts.append(single or self.node(items[i], follows[i], path + (i,)))
        return parts

    def merged(self, items: tuple[Node, ...], after: int, key: tuple) -> str | None:
        """One lexeme for a regular piece, if conditions (a) and (b) hold (see gbnf_lexemes)."""
        if key in self.rejected or _is_one_character(items):
            return None
        if items not in self.extensions:
            try:
                self.extensions[items] = extension_bytes(self.rules, items)
            except TooComplex:
                self.extensions[items] = None
        if self.extensions[items] is None:
            return None
        nullable, extension = self.extensions[items]
        if nullable or extension & after:
            return None
        regex = "/" + "".join(_regex(item) for item in _flatten(self.rules, items)) + "/"
        self.lexemes.append((key, regex, self.sets.sequence_first(items)))
        return regex

    # -- one lexeme per character ----------------------------------------------------------------

    def node(self, node: Node, after: int, path: tuple) -> str:
        if isinstance(node, Literal):
            return " ".join(self.character(c) for c in node.text)
        if isinstance(node, (Chars, AnyChar)):
            return self.char_class(node)
        if isinstance(node, RuleRef):
            self.pending.append(node.name)
            return self.names[node.name]
        if isinstance(node, TokenRef):
            return self.token(node)
        if isinstance(node, Group):
            return f"({self.alternatives(node, after, path)})"
        return self.repeat(node, after, path)

    def character(self, char: str) -> str:
        text = json.dumps(char, ensure_ascii=False)
        self.lexemes.append((None, text, lead_bytes(((ord(char), ord(char)),))))
        return text

    def char_class(self, node: Chars | AnyChar) -> str:
        regex = f"/{_class_regex(node)}/"
        self.lexemes.append((None, regex, lead_bytes(node_ranges(node))))
        return regex

    def token(self, node: TokenRef) -> str:
        token_id = self.resolve_token(node.spelling)
        return f"<[{'^' if node.negated else ''}{token_id}]>"

    def resolve_token(self, spelling: str) -> int:
        inner = spelling[1:-1]
        if inner.startswith("[") and inner.endswith("]") and inner[1:-1].isdigit():
            return int(inner[1:-1])
        if self.token_id is None:
            raise GrammarError(f"no vocab to parse token at {spelling!r}")
        return self.token_id(spelling)

    def repeat(self, node: Repeat, after: int, path: tuple) -> str:
        if node.max == 0:
            return ""
        inner = self.sequence((node.node,), repeat_follow(self.sets, node, after), path + ("repeat",))
        if inner == '""':
            return ""
        return f"({inner}){_quantifier(node)}"


def _bits(mask: int):
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def _is_one_character(items: tuple[Node, ...]) -> bool:
    if len(items) != 1:
        return False
    item = items[0]
    return isinstance(item, (Chars, AnyChar)) or (isinstance(item, Literal) and len(item.text) <= 1)


def _quantifier(node: Repeat) -> str:
    if node.max is None:
        return {0: "*", 1: "+"}.get(node.min, f"{{{node.min},}}")
    if (node.min, node.max) == (0, 1):
        return "?"
    return f"{{{node.min},{node.max}}}"


# -- regex text (the regex-syntax dialect llguidance reads between slashes) --------------------


def _code_point(value: int) -> str:
    char = chr(value)
    return char if char.isascii() and char.isalnum() else f"\\x{{{value:X}}}"


def _class_regex(node: Chars | AnyChar) -> str:
    if isinstance(node, AnyChar):
        return "(?s:.)"
    if not node.ranges:
        return "(?s:.)" if node.negated else "[^\\x{0}-\\x{10FFFF}]"
    body = "".join(
        _code_point(low) if low == high else f"{_code_point(low)}-{_code_point(high)}"
        for low, high in node.ranges
    )
    return f"[{'^' if node.negated else ''}{body}]"


def _flatten(rules: Rules, items: tuple[Node, ...]) -> tuple[Node, ...]:
    """Rule references inlined and one-alternative groups dissolved, so that one language
    gets one regex text wherever it comes from (identical lexemes never clash)."""
    flat: list[Node] = []
    for item in items:
        if isinstance(item, RuleRef):
            item = rules[item.name]
        if isinstance(item, Group) and len(item.alternatives) == 1:
            flat += _flatten(rules, item.alternatives[0])
        elif isinstance(item, Group):
            flat.append(Group(tuple(_flatten(rules, alt) for alt in item.alternatives)))
        elif isinstance(item, Repeat):
            inner = _flatten(rules, (item.node,))
            node = inner[0] if len(inner) == 1 else Group((inner,))
            flat.append(Repeat(node, item.min, item.max))
        else:
            flat.append(item)
    return tuple(flat)


def _regex(node: Node) -> str:
    if isinstance(node, (Chars, AnyChar)):
        return _class_regex(node)
    if isinstance(node, Literal):
        return "".join(_code_point(ord(c)) for c in node.text)
    if isinstance(node, Group):
        alternatives = ("".join(_regex(item) for item in items) for items in node.alternatives)
        return "(?:" + "|".join(alternatives) + ")"
    if isinstance(node, Repeat):
        return f"(?:{_regex(node.node)}){_quantifier(node)}" if node.max != 0 else ""
    raise GrammarError("rule and token references cannot be part of a lexeme")
