"""Micro-benchmark of the sampler chain: `python -m lamplight.sampling.bench`.

Times `sample_batch` on random [B, 49152] float32 numpy logits with every sampler on (penalties,
DRY, top_n_sigma, top_k, typical, top_p, min_p, XTC, dynamic temperature, logit_bias, n_probs),
then the llama.cpp defaults, and prints milliseconds per step and a per-step breakdown.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import numpy as np

from .chain import run_chain, sample_batch
from .params import SamplingParams
from .sequence import SequenceSampler

N_VOCAB = 49152
HISTORY_LENGTH = 1000


class SyntheticTokenizer:
    """A 49152-token vocabulary of words, with a few punctuation tokens for DRY's breakers."""

    def __init__(self, n_vocab: int = N_VOCAB) -> None:
        self.n_vocab = n_vocab
        punctuation = {10: "\n", 11: ":", 12: '"', 13: "*", 14: ":\n", 15: ' "'}
        self._texts = [punctuation.get(i, f" w{i}") for i in range(n_vocab)]
        self._ids = {text: i for i, text in enumerate(self._texts)}

    def token_bytes(self, token_id: int) -> bytes:
        return self._texts[token_id].encode()

    def encode(self, text: str, add_special: bool = False, parse_special: bool = False) -> list[int]:
        return [self._ids[text]] if text in self._ids else [self._ids.get(char, 0) for char in text]


ALL_ON = SamplingParams(
    temperature=0.8,
    dynatemp_range=0.3,
    top_k=40,
    top_p=0.95,
    min_p=0.05,
    typical_p=0.95,
    top_n_sigma=2.0,
    xtc_probability=0.5,
    xtc_threshold=0.1,
    repeat_last_n=64,
    repeat_penalty=1.1,
    presence_penalty=0.3,
    frequency_penalty=0.2,
    dry_multiplier=0.8,
    dry_penalty_last_n=-1,
    logit_bias=[(100, 2.0), (200, float("-inf"))],
    n_probs=5,
)
DEFAULTS = SamplingParams()


def make_samplers(params: SamplingParams, batch: int, tokenizer: SyntheticTokenizer) -> list[SequenceSampler]:
    generator = np.random.default_rng(0)
    samplers = []
    for row in range(batch):
        sampler = SequenceSampler(
            SamplingParams(**{**params.__dict__, "seed": row}), tokenizer=tokenizer, n_ctx=4096
        )
        # A repetitive history, so that penalties and DRY have work to do.
        phrase = generator.integers(0, N_VOCAB, 50).tolist()
        sampler.accept_many((phrase * (HISTORY_LENGTH // 50 + 1))[:HISTORY_LENGTH])
        samplers.append(sampler)
    return samplers


def random_logits(batch: int, seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((batch, N_VOCAB)) * 3).astype(np.float32)


def time_steps(samplers: list[SequenceSampler], logits: np.ndarray, iterations: int) -> float:
    """Milliseconds per sample_batch call, accepting the drawn tokens as an engine would."""
    for _ in range(2):  # warm-up
        sample_batch(logits, samplers)
    start = time.perf_counter()
    for _ in range(iterations):
        result = sample_batch(logits, samplers)
        for sampler, token in zip(samplers, result.token_ids):
            sampler.accept(token)
    return (time.perf_counter() - start) * 1000 / iterations


def step_breakdown(samplers: list[SequenceSampler], logits: np.ndarray, iterations: int) -> dict[str, float]:
    """Milliseconds per call spent in each chain step (the draw and probs are the remainder)."""
    totals: dict[str, float] = defaultdict(float)
    for _ in range(iterations):
        last = time.perf_counter()

        def observe(name: str, rows: list[int], work: np.ndarray) -> None:
            nonlocal last
            now = time.perf_counter()
            totals[name] += (now - last) * 1000 / iterations
            last = now

        run_chain(logits, samplers, on_step=observe)
    return dict(totals)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--iterations", type=int, default=5)
    args = parser.parse_args()
    tokenizer = SyntheticTokenizer()
    started = time.perf_counter()
    SequenceSampler(ALL_ON, tokenizer=tokenizer, n_ctx=4096)  # build DRY's breaker table once
    print(f"DRY breaker table for {N_VOCAB} tokens: {(time.perf_counter() - started) * 1000:.0f} ms (once per tokenizer)")
    print(f"numpy {np.__version__}, vocab {N_VOCAB}, {args.iterations} iterations")
    for label, params in (("all samplers on", ALL_ON), ("llama.cpp defaults", DEFAULTS)):
        for batch in (int(b) for b in args.batches.split(",")):
            logits = random_logits(batch, seed=batch)
            samplers = make_samplers(params, batch, tokenizer)
            ms = time_steps(samplers, logits, args.iterations)
            print(f"{label:20s} batch {batch:3d}: {ms:8.2f} ms/step  ({ms / batch:6.3f} ms per row)")
    batch = max(int(b) for b in args.batches.split(","))
    logits = random_logits(batch, seed=batch + 1)
    breakdown = step_breakdown(make_samplers(ALL_ON, batch, tokenizer), logits, args.iterations)
    print(f"chain steps, all samplers on, batch {batch} (ms/step): " + ", ".join(f"{k} {v:.2f}" for k, v in breakdown.items()))


if __name__ == "__main__":
    main()
