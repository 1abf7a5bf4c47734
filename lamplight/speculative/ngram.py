"""The n-gram drafters: a sequence's next tokens guessed from its own history.

Each kind follows llama.cpp's (common/ngram-map.cpp, common/ngram-mod.cpp, common/speculative.cpp)
in what it proposes; how it finds it is its own (a search of the history's bytes instead of
hash maps of indices). A draft only decides how many tokens a step verifies, never which
tokens come out (lamplight.engine.speculation), so any difference costs speed, not output.

A drafter sees the sequence's tokens (prompt and reply, the last one just sampled and not yet
computed) through a TokenHistory it keeps in step; `draft(limit)` proposes at most `limit`
tokens, `accepted(n)` hears how many of its last draft the model agreed with.
"""

from __future__ import annotations

import struct
from array import array

from .config import NgramMapSizes, NgramModSizes

_ITEM = 4  # bytes of one token id in a history


class TokenHistory:
    """A sequence's token ids as int32 bytes, extended as the sequence grows, for fast searches."""

    def __init__(self):
        self.data = bytearray()
        self.tokens = array("i")

    def __len__(self) -> int:
        return len(self.tokens)

    def sync(self, tokens: list[int]) -> None:
        """Append what `tokens` has beyond this history (it only grows, or the engine resets it)."""
        new = tokens[len(self.tokens):]
        if new:
            self.tokens.extend(new)
            self.data += struct.pack(f"<{len(new)}i", *new)

    def reset(self) -> None:
        self.data = bytearray()
        self.tokens = array("i")

    def key(self, start: int, n: int) -> bytes:
        return bytes(self.data[start * _ITEM:(start + n) * _ITEM])

    def last_occurrence(self, start: int, n: int, lo: int, hi: int) -> int:
        """The largest j in [lo, hi] where tokens[j:j+n] == tokens[start:start+n], or -1."""
        if hi < lo:
            return -1
        pattern = self.key(start, n)
        end = (hi + n) * _ITEM
        while True:
            at = self.data.rfind(pattern, lo * _ITEM, end)
            if at < 0:
                return -1
            if at % _ITEM == 0:
                return at // _ITEM
            end = at + len(pattern) - 1  # a match across token boundaries: look before it

    def occurrences(self, start: int, n: int, lo: int, hi: int) -> list[int]:
        """Every j in [lo, hi] where tokens[j:j+n] == tokens[start:start+n], in order."""
        pattern = self.key(start, n)
        found, at, end = [], lo * _ITEM, (hi + n) * _ITEM
        while True:
            at = self.data.find(pattern, at, end)
            if at < 0:
                return found
            if at % _ITEM == 0:
                found.append(at // _ITEM)
            at += 1

    def span(self, start: int, n: int) -> list[int]:
        return self.tokens[start:start + n].tolist()


def until_placeholder(tokens: list[int]) -> list[int]:
    """A draft up to its first image placeholder (not a token the model can read)."""
    for i, token in enumerate(tokens):
        if token < 0:
            return tokens[:i]
    return tokens


class Drafter:
    """The drafter interface; each kind below fills it in."""

    kind = ""

    def __init__(self):
        self.history = TokenHistory()

    def begin(self, tokens: list[int]) -> None:
        """The sequence's prompt, before its first draft."""
        self.history.sync(tokens)

    def reset(self, tokens: list[int]) -> None:
        """The sequence's tokens changed in the middle (a context shift): start again from them."""
        self.history.reset()
        self.begin(tokens)

    def draft(self, tokens: list[int], limit: int) -> list[int]:
        self.history.sync(tokens)
        return until_placeholder(self._draft(limit))[:limit]

    def _draft(self, limit: int) -> list[int]:
        raise NotImplementedError

    def accepted(self, n_accepted: int) -> None:
        """How many tokens of this drafter's last draft were accepted."""


class NgramSimple(Drafter):
    """ngram-simple: the last occurrence of the last n tokens that at least n tokens follow, and
    the (at most m) tokens that followed it (common_ngram_simple_draft, which takes the last
    occurrence and drafts nothing when fewer than n follow it: a loop shorter than n tokens
    never drafted)."""

    kind = "ngram-simple"

    def __init__(self, sizes: NgramMapSizes):
        super().__init__()
        self.n, self.m = sizes.size_n, sizes.size_m

    def _draft(self, limit: int) -> list[int]:
        h, n = self.history, self.n
        length = len(h) - 1  # llama.cpp's history: without the token just sampled
        if length <= n + self.m + 1:
            return []
        j = h.last_occurrence(length + 1 - n, n, 1, length - 2 * n)
        return h.span(j + n, min(self.m, length - (j + n))) if j >= 0 else []


class NgramMap(Drafter):
    """ngram-map-k (`values` False): the tokens after the last earlier occurrence of the last n
    tokens, as many as were accepted the last time this key drafted (m at first).
    ngram-map-k4v (`values` True): the m-grams seen after the key are counted (the first four
    kinds), and the most frequent drafts if it is at least twice as frequent as the others
    together and the key has drafted `min_hits` times (common_ngram_map_draft)."""

    MAX_VALUES = 4

    def __init__(self, sizes: NgramMapSizes, values: bool):
        super().__init__()
        self.n, self.m, self.min_hits, self.values = sizes.size_n, sizes.size_m, sizes.min_hits, values
        self.kind = "ngram-map-k4v" if values else "ngram-map-k"
        self.keys: dict[bytes, _KeyStats] = {}
        self.last: tuple[_KeyStats, int] | None = None  # the key and value of the last draft

    def _draft(self, limit: int) -> list[int]:
        self.last = None
        h, n, m = self.history, self.n, self.m
        length = len(h) - 1
        if length < 2 * n + m:
            return []
        latest = length - n - m - 2  # the last key start with m tokens after it, before the key itself
        match = h.last_occurrence(length + 1 - n, n, 1, latest)
        if match < 0:
            return []
        stats = self.keys.setdefault(h.key(length + 1 - n, n), _KeyStats(m))
        stats.hits += 1
        if not self.values:
            self.last = (stats, 0)
            return h.span(match + n, min(m, stats.n_accepted[0]))
        if stats.hits < self.min_hits:
            return []
        self._count_values(stats, length + 1 - n, match)
        best = max(range(len(stats.counts)), key=lambda v: stats.counts[v], default=None)
        if best is None:
            return []
        others = sum(stats.counts) - stats.counts[best]
        if others > 0 and stats.counts[best] < 2 * others:
            return []  # no value clearly the most frequent
        self.last = (stats, best)
        return h.span(stats.starts[best], min(m, stats.n_accepted[best]))

    def _count_values(self, stats: "_KeyStats", key_start: int, match: int) -> None:
        """Count the m-grams after the key's occurrences from where the last count stopped up to `match`."""
        h, n, m = self.history, self.n, self.m
        for i in h.occurrences(key_start, n, stats.counted_to, match):
            value = h.key(i + n, m)
            if value in stats.index:
                stats.counts[stats.index[value]] += 1
            elif len(stats.counts) < self.MAX_VALUES:
                stats.index[value] = len(stats.counts)
                stats.starts.append(i + n)
                stats.counts.append(1)
                stats.n_accepted.append(m)
        stats.counted_to = match + 1

    def accepted(self, n_accepted: int) -> None:
        if self.last is not None:
            stats, value = self.last
            stats.n_accepted[value] = n_accepted


class _KeyStats:
    """One key n-gram's statistics: how often it drafted, and its values (k4v) or value 0 (k)."""

    def __init__(self, m: int):
        self.hits = 0
        self.counted_to = 0
        self.index: dict[bytes, int] = {}
        self.starts: list[int] = []
        self.counts: list[int] = []
        self.n_accepted: list[int] = [m]  # per value: the length of its next draft


class NgramModTable:
    """ngram-mod's table, shared by every sequence of a server: each n-gram's next token (the
    latest seen wins). Cleared when it grows past MAX_ENTRIES (llama.cpp: a quarter of its 4M
    hashed entries) or after a streak of poorly accepted drafts."""

    MAX_ENTRIES = 1 << 20

    def __init__(self, n: int):
        self.n = n
        self.next: dict[bytes, int] = {}

    def add(self, history: TokenHistory, start: int, end: int) -> None:
        """The n-grams starting in [start, end) and their next tokens."""
        n, data, tokens = self.n, history.data, history.tokens
        for i in range(start, end):
            self.next[bytes(data[i * _ITEM:(i + n) * _ITEM])] = tokens[i + n]
        if len(self.next) > self.MAX_ENTRIES:
            self.next.clear()


class NgramMod(Drafter):
    """ngram-mod: follow the shared table from the last n tokens, one token at a time, for at
    most n_max tokens; a chain shorter than n_min is no draft. New n-grams are added every 32
    tokens; five drafts in a row with less than a quarter accepted clear the table."""

    kind = "ngram-mod"
    ADD_EVERY = 32

    def __init__(self, sizes: NgramModSizes, table: NgramModTable):
        super().__init__()
        self.sizes, self.table = sizes, table
        self.added_to = 0  # n-grams starting before this are in the table
        self.last_draft = 0
        self.low_streak = 0

    def begin(self, tokens: list[int]) -> None:
        super().begin(tokens)
        self.added_to = 0
        self._add(len(self.history) - self.table.n)

    def _add(self, end: int) -> None:
        if end > self.added_to:
            self.table.add(self.history, self.added_to, end)
            self.added_to = end

    def _draft(self, limit: int) -> list[int]:
        self.last_draft = 0
        n, h = self.table.n, self.history
        if len(h) < n:
            return []
        length = len(h) - 1
        if self.added_to + self.ADD_EVERY < length:
            self._add(length - n)
        key = bytes(h.data[(len(h) - n) * _ITEM:])
        draft: list[int] = []
        for _ in range(self.sizes.n_max):  # the whole chain: n_min counts it before the step's limit cuts it
            token = self.table.next.get(key)
            if token is None:
                break
            draft.append(token)
            key = key[_ITEM:] + struct.pack("<i", token)
        if len(draft) < self.sizes.n_min:
            return []
        self.last_draft = len(draft)
        return draft

    def accepted(self, n_accepted: int) -> None:
        if self.last_draft <= 0:
            return
        if n_accepted / self.last_draft < 0.25:
            self.low_streak += 1
            if self.low_streak >= 5:
                self.table.next.clear()
                self.low_streak, self.added_to = 0, 0
        else:
            self.low_streak = 0
