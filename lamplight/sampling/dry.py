"""DRY ("don't repeat yourself"): penalize tokens that would extend a repetition of the history.

For each token y that, appended now, would continue a suffix of the history that already occurred
earlier (a repeat of length L >= allowed_length, counted inside the window and after the most
recent sequence breaker), subtract multiplier * base ** (L - allowed_length) from y's logit.

llama.cpp recomputes everything from the window at every step (a reverse Z-algorithm). Here the
state is incremental per request: for every earlier position i that ends a copy of the current
suffix, `_match[i]` is the length of that copy; appending token x keeps exactly the positions i
that hold x, with length `_match[i - 1] + 1`. A step costs O(occurrences of the last token),
not O(window). Bulk input (the prompt) is indexed once, lazily, with the Z-algorithm.
"""

from __future__ import annotations

import math
import weakref
from bisect import bisect_left
from collections import OrderedDict, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

MAX_BREAKER_BYTES = 40  # llama.cpp truncates each breaker string to 40 bytes
MAX_TAIL_TOKENS = 20  # and each breaker's token tail to 20 tokens
_FLOAT_MAX_LOG = np.float32(88.7228391)


class BreakerTokenizer(Protocol):
    """What DRY needs from a tokenizer (lamplight.tokenizer.Tokenizer has it). `token_bytes(id)`
    stands for llama.cpp's `detokenize([id], special=true)`; the vocabulary size is `vocab_size`
    (or `n_vocab`, or `len(tokenizer)`)."""

    def encode(self, text: str, add_special: bool = False, parse_special: bool = False) -> list[int]: ...

    def token_bytes(self, token_id: int) -> bytes: ...


@dataclass(frozen=True)
class BreakerTable:
    """Sequence breakers as token sequences: head token -> the tails that complete a breaker.

    An empty tail means the head alone is a breaker (its text contains a breaker string).
    """

    tails: dict[int, tuple[tuple[int, ...], ...]]

    @property
    def single_token(self) -> frozenset[int]:
        return frozenset(head for head, tails in self.tails.items() if () in tails)

    @property
    def max_tail(self) -> int:
        return max((len(tail) for tails in self.tails.values() for tail in tails), default=0)

    @classmethod
    def from_sequences(cls, sequences: Iterable[Sequence[int]]) -> BreakerTable:
        """Breakers given directly as token sequences (head first)."""
        tails: dict[int, list[tuple[int, ...]]] = defaultdict(list)
        for sequence in sequences:
            if sequence:
                tail = tuple(sequence[1:])
                if tail not in tails[sequence[0]]:
                    tails[sequence[0]].append(tail)
        return cls({head: tuple(found) for head, found in tails.items()})

    @classmethod
    def for_tokenizer(cls, tokenizer: BreakerTokenizer, breakers: Sequence[str]) -> BreakerTable:
        """llama.cpp's `get_overlapping_token_sequences` for every breaker (cached per tokenizer)."""
        key = tuple(breakers)
        cache = _table_cache(tokenizer)
        if cache is not None and key in cache:
            cache.move_to_end(key)
            return cache[key]
        words = _vocab_bytes(tokenizer)
        tails: dict[int, list[tuple[int, ...]]] = defaultdict(list)
        for breaker in breakers:
            text = breaker.encode("utf-8")[:MAX_BREAKER_BYTES]
            if text:
                _add_overlapping_sequences(tails, words, text, tokenizer)
        table = cls({head: tuple(found) for head, found in tails.items()})
        if cache is not None:
            cache[key] = table
            while len(cache) > MAX_CACHED_TABLES:  # requests choose breakers freely: keep the recent ones
                cache.popitem(last=False)
        return table


def _add_overlapping_sequences(
    tails: dict[int, list[tuple[int, ...]]], words: list[bytes], breaker: bytes, tokenizer: BreakerTokenizer
) -> None:
    """Tokens containing the breaker are breakers alone; a token ending with a proper prefix of
    the breaker starts one, completed by the tokenization of the rest of the breaker."""
    first = breaker[:1]
    tail_of_rest: dict[int, tuple[int, ...]] = {}
    for token_id, word in enumerate(words):
        if first not in word:
            continue
        if breaker in word:
            _add_tail(tails, token_id, ())
            continue
        position = word.find(first)
        while position != -1:
            overlap = len(word) - position
            if breaker.startswith(word[position:]):
                if overlap not in tail_of_rest:
                    rest = breaker[overlap:].decode("utf-8", errors="ignore")
                    tokens = tokenizer.encode(rest, add_special=False, parse_special=False)
                    tail_of_rest[overlap] = tuple(tokens[:MAX_TAIL_TOKENS])
                _add_tail(tails, token_id, tail_of_rest[overlap])
            position = word.find(first, position + 1)


def _add_tail(tails: dict[int, list[tuple[int, ...]]], head: int, tail: tuple[int, ...]) -> None:
    if tail not in tails[head]:
        tails[head].append(tail)


_VOCAB_CACHE: weakref.WeakKeyDictionary[Any, list[bytes]] = weakref.WeakKeyDictionary()
_TABLES: weakref.WeakKeyDictionary[Any, OrderedDict[tuple[str, ...], BreakerTable]] = weakref.WeakKeyDictionary()
MAX_CACHED_TABLES = 64


def _vocab_size(tokenizer: Any) -> int:
    for name in ("vocab_size", "n_vocab"):
        size = getattr(tokenizer, name, None)
        if size is not None:
            return int(size)
    return len(tokenizer)


def _vocab_bytes(tokenizer: BreakerTokenizer) -> list[bytes]:
    try:
        return _VOCAB_CACHE[tokenizer]
    except (KeyError, TypeError):
        pass
    words = [bytes(tokenizer.token_bytes(token_id)) for token_id in range(_vocab_size(tokenizer))]
    try:
        _VOCAB_CACHE[tokenizer] = words
    except TypeError:  # not weak-referenceable: no cache
        pass
    return words


def _table_cache(tokenizer: Any) -> OrderedDict[tuple[str, ...], BreakerTable] | None:
    try:
        return _TABLES.setdefault(tokenizer, OrderedDict())
    except TypeError:
        return None


class DryState:
    """One request's DRY history and match index."""

    def __init__(self, breakers: BreakerTable, multiplier: float, base: float, allowed_length: int, window: int) -> None:
        if window <= 0:
            raise ValueError(f"dry_penalty_last_n: the DRY window must be positive, got {window}")
        self.breakers = breakers
        self.multiplier = float(np.float32(multiplier))
        self.base = float(np.float32(base))
        self.allowed_length = allowed_length
        self.window = window
        self._single_token_breakers = breakers.single_token
        self._max_tail = breakers.max_tail
        self._max_exponent = _max_exponent(self.base)
        self.tokens: list[int] = []
        self._positions: dict[int, list[int]] = defaultdict(list)
        self._match: dict[int, int] | None = {}  # None: rebuild from the history before use
        self._settled: tuple[int, int] | None = None  # newest breaker whose head is out of the recent range
        self._settled_stale = False

    def accept(self, token: int) -> None:
        n = len(self.tokens)
        if self._match is not None:
            occurrences = self._positions.get(token, [])
            start = bisect_left(occurrences, max(0, n + 1 - self.window))
            previous = self._match
            self._match = {i: previous.get(i - 1, 0) + 1 for i in occurrences[start:]}
        self.tokens.append(token)
        self._positions[token].append(n)
        if not self._settled_stale:
            self._settle(n - 1 - self._max_tail)
        self._trim_if_long()

    def accept_many(self, tokens: Iterable[int]) -> None:
        for token in tokens:
            self._positions[token].append(len(self.tokens))
            self.tokens.append(token)
        self._match = None
        self._settled_stale = True
        self._trim_if_long()

    def penalties(self) -> list[tuple[int, float]]:
        """(token, amount to subtract from its logit) for the next token."""
        n = len(self.tokens)
        window_size = min(n, self.window)
        if window_size <= self.allowed_length:
            return []
        window_start = n - window_size
        rep_limit = self._repeat_limit(window_start, window_size)
        if rep_limit < self.allowed_length:
            return []
        longest: dict[int, int] = {}
        if self.allowed_length == 0:
            # llama.cpp counts a repeat of length 0 too: every token that follows another in the
            # window gets the base penalty.
            longest = dict.fromkeys(self.tokens[window_start + 1 :], 0)
        for position, length in self._matches().items():
            if position < window_start:
                continue
            length = min(length, position - window_start + 1, rep_limit)
            if length >= self.allowed_length:
                following = self.tokens[position + 1]
                if longest.get(following, -1) < length:
                    longest[following] = length
        return [
            (token, self._penalty(length))
            for token, length in longest.items()
            if token not in self._single_token_breakers
        ]

    def _penalty(self, repeat_length: int) -> float:
        exponent = repeat_length - self.allowed_length
        if self._max_exponent > 0:
            exponent = min(exponent, self._max_exponent)
        return float(np.float32(self.multiplier * self.base**exponent))

    def _matches(self) -> dict[int, int]:
        if self._match is None:
            self._match = _suffix_matches(self.tokens, self.window)
        return self._match

    def _repeat_limit(self, window_start: int, window_size: int) -> int:
        """How many tokens follow the most recent complete breaker in the window (or the window size)."""
        n = len(self.tokens)
        for head in range(n - 1, max(window_start, n - 1 - self._max_tail) - 1, -1):
            tail_length = self._breaker_at(head, n)
            if tail_length >= 0:
                return n - 1 - head - tail_length
        settled = self._settled_breaker(window_start)
        if settled is not None and settled[0] >= window_start:
            return n - 1 - settled[0] - settled[1]
        return window_size

    def _breaker_at(self, head: int, n: int) -> int:
        """Length of the longest breaker tail that starts after `head` and ends in the history, or -1."""
        tails = self.breakers.tails.get(self.tokens[head])
        if not tails:
            return -1
        longest = -1
        for tail in tails:
            size = len(tail)
            if longest < size and head + size <= n - 1 and tuple(self.tokens[head + 1 : head + 1 + size]) == tail:
                longest = size
        return longest

    def _settle(self, head: int) -> None:
        # Heads older than the recent range have room for every tail, so their match is final.
        if head >= 0:
            tail_length = self._breaker_at(head, len(self.tokens))
            if tail_length >= 0:
                self._settled = (head, tail_length)

    def _settled_breaker(self, window_start: int) -> tuple[int, int] | None:
        if self._settled_stale:
            self._settled = None
            n = len(self.tokens)
            for head in range(n - 2 - self._max_tail, window_start - 1, -1):
                tail_length = self._breaker_at(head, n)
                if tail_length >= 0:
                    self._settled = (head, tail_length)
                    break
            self._settled_stale = False
        return self._settled

    def _trim_if_long(self) -> None:
        # Only the last `window` tokens matter; drop older ones now and then to bound memory.
        excess = len(self.tokens) - self.window
        if excess <= max(self.window, 4096):
            return
        self.tokens = self.tokens[excess:]
        self._positions = defaultdict(list)
        for position, token in enumerate(self.tokens):
            self._positions[token].append(position)
        self._match = None
        self._settled_stale = True


def _max_exponent(base: float) -> int:
    # llama.cpp clamps the exponent so that base ** exponent stays below FLT_MAX.
    if base <= float(np.float32(1.000001)):
        return 0
    return int(_FLOAT_MAX_LOG / np.float32(math.log(base)))


def _suffix_matches(tokens: list[int], window: int) -> dict[int, int]:
    """For each position i in the window (but the last), the length of the longest common
    suffix of tokens[:i + 1] and tokens, kept where it is positive (reverse Z-algorithm)."""
    n = len(tokens)
    reversed_window = tokens[max(0, n - window) :][::-1]
    z = _z_function(reversed_window)
    return {n - 1 - k: z[k] for k in range(1, len(reversed_window)) if z[k] > 0}


def _z_function(values: list[int]) -> list[int]:
    size = len(values)
    z = [0] * size
    left = right = 0
    for k in range(1, size):
        length = min(right - k, z[k - left]) if k < right else 0
        while k + length < size and values[length] == values[k + length]:
            length += 1
        z[k] = length
        if k + length > right:
            left, right = k, k + length
    return z


def apply_dry(logits: np.ndarray, rows: Sequence[int], states: Sequence[DryState]) -> None:
    """Subtract each row's DRY penalties in place."""
    n_vocab = logits.shape[1]
    row_index: list[int] = []
    token_index: list[int] = []
    amounts: list[float] = []
    for row, state in zip(rows, states):
        for token, amount in state.penalties():
            if 0 <= token < n_vocab:
                row_index.append(row)
                token_index.append(token)
                amounts.append(amount)
    if not amounts:
        return
    index = (np.asarray(row_index), np.asarray(token_index))
    logits[index] = logits[index] - np.asarray(amounts, dtype=logits.dtype)
