"""Constrained generation: GBNF grammars, JSON schemas and Lark grammars as token masks.

Built on llguidance (see README.md for why). The engine uses:
    compiler = GrammarCompiler(tokenizer)                 # once per model
    compiled = compiler.compile_json_schema(schema)       # per request (cached by source)
    matcher = compiled.new_matcher()                      # per sequence
    mask = fill_masks([matcher or None per row], n_vocab) # per step, before sampling
    matcher.accept(token_id)                              # after sampling
"""

from .compiler import GrammarCompiler
from .errors import GrammarError
from .matcher import CompiledGrammar, GrammarMatcher, fill_masks

__all__ = ["CompiledGrammar", "GrammarCompiler", "GrammarError", "GrammarMatcher", "fill_masks"]
