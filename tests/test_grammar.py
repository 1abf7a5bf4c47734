"""Constrained generation on a real vocabulary (SmolLM2's 49152 tokens), without forward passes.

Matchers are driven by seeded random walks among the allowed tokens (lamplight.grammar.walk),
and by the tokens of known-valid texts from the corpus.
"""

from __future__ import annotations

import json
import random
import re

import jsonschema
import numpy as np
import pytest
from grammar_corpus import (
    GBNF_CASES,
    INVALID_GBNF,
    INVALID_SCHEMAS,
    SCHEMA_CASES,
    UNENFORCEABLE_SCHEMAS,
)

from lamplight.grammar import GrammarCompiler, GrammarError, fill_masks
from lamplight.grammar.walk import closing_tokens, random_walk

pytestmark = pytest.mark.real_model

WALKS_PER_GRAMMAR = 3
MAX_OUTPUT_TOKENS = 200  # what the end-to-end tests give a generation


@pytest.fixture(scope="module")
def tokenizer(smollm2_path):
    from lamplight.gguf.file import GGUFFile
    from lamplight.tokenizer import Tokenizer

    return Tokenizer.from_gguf(GGUFFile(smollm2_path))


@pytest.fixture(scope="module")
def compiler(tokenizer) -> GrammarCompiler:
    return GrammarCompiler(tokenizer)


@pytest.fixture(scope="module")
def closing(tokenizer) -> frozenset[int]:
    return closing_tokens(tokenizer)


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special=False, parse_special=False)


def accepts_text(compiled, tokenizer, text: str) -> bool:
    matcher = compiled.new_matcher()
    return all(matcher.accept(t) for t in encode(tokenizer, text)) and matcher.is_accepting()


def walks(compiled, tokenizer, closing, seed: int):
    rng = random.Random(seed)
    for _ in range(WALKS_PER_GRAMMAR):
        walk = random_walk(compiled, rng, closing)
        assert walk.complete, f"no end after {len(walk.token_ids)} tokens: {tokenizer.decode(walk.token_ids)!r}"
        assert len(walk.token_ids) <= MAX_OUTPUT_TOKENS
        yield tokenizer.decode(walk.token_ids)


# -- GBNF corpus --------------------------------------------------------------------------------


@pytest.mark.parametrize("case", GBNF_CASES, ids=lambda c: c.name)
def test_gbnf_corpus_examples_are_accepted(compiler, tokenizer, case):
    compiled = compiler.compile_gbnf(case.grammar)
    for text in case.examples:
        assert accepts_text(compiled, tokenizer, text), text
        assert case.check is None or re.fullmatch(case.check, text)


@pytest.mark.parametrize("case", GBNF_CASES, ids=lambda c: c.name)
def test_gbnf_random_walks_give_texts_the_grammar_accepts(compiler, tokenizer, closing, case):
    compiled = compiler.compile_gbnf(case.grammar)
    for text in walks(compiled, tokenizer, closing, seed=len(case.name)):
        # re-tokenized from scratch: acceptance is about the text, not the walk's tokens
        assert accepts_text(compiled, tokenizer, text), text
        assert case.check is None or re.fullmatch(case.check, text), text


def test_json_gbnf_walks_parse_as_json(compiler, tokenizer, closing):
    grammar = next(case.grammar for case in GBNF_CASES if case.name == "json")
    for text in walks(compiler.compile_gbnf(grammar), tokenizer, closing, seed=7):
        assert isinstance(json.loads(text), dict)


# -- JSON schema corpus -------------------------------------------------------------------------


@pytest.mark.parametrize("case", SCHEMA_CASES, ids=lambda c: c.name)
def test_schema_random_walks_validate(compiler, tokenizer, closing, case):
    compiled = compiler.compile_json_schema(case.schema)
    for text in walks(compiled, tokenizer, closing, seed=len(case.name)):
        jsonschema.validate(json.loads(text), case.schema)


@pytest.mark.parametrize("case", SCHEMA_CASES, ids=lambda c: c.name)
def test_schema_examples_are_accepted(compiler, tokenizer, case):
    compiled = compiler.compile_json_schema(case.schema)
    for document in case.examples:
        jsonschema.validate(document, case.schema)
        for text in (json.dumps(document), json.dumps(document, indent=2)):
            assert accepts_text(compiled, tokenizer, text), text


def test_properties_imply_no_additional_properties_like_llama_cpp(compiler, tokenizer):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert not accepts_text(compiler.compile_json_schema(schema), tokenizer, '{"a": 1, "b": 2}')
    opened = dict(schema, additionalProperties=True)
    assert accepts_text(compiler.compile_json_schema(opened), tokenizer, '{"a": 1, "b": 2}')
    nested = {"type": "array", "items": {"anyOf": [schema]}}
    assert not accepts_text(compiler.compile_json_schema(nested), tokenizer, '[{"a": 1, "b": 2}]')


def test_property_order_is_the_schemas(compiler, tokenizer):
    a_first = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}
    b_first = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "integer"}}}
    assert accepts_text(compiler.compile_json_schema(a_first), tokenizer, '{"a": 1, "b": 2}')
    assert accepts_text(compiler.compile_json_schema(b_first), tokenizer, '{"b": 2, "a": 1}')


def test_whitespace_is_llama_cpps_space_rule(compiler, tokenizer):
    compiled = compiler.compile_json_schema({"type": "array", "items": {"type": "integer"}})
    assert accepts_text(compiled, tokenizer, "[1, 2,\n\t\t3]")
    assert not accepts_text(compiled, tokenizer, "[1,  2]")
    assert not accepts_text(compiled, tokenizer, "[1,\n\n2]")


def test_empty_schema_and_json_object_mean_any_object(compiler, tokenizer, closing):
    for compiled in (compiler.compile_json_schema({}), compiler.compile_any_json_object()):
        assert accepts_text(compiled, tokenizer, '{"x": [1, {"y": null}]}')
        assert not accepts_text(compiled, tokenizer, "[1]")
        for text in walks(compiled, tokenizer, closing, seed=3):
            assert isinstance(json.loads(text), dict)


# -- errors -------------------------------------------------------------------------------------


@pytest.mark.parametrize("grammar", INVALID_GBNF)
def test_invalid_gbnf_raises_with_the_parser_message(compiler, grammar):
    with pytest.raises(GrammarError, match="unexpected end of input|Undefined rule|expecting|root"):
        compiler.compile_gbnf(grammar)


@pytest.mark.parametrize("schema", INVALID_SCHEMAS, ids=lambda s: json.dumps(s)[:40])
def test_invalid_schema_raises_with_the_parser_message(compiler, schema):
    with pytest.raises(GrammarError, match="Invalid type|does not exist|regex parse error"):
        compiler.compile_json_schema(schema)


@pytest.mark.parametrize("keyword, schema", UNENFORCEABLE_SCHEMAS, ids=lambda x: str(x)[:20])
def test_unenforceable_keyword_is_refused_by_name(compiler, keyword, schema):
    with pytest.raises(GrammarError, match=keyword):
        compiler.compile_json_schema(schema)


def test_invalid_lark_raises(compiler):
    with pytest.raises(GrammarError):
        compiler.compile_grammar("%llguidance {}\nstart: missing_rule")


# -- end of generation, masks, cache ------------------------------------------------------------


def allowed_ids(matcher, n_vocab: int) -> set[int]:
    return set(np.flatnonzero(fill_masks([matcher], n_vocab)[0]).tolist())


def test_end_of_generation_is_allowed_exactly_where_the_grammar_is_complete(compiler, tokenizer):
    matcher = compiler.compile_gbnf('root ::= "yes" | "yes sir"').new_matcher()
    eog = set(tokenizer.eog_ids)
    assert not allowed_ids(matcher, tokenizer.vocab_size) & eog
    assert not matcher.accept(tokenizer.eos_id)  # refused, and the matcher is unharmed
    for token_id in encode(tokenizer, "yes"):
        assert not matcher.is_accepting()
        assert matcher.accept(token_id)
    assert matcher.is_accepting() and not matcher.is_stopped()
    allowed = allowed_ids(matcher, tokenizer.vocab_size)
    assert eog <= allowed and len(allowed) > len(eog)
    for token_id in encode(tokenizer, " sir"):
        assert matcher.accept(token_id)
    assert matcher.is_stopped()
    assert allowed_ids(matcher, tokenizer.vocab_size) == eog
    assert matcher.accept(tokenizer.eos_id)


def test_disallowed_token_is_refused_and_the_row_can_only_end(compiler, tokenizer):
    matcher = compiler.compile_gbnf('root ::= "a"').new_matcher()
    assert not matcher.accept(encode(tokenizer, "b")[0])
    assert matcher.error
    assert allowed_ids(matcher, tokenizer.vocab_size) == set(tokenizer.eog_ids)


def test_control_tokens_are_never_text(compiler, tokenizer):
    matcher = compiler.compile_gbnf("root ::= .{1,5}").new_matcher()
    allowed = allowed_ids(matcher, tokenizer.vocab_size)
    controls = {i for i in range(tokenizer.vocab_size) if tokenizer.is_control(i)}
    assert not allowed & controls


def test_fill_masks_pads_and_leaves_unconstrained_rows_all_true(compiler, tokenizer):
    assert fill_masks([None, None], tokenizer.vocab_size + 64) is None
    compiled = compiler.compile_gbnf('root ::= "{" [a-z]* "}"')
    rows = [None, compiled.new_matcher(), None, compiled.new_matcher()]
    n_vocab = tokenizer.vocab_size + 64  # a model whose embedding table is padded
    masks = fill_masks(rows, n_vocab)
    assert isinstance(masks, np.ndarray) and masks.shape == (4, n_vocab) and masks.dtype == np.bool_
    assert masks[0].all() and masks[2].all()
    assert not masks[1, tokenizer.vocab_size :].any()
    assert np.array_equal(masks[1], masks[3])
    assert np.flatnonzero(masks[1]).tolist() == [t for t in range(tokenizer.vocab_size)
                                                     if tokenizer.token_bytes(t).startswith(b"{")
                                                     and compiled.new_matcher().accept(t)]


def test_batched_masks_equal_single_row_masks(compiler, tokenizer, closing):
    schema = next(case.schema for case in SCHEMA_CASES if case.name == "array-of-objects")
    compiled = compiler.compile_json_schema(schema)
    rng = random.Random(5)
    rows = [compiled.new_matcher() for _ in range(5)]
    for step in range(12):
        batched = fill_masks(rows, tokenizer.vocab_size)
        for index, matcher in enumerate(rows):
            single = np.zeros(tokenizer.vocab_size, dtype=bool)
            matcher.fill_mask(single)
            assert np.array_equal(batched[index], single)
            text_ids = [t for t in np.flatnonzero(single).tolist() if t not in tokenizer.eog_ids]
            if text_ids:
                assert matcher.accept(rng.choice(text_ids))


def test_compiled_grammars_are_cached_by_source(tokenizer):
    compiler = GrammarCompiler(tokenizer, cache_size=2)
    first = compiler.compile_json_schema({"type": "integer"})
    assert compiler.compile_json_schema({"type": "integer"}) is first
    compiler.compile_gbnf('root ::= "a"')
    compiler.compile_gbnf('root ::= "b"')
    assert compiler.compile_json_schema({"type": "integer"}) is not first  # evicted (LRU)


def test_llguidance_prefix_selects_lark(compiler, tokenizer):
    compiled = compiler.compile_grammar('%llguidance {}\nstart: "yes" | "no"')
    assert compiled.kind == "lark"
    assert accepts_text(compiled, tokenizer, "no")
    assert compiler.compile_grammar('root ::= "yes"').kind == "gbnf"


def test_gbnf_token_reference_by_text(compiler, tokenizer):
    matcher = compiler.compile_gbnf('root ::= "a" <|im_start|>').new_matcher()
    assert matcher.accept(encode(tokenizer, "a")[0])
    assert allowed_ids(matcher, tokenizer.vocab_size) == {1}
    with pytest.raises(GrammarError, match="invalid token"):
        compiler.compile_gbnf("root ::= <two tokens>")


def test_grammar_bench_runs_on_its_corpus_grammars(compiler, closing):
    """tests/grammar_bench.py (a developer's tool, not collected) still finds its grammars in the
    corpus and times one masked step per step asked for."""
    import grammar_bench

    schema, gbnf = grammar_bench.corpus_grammars()
    for compiled in (compiler.compile_json_schema(schema), compiler.compile_gbnf(gbnf)):
        first, timings = grammar_bench.bench_batch(compiled, batch=2, steps=4, closing=closing)
        assert first > 0 and len(timings) == 4 and all(t > 0 for t in timings)


def test_gemma_vocabulary(gemma3_path):
    """262144 tokens: a schema walk validates and the mask covers the whole vocabulary."""
    from lamplight.gguf.file import GGUFFile
    from lamplight.tokenizer import Tokenizer

    gemma = Tokenizer.from_gguf(GGUFFile(gemma3_path))
    compiler = GrammarCompiler(gemma)
    case = next(case for case in SCHEMA_CASES if case.name == "array-of-objects")
    compiled = compiler.compile_json_schema(case.schema)
    assert fill_masks([compiled.new_matcher()], gemma.vocab_size).shape == (1, 262144)
    for text in walks(compiled, gemma, closing_tokens(gemma), seed=11):
        jsonschema.validate(json.loads(text), case.schema)


def test_recursive_ref_and_llama_cpp_formats(compiler, tokenizer):
    recursive = {
        "$defs": {"node": {"type": "object", "properties": {
            "label": {"type": "string", "maxLength": 6},
            "children": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
            "required": ["label"]}},
        "$ref": "#/$defs/node",
    }
    compiled = compiler.compile_json_schema(recursive)
    deep = {"label": "a", "children": [{"label": "b", "children": [{"label": "c", "children": []}]}]}
    assert accepts_text(compiled, tokenizer, json.dumps(deep))
    # Formats follow llama.cpp's bounded patterns: three fraction digits at most, no second 60.
    times = compiler.compile_json_schema({"type": "string", "format": "time"})
    assert accepts_text(times, tokenizer, '"08:15:00.123Z"')
    assert not accepts_text(times, tokenizer, '"08:15:00.1234Z"')
    assert not accepts_text(times, tokenizer, '"08:15:60Z"')
