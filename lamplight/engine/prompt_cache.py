"""The host-memory prompt cache (llama-server's `--cache-ram MiB`): more cached conversations
than there are slots.

A slot keeps the K/V of its last tokens for the next request that shares their prefix. When a
slot's tokens are about to be lost (a new request that keeps less than half of them, or room
taken from an idle slot by the shared pool) they are copied here, with the adapter scales they
were computed with and, for a model with recurrent layers, the state after them. A new request
whose prompt shares a longer prefix with an entry than with its slot gets that entry copied into
the slot first.

An entry is only ever used for the tokens it holds: the prefix it shares with the prompt is
compared token by token (media positions carry ids derived from the image's content), never by
a hash alone, so a request never continues another conversation (llama.cpp has had that bug).
A recurrent state cannot be cut back, so such an entry serves only prompts that extend all of
its tokens. Entries are dropped least recently used first to stay within the budget.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Any

from ..state import ModelState
from .kv_cache import KVCache
from .slots import Slot, common_prefix

MIB = 2**20


@dataclass
class CacheEntry:
    tokens: tuple[int, ...]
    lora: tuple[float, ...]
    # Per layer, the rows as the pool stores them (KVPool.read_stored: numpy arrays, or tensors
    # of a PyTorch pool on its device).
    k: list[Any]
    v: list[Any]
    recurrent: Any | None  # the state after all the tokens, a snapshot (models with recurrent layers)

    @property
    def bytes(self) -> int:
        arrays = [*self.k, *self.v] + ([self.recurrent] if self.recurrent is not None else [])
        return sum(a.nbytes for a in arrays)

    def usable_prefix(self, prompt: list[int], lora: tuple[float, ...]) -> int:
        """How many of the prompt's first tokens this entry can stand for (0: none)."""
        if lora != self.lora:
            return 0
        n = common_prefix(list(self.tokens), prompt)
        if self.recurrent is not None and n < len(self.tokens):
            return 0  # a recurrent state holds all its tokens or is of no use
        return n


class PromptCache:
    """Entries within `budget_mib` (-1: no limit), least recently used dropped first."""

    def __init__(self, budget_mib: int):
        self.budget = None if budget_mib < 0 else budget_mib * MIB
        self.entries: collections.OrderedDict[tuple[int, ...], CacheEntry] = collections.OrderedDict()
        self.hits = 0

    @property
    def bytes_held(self) -> int:
        return sum(entry.bytes for entry in self.entries.values())

    def save(self, slot: Slot, cache: KVCache, state: ModelState) -> None:
        """Copy the slot's cached tokens here (unless an entry already holds them all)."""
        tokens = tuple(slot.cached_tokens)
        if not tokens or any(len(e.tokens) >= len(tokens) and e.tokens[: len(tokens)] == tokens and e.lora == slot.cached_lora
                             for e in self.entries.values()):
            return
        index = slot.table.slots(0, len(tokens))
        pool = cache.pool
        layers = [pool.read_stored(layer, index) for layer in range(len(pool.k))]
        recurrent = state.snapshot(slot.id) if state.recurrent is not None else None  # a copy
        entry = CacheEntry(tokens, tuple(slot.cached_lora), [k for k, _ in layers], [v for _, v in layers], recurrent)
        if self.budget is not None and entry.bytes > self.budget:
            return
        for key in [key for key, e in self.entries.items() if e.lora == entry.lora and tokens[: len(key)] == key]:
            del self.entries[key]  # shorter entries this one holds entirely
        self.entries[tokens] = entry
        while self.budget is not None and self.bytes_held > self.budget:
            self.entries.popitem(last=False)

    def best(self, prompt: list[int], lora: tuple[float, ...]) -> tuple[CacheEntry | None, int]:
        """The entry standing for the longest prefix of `prompt`, and that prefix's length."""
        found, longest = None, 0
        for entry in self.entries.values():
            n = entry.usable_prefix(prompt, lora)
            if n > longest:
                found, longest = entry, n
        return found, longest

    def load(self, entry: CacheEntry, slot: Slot, cache: KVCache, state: ModelState) -> None:
        """Copy `entry` into the slot (whose blocks it replaces; the caller made room)."""
        table = slot.table
        table.release()
        table.fill_to(len(entry.tokens))
        index = table.slots()
        pool = cache.pool
        for layer in range(len(pool.k)):
            pool.write_stored(layer, index, entry.k[layer], entry.v[layer])
        if entry.recurrent is not None:
            state.restore(slot.id, entry.recurrent, len(entry.tokens))
        slot.cached_tokens = list(entry.tokens)
        slot.cached_lora = entry.lora
        self.entries.move_to_end(entry.tokens)
        self.hits += 1
