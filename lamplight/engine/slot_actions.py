"""POST /slots/{id}?action=save|restore|erase on an idle slot. The engine runs these on its own
thread, between steps (Engine.call_on_engine)."""

from __future__ import annotations

import time

from .kv_cache import KVCache
from .slot_files import save_slot, write_slot
from .slots import Slot
from .types import InvalidRequestError


def idle_slot(slots: list[Slot], slot_id: int) -> Slot:
    if not 0 <= slot_id < len(slots):
        raise InvalidRequestError(f"slot {slot_id} does not exist (the server has {len(slots)} slots)")
    slot = slots[slot_id]
    if not slot.is_idle:
        raise InvalidRequestError(f"slot {slot_id} is busy processing a request")
    return slot


def save_to_file(slot: Slot, cache: KVCache, path: str, fingerprint: str) -> dict:
    start = time.perf_counter()
    n_bytes = save_slot(path, cache, slot.table, slot.cached_tokens, slot.cached_lora, fingerprint)
    return {"n_saved": len(slot.cached_tokens), "n_written": n_bytes, "ms": (time.perf_counter() - start) * 1e3}


def restore_from(slot: Slot, cache: KVCache, data: dict) -> dict:
    """`data`: what slot_files.load_slot read (checked against the model already)."""
    start = time.perf_counter()
    write_slot(cache, slot.table, data)
    slot.cached_tokens = list(data["tokens"])
    slot.cached_lora = tuple(data["lora"])
    return {"n_restored": len(slot.cached_tokens), "ms": (time.perf_counter() - start) * 1e3}


def erase(slot: Slot) -> dict:
    n = len(slot.cached_tokens)
    slot.table.release()
    slot.cached_tokens = []
    return {"n_erased": n}
