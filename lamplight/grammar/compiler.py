"""Grammar sources -> validated, cached grammars for one tokenizer."""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from typing import Any, Callable

import llguidance

from .errors import GrammarError
from .gbnf_lark import gbnf_to_lark
from .json_schema import json_schema_grammar
from .matcher import CompiledGrammar
from .vocabulary import build_vocabulary, token_resolver

LLGUIDANCE_PREFIX = "%llguidance"  # llama.cpp's marker for a Lark grammar in `grammar`


class GrammarCompiler:
    """One per tokenizer. Thread-safe; compiled grammars are kept in an LRU cache by source."""

    def __init__(self, tokenizer, cache_size: int = 128):
        started = time.perf_counter()
        self._ll_tokenizer, self.vocabulary = build_vocabulary(tokenizer)
        self.setup_seconds = time.perf_counter() - started  # Gemma's 262k tokens: ~1.5 s
        self._token_id = token_resolver(tokenizer)
        self._limits = llguidance.LLParserLimits(verbose_errors=False)
        self._cache: OrderedDict[tuple[str, str], CompiledGrammar] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()

    def compile_grammar(self, grammar: str) -> CompiledGrammar:
        """The `grammar` request field: GBNF, or Lark after llama.cpp's `%llguidance` marker."""
        if grammar.lstrip().startswith(LLGUIDANCE_PREFIX):
            return self.compile_lark(grammar)
        return self.compile_gbnf(grammar)

    def compile_gbnf(self, grammar: str) -> CompiledGrammar:
        """llama.cpp's GBNF, starting at the rule `root`."""
        return self._cached("gbnf", grammar, lambda: gbnf_to_lark(grammar, self._token_id))

    def compile_lark(self, grammar: str) -> CompiledGrammar:
        """llguidance's Lark dialect (what llama.cpp accepts after `%llguidance`)."""
        return self._cached("lark", grammar, lambda: llguidance.LLMatcher.grammar_from_lark(grammar))

    def compile_json_schema(self, schema: dict[str, Any] | bool) -> CompiledGrammar:
        """llama.cpp's `json_schema` semantics (see json_schema.py)."""
        try:
            key = json.dumps(schema)  # not sorted: property order is output order
        except (TypeError, ValueError) as error:
            raise GrammarError(f"the schema is not JSON: {error}") from None
        return self._cached("json_schema", key, lambda: json_schema_grammar(schema))

    def compile_any_json_object(self) -> CompiledGrammar:
        """`response_format: {"type": "json_object"}`."""
        return self.compile_json_schema({"type": "object"})

    def compile_after(self, lead: str, answer: CompiledGrammar) -> CompiledGrammar:
        """`answer` preceded by what the Lark grammar `lead` allows: `lead` names the answer
        `@answer` (an llguidance sub-grammar, so the answer keeps its own lexer and rules)."""
        key = lead + "\0" + answer.kind + "\0" + answer.source
        return self._cached("after", key, lambda: json.dumps({"grammars": [{"lark_grammar": lead},
                                                                            *_named_answer(answer.source)]}))

    def _cached(self, kind: str, source: str, build: Callable[[], str]) -> CompiledGrammar:
        key = (kind, source)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        grammar = build()
        compiled = CompiledGrammar(self._validated_matcher(grammar), self.vocabulary, kind, grammar)
        with self._lock:
            self._cache[key] = compiled
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return compiled

    def _validated_matcher(self, grammar: str) -> llguidance.LLMatcher:
        matcher = llguidance.LLMatcher(self._ll_tokenizer, grammar, log_level=0, limits=self._limits)
        if matcher.is_error():
            raise GrammarError(matcher.get_error().strip())
        return matcher


def _named_answer(source: str) -> list[dict]:
    """The grammars of an llguidance source, the first (where it starts) named `answer`."""
    if source.lstrip().startswith("{"):  # a top-level JSON grammar (JSON schemas)
        grammars = [dict(grammar) for grammar in json.loads(source)["grammars"]]
    else:  # Lark text
        grammars = [{"lark_grammar": source}]
    grammars[0]["name"] = "answer"
    return grammars
