"""A slot: one KV sequence of at most n_ctx_slot tokens that keeps its tokens after a request."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .kv_cache import BlockTable, KVCache

if TYPE_CHECKING:
    from .sequence import Sequence


class Slot:
    """A KV sequence of at most n_ctx_slot tokens, keeping its tokens after a request for reuse."""

    def __init__(self, slot_id: int, cache: KVCache):
        self.id = slot_id
        self.table = BlockTable(cache)
        self.cached_tokens: list[int] = []  # tokens whose K/V the table holds
        self.cached_lora: tuple[float, ...] = ()  # the adapter scales those K/V were computed with
        self.seq: Sequence | None = None
        self.last_used = 0.0
        self.n_prompt_tokens = 0
        self.id_task = -1
        self.settings: dict | None = None  # the last request's generation_settings (for /slots)

    @property
    def is_idle(self) -> bool:
        return self.seq is None


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
