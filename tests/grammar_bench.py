"""Mask time per token at steady state: `python tests/grammar_bench.py [--steps N]`.

For each vocabulary and grammar: B sequences walk the grammar (random allowed tokens, see
lamplight/grammar/walk.py); each step times one `fill_masks` call for the whole batch. A
finished sequence restarts, so every step masks B live rows. The first step of each grammar
(cold caches) is reported apart.

It lives beside the test corpus it draws its grammars from (grammar_corpus.py): a developer's
tool, not part of the package.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from grammar_corpus import GBNF_CASES, SCHEMA_CASES

from lamplight.grammar.compiler import GrammarCompiler
from lamplight.grammar.matcher import fill_masks
from lamplight.grammar.walk import closing_tokens, pick_token

MODELS = {"smollm2": "smollm2-135m-instruct", "gemma3": "gemma-3-270m"}
SCHEMA = "array-of-objects"
GBNF = "json"


def load_tokenizer(model: str):
    from lamplight.gguf.file import GGUFFile
    from lamplight.sources import resolve_model
    from lamplight.tokenizer import Tokenizer

    return Tokenizer.from_gguf(GGUFFile(resolve_model(model)))


def bench_batch(compiled, batch: int, steps: int, closing, seed: int = 0) -> tuple[float, list[float]]:
    rng = random.Random(seed)
    rows = [compiled.new_matcher() for _ in range(batch)]
    n_vocab = compiled.vocabulary.size
    timings = []
    first = 0.0
    for step in range(steps + 1):
        started = time.perf_counter()
        masks = fill_masks(rows, n_vocab)
        elapsed = time.perf_counter() - started
        if step == 0:
            first = elapsed
        else:
            timings.append(elapsed)
        for index, matcher in enumerate(rows):
            token_id = pick_token(masks[index], matcher.vocabulary, rng, closing, end_bias=0.5)
            matcher.accept(token_id)
            if token_id in matcher.vocabulary.eog_ids:
                rows[index] = compiled.new_matcher()
    return first, timings


def report(label: str, batch: int, first: float, timings: list[float]) -> None:
    mean, p50 = statistics.mean(timings), statistics.median(timings)
    p95 = sorted(timings)[int(0.95 * (len(timings) - 1))]
    print(
        f"  {label:<28} batch {batch:>2}: per step mean {mean * 1e3:7.3f} ms  p50 {p50 * 1e3:7.3f}"
        f"  p95 {p95 * 1e3:7.3f}  | per token {mean / batch * 1e3:7.3f} ms  | first step {first * 1e3:.2f} ms"
    )


def corpus_grammars() -> tuple[dict, str]:
    """The JSON schema and the GBNF grammar this bench times, from the test corpus."""
    schema = next(case.schema for case in SCHEMA_CASES if case.name == SCHEMA)
    gbnf = next(case.grammar for case in GBNF_CASES if case.name == GBNF)
    return schema, gbnf


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="smollm2,gemma3")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batches", default="1,16")
    args = parser.parse_args()
    schema, gbnf = corpus_grammars()
    for name in args.models.split(","):
        tokenizer = load_tokenizer(MODELS[name])
        compiler = GrammarCompiler(tokenizer)
        closing = closing_tokens(tokenizer)
        print(f"{name}: {tokenizer.vocab_size} tokens, llguidance tokenizer built in {compiler.setup_seconds:.2f} s")
        for label, compile_grammar in (
            (f"json_schema:{SCHEMA}", lambda: compiler.compile_json_schema(schema)),
            (f"gbnf:{GBNF}", lambda: compiler.compile_gbnf(gbnf)),
        ):
            started = time.perf_counter()
            compiled = compile_grammar()
            print(f"  {label}: compiled in {(time.perf_counter() - started) * 1e3:.1f} ms")
            for batch in map(int, args.batches.split(",")):
                first, timings = bench_batch(compiled, batch, args.steps, closing)
                report(label, batch, first, timings)


if __name__ == "__main__":
    main()
