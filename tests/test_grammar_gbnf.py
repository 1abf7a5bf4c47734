"""GBNF: llama.cpp's parser rules, and a differential check of the Lark translation.

The translation merges regular pieces into lexemes (gbnf_lexemes.py); llguidance lexes them
greedily, so a wrong merge silently changes the language. Random grammars are compared with
a direct recognizer of the GBNF syntax tree. No model: a byte-level tokenizer.
"""

from __future__ import annotations

import functools
import random
import re

import numpy as np
import pytest

from lamplight.grammar import GrammarCompiler, GrammarError
from lamplight.grammar.gbnf import AnyChar, Chars, Group, Literal, Repeat, RuleRef, parse_gbnf
from lamplight.grammar.gbnf_lark import gbnf_to_lark


class ByteTokenizer:
    """One token per byte, plus an end-of-sequence control token: acceptance is per byte."""

    vocab_size = 257
    eos_id = 256
    bos_id = None
    eog_ids = frozenset({256})

    def token_bytes(self, token_id: int) -> bytes:
        return b"</s>" if token_id == 256 else bytes([token_id])

    def is_control(self, token_id: int) -> bool:
        return token_id == 256

    def encode(self, text: str, add_special: bool = False, parse_special: bool = False) -> list[int]:
        return list(text.encode())


@pytest.fixture(scope="module")
def compiler() -> GrammarCompiler:
    return GrammarCompiler(ByteTokenizer())


def accepts(compiler: GrammarCompiler, grammar: str, text: str) -> bool:
    matcher = compiler.compile_gbnf(grammar).new_matcher()
    return all(matcher.accept(byte) for byte in text.encode()) and matcher.is_accepting()


# -- parser -------------------------------------------------------------------------------------


def test_parses_llama_cpp_syntax():
    rules = parse_gbnf(
        'root ::= "a\\x41\\u00e9\\U0001F600\\t\\"" [^a-c\\]] . r-2{2,} r-2{,3} r-2{1} ( "x" |\n "y" )* # c\n'
        "r-2 ::= [\\u0391-\\u03A9]?\n"
    )
    items = rules["root"].alternatives[0]
    assert items[0] == Literal('aAé\U0001f600\t"')
    assert items[1] == Chars(((ord("a"), ord("c")), (ord("]"), ord("]"))), negated=True)
    assert items[2] == AnyChar()
    assert items[3] == Repeat(RuleRef("r-2"), 2, None)
    assert items[4] == Repeat(RuleRef("r-2"), 0, 3)
    assert items[5] == Repeat(RuleRef("r-2"), 1, 1)
    assert items[6] == Repeat(Group(((Literal("x"),), (Literal("y"),))), 0, None)
    assert rules["r-2"].alternatives[0] == (Repeat(Chars(((0x391, 0x3A9),), False), 0, 1),)


def test_a_later_definition_replaces_an_earlier_one():
    assert parse_gbnf('root ::= "a"\nroot ::= "b"')["root"].alternatives == ((Literal("b"),),)


@pytest.mark.parametrize(
    "grammar, message",
    [
        ('root ::= "abc', "unexpected end of input"),
        ("root ::= [a-", "unexpected end of input"),
        ('root ::= ("a"', "expecting ')'"),
        ("root ::= missing", "Undefined rule identifier 'missing'"),
        ('rule ::= "a"', "does not contain a 'root' rule"),
        ('root = "a"', "expecting ::="),
        ('root ::= "\\q"', "unknown escape"),
        ('root ::= "\\x4"', "expecting 2 hex chars"),
        ("root ::= *", "expecting preceding item"),
        ('root ::= "a"{2', "expecting '}'"),
        ('root ::= "a"{3,1}', "below its minimum"),
        ('root ::= "a"{2001}', "exceeds sane defaults"),
        ('root ::= "a" ) "b"', "expecting newline or end"),
        ('root ::= "a"\n  "b"', "expecting name"),  # a rule ends at a newline outside parentheses
    ],
)
def test_syntax_errors_name_the_problem(grammar, message):
    with pytest.raises(GrammarError, match=re.escape(message)):
        parse_gbnf(grammar)


def test_lark_translation_is_valid_for_every_construct():
    import llguidance

    lark = gbnf_to_lark('root ::= ( [a-z]+ | "\\u00e9" . ) [^\\n]{0,3} (x | "")\nx ::= "\\x00" [\\U0001F600-\\U0001F64F]')
    assert llguidance.LLMatcher.validate_grammar(llguidance.LLMatcher.grammar_from_lark(lark)) == ""


# -- llama.cpp's character-level language, including where greedy lexing would differ ------------


@pytest.mark.parametrize(
    "grammar, good, bad",
    [
        ('root ::= word "s"\nword ::= [a-z]{1,5}', ["cats", "ss", "catsss"], ["cat", "abcdefs"]),
        ('root ::= ("a" | "ab") "b"', ["ab", "abb"], ["a", "abbb"]),
        ('root ::= [a-z] "x" | "a" "y"', ["ay", "bx", "ax"], ["by", "a"]),
        ('root ::= num "0"\nnum ::= [0-9]+', ["100", "00"], ["0", "1"]),
        ('root ::= [a-z]+ ";" | "a" "b" "!"', ["ab!", "ab;", "a;"], ["ab", "a!"]),
        ('root ::= [é]+ [è]', ["éè", "ééè"], ["é", "è"]),
        ('root ::= "x" ws "y"\nws ::= | " " | "\\n" [ \\t]{0,2}', ["xy", "x y", "x\n\t y"], ["x  y", "x\n   y"]),
        ('root ::= .{1,3} "\\n"', ["\n\n", "é\n", "abc\n"], ["\n", "abcd\n"]),
        ('root ::= [^"\\\\]* "\\""', ['abc"', '"'], ['\\"', 'a"b"']),
    ],
)
def test_language_matches_llama_cpp(compiler, grammar, good, bad):
    for text in good:
        assert accepts(compiler, grammar, text), text
    for text in bad:
        assert not accepts(compiler, grammar, text), text


def test_token_reference_allows_exactly_that_token():
    from lamplight.grammar.matcher import fill_masks

    compiler = GrammarCompiler(ByteTokenizer())
    matcher = compiler.compile_gbnf('root ::= "a" <[98]> "c"').new_matcher()
    assert matcher.accept(ord("a"))
    assert np.flatnonzero(fill_masks([matcher], 257)[0]).tolist() == [98]


# -- differential check against a recognizer of the syntax tree ---------------------------------

ALPHABET = ["a", "b", "c", " ", "é", "è"]


def recognizes(rules, text: str) -> bool:
    @functools.lru_cache(maxsize=None)
    def rule_ends(name: str, start: int) -> frozenset[int]:
        return frozenset(node_ends(rules[name], start))

    def node_ends(node, start: int) -> set[int]:
        if isinstance(node, Literal):
            return {start + len(node.text)} if text.startswith(node.text, start) else set()
        if isinstance(node, (Chars, AnyChar)):
            if start >= len(text):
                return set()
            if isinstance(node, AnyChar):
                return {start + 1}
            inside = any(low <= ord(text[start]) <= high for low, high in node.ranges)
            return {start + 1} if inside != node.negated else set()
        if isinstance(node, RuleRef):
            return set(rule_ends(node.name, start))
        if isinstance(node, Group):
            return set().union(*(sequence_ends(seq, start) for seq in node.alternatives))
        return repeat_ends(node, start)

    def sequence_ends(items, start: int) -> set[int]:
        positions = {start}
        for item in items:
            positions = set().union(*(node_ends(item, p) for p in positions)) if positions else set()
        return positions

    def repeat_ends(node: Repeat, start: int) -> set[int]:
        ends = {start} if node.min == 0 else set()
        current, count = {start}, 0
        limit = node.max if node.max is not None else len(text) - start + 1
        while current and count < limit:
            current = set().union(*(node_ends(node.node, p) for p in current))
            count += 1
            if count >= node.min:
                ends |= current
        return ends

    return len(text) in rule_ends("root", 0)


def random_grammar(rng: random.Random, n_rules: int) -> str:
    def chars() -> str:
        picked = rng.sample(ALPHABET, rng.randint(1, 3))
        return "[" + ("^" if rng.random() < 0.2 else "") + "".join(picked) + "]"

    def item(depth: int, index: int, recursion_ok: bool) -> str:
        roll = rng.random()
        if roll < 0.3:
            return '"' + "".join(rng.choices(ALPHABET, k=rng.randint(1, 2))) + '"'
        if roll < 0.5:
            return chars()
        if roll < 0.55:
            return "."
        if roll < 0.7 and index + 1 < n_rules:
            return f"r{rng.randint(index + 1, n_rules - 1)}"
        if roll < 0.75 and recursion_ok:
            return f"r{rng.randint(0, index)}"  # recursion, but only after consuming input
        if depth < 2 and roll < 0.85:
            return "(" + alternatives(depth + 1, index, recursion_ok) + ")"
        inner = chars() if rng.random() < 0.5 else '"' + rng.choice(ALPHABET) + '"'
        return inner + rng.choice(["*", "+", "?", "{0,2}", "{1,3}", "{2}", "{1,}"])

    def sequence(depth: int, index: int, recursion_ok: bool) -> str:
        items = []
        for _ in range(rng.randint(0 if rng.random() < 0.15 else 1, 3)):
            after_literal = bool(items) and items[-1][0] == '"' and items[-1][-1] == '"'
            items.append(item(depth, index, recursion_ok and after_literal))
        return " ".join(items)

    def alternatives(depth: int, index: int, recursion_ok: bool) -> str:
        sequences = [sequence(depth, index, recursion_ok) for _ in range(rng.randint(1, 3))]
        # empty alternatives go first ("a |" or "::=" at a line end would continue on the next)
        sequences.sort(key=bool)
        return " | ".join(sequences) if sequences[-1] else '""'

    rules = [f"r{i} ::= {alternatives(0, i, recursion_ok=rng.random() < 0.3)}" for i in range(n_rules)]
    return "root ::= r0\n" + "\n".join(rules) + "\n"


def sample_strings(rng: random.Random, rules, count: int) -> list[str]:
    """Strings the grammar accepts (by bounded random expansion) plus random near misses."""
    found: list[str] = []

    def expand(node, depth: int) -> str | None:
        if depth > 12:
            return None
        if isinstance(node, Literal):
            return node.text
        if isinstance(node, AnyChar):
            return rng.choice(ALPHABET)
        if isinstance(node, Chars):
            options = [c for c in ALPHABET if any(lo <= ord(c) <= hi for lo, hi in node.ranges) != node.negated]
            return rng.choice(options) if options else None
        if isinstance(node, RuleRef):
            return expand(rules[node.name], depth + 1)
        if isinstance(node, Group):
            parts = [expand(item, depth + 1) for item in rng.choice(node.alternatives)]
            return None if None in parts else "".join(parts)
        times = rng.randint(node.min, node.max if node.max is not None else node.min + 2)
        parts = [expand(node.node, depth + 1) for _ in range(times)]
        return None if None in parts else "".join(parts)

    for _ in range(count * 3):
        text = expand(rules["root"], 0)
        if text is not None and len(text) <= 12:
            found.append(text)
        if len(found) >= count:
            break
    mutated = [t[: rng.randint(0, len(t))] + rng.choice(ALPHABET) + t[rng.randint(0, len(t)) :] for t in found]
    random_texts = ["".join(rng.choices(ALPHABET, k=rng.randint(0, 5))) for _ in range(count)]
    return found + mutated + random_texts


def test_translation_accepts_exactly_the_gbnf_language(compiler):
    rng = random.Random(1234)
    checked = 0
    for case in range(120):
        grammar = random_grammar(rng, rng.randint(1, 4))
        rules = parse_gbnf(grammar)
        try:
            compiled = compiler.compile_gbnf(grammar)
        except GrammarError as error:
            pytest.fail(f"{grammar}\n{error}")
        for text in sample_strings(rng, rules, 6):
            matcher = compiled.new_matcher()
            ours = all(matcher.accept(b) for b in text.encode()) and matcher.is_accepting()
            assert ours == recognizes(rules, text), f"case {case}: {text!r}\n{grammar}\n{gbnf_to_lark(grammar)}"
            checked += 1
    assert checked > 1000
