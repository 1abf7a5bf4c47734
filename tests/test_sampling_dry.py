"""DRY's incremental state against a direct port of llama.cpp's llama_sampler_dry_apply, and the
breaker table against get_overlapping_token_sequences' rules."""

from __future__ import annotations

import random

import numpy as np
import pytest

from lamplight.sampling.dry import BreakerTable, DryState
from lamplight.sampling.penalties import PenaltyWindow


def llama_dry(history, table: BreakerTable, multiplier, base, allowed_length, penalty_last_n) -> dict[int, float]:
    """llama.cpp's algorithm, step by step (ring buffer of penalty_last_n tokens, restart scan,
    reverse Z-algorithm, max repeat per following token, penalty)."""
    last_tokens = list(history[-penalty_last_n:])
    size = len(last_tokens)

    def rat(i: int) -> int:
        return last_tokens[size - 1 - i]

    last_n_repeat = min(size, penalty_last_n)
    if last_n_repeat <= allowed_length:
        return {}
    rep_limit = last_n_repeat
    for i in range(last_n_repeat):
        longest = -1
        for tail in table.tails.get(rat(i), ()):
            if len(tail) > longest and len(tail) <= i:
                if all(tail[offset] == rat(i - offset - 1) for offset in range(len(tail))):
                    longest = len(tail)
        if longest >= 0:
            rep_limit = i - longest
            break
    if rep_limit < allowed_length:
        return {}
    counts = [0] * last_n_repeat
    last = last_n_repeat - 1
    lt = rt = 0
    for k in range(1, last_n_repeat):
        if k > rt:
            n = 0
            while n + k < last_n_repeat and rat(n) == rat(n + k):
                n += 1
            counts[last - k] = min(n, rep_limit)
            if n > 0:
                lt, rt = k, k + n - 1
        else:
            p = k - lt
            right_part_len = rt - k + 1
            if counts[last - p] < right_part_len:
                counts[last - k] = min(counts[last - p], rep_limit)
            else:
                i = rt + 1
                while i < last_n_repeat and rat(i) == rat(i - k):
                    i += 1
                counts[last - k] = min(i - k, rep_limit)
                lt, rt = k, i - 1
    max_repeat: dict[int, int] = {}
    for i in range(last_n_repeat - 1):
        if counts[i] >= allowed_length:
            token = rat(last_n_repeat - 2 - i)
            if max_repeat.get(token, -1) < counts[i]:
                max_repeat[token] = counts[i]
    base32, multiplier32 = np.float32(base), np.float32(multiplier)
    max_exponent = int(np.float32(88.7228391) / np.float32(np.log(base32))) if base32 > np.float32(1.000001) else 0
    penalties = {}
    for token, length in max_repeat.items():
        if () in table.tails.get(token, ()):
            continue
        exponent = length - allowed_length
        if max_exponent > 0:
            exponent = min(exponent, max_exponent)
        penalties[token] = float(np.float32(float(multiplier32) * float(base32) ** exponent))
    return penalties


TABLE = BreakerTable.from_sequences([[0], [1, 2], [1, 2, 3], [4, 1], [5, 5, 5]])


@pytest.mark.parametrize("window", [3, 8, 64, 1000])
@pytest.mark.parametrize("allowed_length", [0, 1, 2, 3])
def test_incremental_dry_matches_llama_cpp(window: int, allowed_length: int) -> None:
    rng = random.Random(window * 10 + allowed_length)
    for trial in range(4):
        alphabet = rng.choice([3, 6, 12])
        prompt = [rng.randrange(alphabet) for _ in range(rng.randrange(0, 40))]
        incremental = DryState(TABLE, 0.8, 1.75, allowed_length, window)
        incremental.accept_many(prompt)
        history = list(prompt)
        for step in range(120):
            expected = llama_dry(history, TABLE, 0.8, 1.75, allowed_length, window)
            assert dict(incremental.penalties()) == expected, (trial, step, history)
            if step % 17 == 0:  # the lazily rebuilt index agrees too
                rebuilt = DryState(TABLE, 0.8, 1.75, allowed_length, window)
                rebuilt.accept_many(history)
                assert dict(rebuilt.penalties()) == expected
            # Mostly repeat an earlier stretch, so that long repeats occur.
            if history and rng.random() < 0.7:
                token = history[rng.randrange(len(history))]
            else:
                token = rng.randrange(alphabet)
            incremental.accept(token)
            history.append(token)


def test_long_histories_are_trimmed_without_changing_results() -> None:
    rng = random.Random(5)
    state = DryState(TABLE, 1.0, 2.0, 2, 16)
    history: list[int] = []
    for step in range(9000):
        token = history[-7] if len(history) > 7 and rng.random() < 0.8 else rng.randrange(8)
        state.accept(token)
        history.append(token)
        if step % 97 == 0:
            assert dict(state.penalties()) == llama_dry(history, TABLE, 1.0, 2.0, 2, 16)
    assert len(state.tokens) < 9000


def test_exponent_is_clamped_like_llama_cpp() -> None:
    state = DryState(BreakerTable.from_sequences([]), 1.0, 1000.0, 0, 10_000)
    state.accept_many([7] * 200)
    (token, penalty), = state.penalties()
    assert token == 7 and np.isfinite(penalty)
    assert penalty == float(np.float32(1000.0 ** int(np.float32(88.7228391) / np.float32(np.log(1000.0)))))


class PiecesTokenizer:
    def __init__(self, texts: list[str]) -> None:
        self.texts = texts
        self.n_vocab = len(texts)

    def token_bytes(self, token_id: int) -> bytes:
        return self.texts[token_id].encode()

    def encode(self, text: str, add_special: bool = False, parse_special: bool = False) -> list[int]:
        ids, start = [], 0
        while start < len(text):
            end = max(e for e in range(start + 1, len(text) + 1) if text[start:e] in self.texts or e == start + 1)
            ids.append(self.texts.index(text[start:end]) if text[start:end] in self.texts else -1)
            start = end
        return ids


def test_breaker_table_follows_get_overlapping_token_sequences() -> None:
    texts = ["a", "t", "th", "the", " the", "he", "e", "x:y", "\n  ", "tat", "):", "q"]
    table = BreakerTable.for_tokenizer(PiecesTokenizer(texts), ["the", ":", "\n"])
    assert table.single_token == {3, 4, 7, 8, 10}  # the, " the", x:y, "\n  ", "):" contain a breaker
    assert set(table.tails[1]) == {(5,)}  # "t" + tokens("he")
    assert set(table.tails[2]) == {(6,)}  # "th" + tokens("e")
    assert set(table.tails[9]) == {(5,)}  # "tat" ends with "t"
    assert 0 not in table.tails and 11 not in table.tails


def test_penalty_window_counts_the_last_n_tokens() -> None:
    rng = random.Random(1)
    window = PenaltyWindow(5)
    history = []
    for _ in range(200):
        token = rng.randrange(6)
        window.accept(token)
        history.append(token)
        expected = {t: history[-5:].count(t) for t in set(history[-5:])}
        assert dict(window.counts) == expected
