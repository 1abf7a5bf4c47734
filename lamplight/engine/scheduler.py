"""Admission: the waiting queue, its size limit, and which idle slots a waiting request gets.

Fair by arrival: requests are admitted first come, first served. A request that cannot start yet
(too few idle slots for its `n` choices) reserves the idle slots it sees, so later single-choice
requests cannot take every slot that frees up and starve it; it starts once enough are free. A
request pinned to a busy slot (`id_slot`) reserves only that slot.
"""

from __future__ import annotations

import collections
import threading
from typing import Callable, Iterable

from .handle import RequestHandle
from .slots import Slot, common_prefix
from .types import QueueFullError


class Scheduler:
    def __init__(self, slots: list[Slot], queue_size: int, slot_prompt_similarity: float):
        self.slots = slots
        self.queue_size = queue_size
        self.slot_prompt_similarity = slot_prompt_similarity
        self.waiting: collections.deque[RequestHandle] = collections.deque()
        self._lock = threading.Lock()

    # -- the queue (any thread) -----------------------------------------------------------------

    def enqueue(self, make_handles: Callable[[], list[RequestHandle]]) -> list[RequestHandle]:
        """Queue the handles `make_handles()` builds, as one entry; QueueFullError when full.

        The prompts of one request are one entry: a request never needs more room than one.
        """
        with self._lock:
            if self._queued_entries() >= self.queue_size + self._idle_slot_count():
                raise QueueFullError("the server is busy: the request queue is full, try again later")
            handles = make_handles()
            self.waiting.extend(handles)
        return handles

    def _queued_entries(self) -> int:
        return len({handle.group for handle in self.waiting})

    def _idle_slot_count(self) -> int:
        return sum(1 for s in self.slots if s.is_idle)

    def drop_cancelled(self) -> None:
        with self._lock:
            for handle in [h for h in self.waiting if h.cancelled]:
                self.waiting.remove(handle)

    def take_all(self) -> list[RequestHandle]:
        with self._lock:
            handles = list(self.waiting)
            self.waiting.clear()
        return handles

    # -- admission (engine thread) --------------------------------------------------------------

    def admissions(self) -> Iterable[tuple[RequestHandle, list[Slot]]]:
        """(handle, its slots) for every waiting request that can start now, in arrival order.

        Each one leaves the queue as it is yielded; the caller starts it (marking its slots busy)
        before asking for the next."""
        with self._lock:
            pending = list(self.waiting)
        reserved: set[int] = set()
        for handle in pending:
            available = [s for s in self.slots if s.is_idle and s.id not in reserved]
            slots = self._choose_slots(handle, available)
            if slots is None:
                reserved |= self._reservation(handle, available)
                continue
            with self._lock:
                self.waiting.remove(handle)
            yield handle, slots

    def _reservation(self, handle: RequestHandle, available: list[Slot]) -> set[int]:
        request = handle.request
        reserved = {request.id_slot} if request.id_slot >= 0 else set()
        if request.id_slot < 0 or request.n_choices > 1:
            reserved |= {slot.id for slot in available}
        return reserved

    def _choose_slots(self, handle: RequestHandle, idle: list[Slot]) -> list[Slot] | None:
        request = handle.request
        if request.id_slot >= 0:
            first = self.slots[request.id_slot]
            if first not in idle:
                return None
        else:
            if not idle:
                return None
            first = self._best_slot(idle, request.prompt_tokens, handle.lora_key)
        others = sorted((s for s in idle if s is not first), key=lambda s: s.last_used)
        if len(others) < request.n_choices - 1:
            return None
        return [first] + others[: request.n_choices - 1]

    def _best_slot(self, idle: list[Slot], prompt: list[int], lora_key: tuple[float, ...]) -> Slot:
        threshold = self.slot_prompt_similarity
        best, best_ratio = None, 0.0
        for slot in idle:
            if slot.cached_lora != lora_key:
                continue
            ratio = common_prefix(slot.cached_tokens, prompt) / len(prompt)
            if ratio > threshold and ratio > best_ratio:
                best, best_ratio = slot, ratio
        return best or min(idle, key=lambda s: s.last_used)
