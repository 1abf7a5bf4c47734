"""POST /slots/{id}?action=save|restore|erase on an idle slot. The engine runs these on its own
thread, between steps (Engine.call_on_engine)."""

from __future__ import annotations

import time

from ..state import ModelState
from .checkpoints import CheckpointStore
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


def save_to_file(slot: Slot, cache: KVCache, path: str, fingerprint: str, state: ModelState | None = None) -> dict:
    """`state`: the engine's, where the model has recurrent layers (their state is saved too)."""
    start = time.perf_counter()
    recurrent = state.snapshot(slot.id) if state is not None and state.recurrent is not None else None
    n_bytes = save_slot(path, cache, slot.table, slot.cached_tokens, slot.cached_lora, fingerprint, recurrent)
    return {"n_saved": len(slot.cached_tokens), "n_written": n_bytes, "ms": (time.perf_counter() - start) * 1e3}


def restore_from(slot: Slot, cache: KVCache, data: dict, state: ModelState | None = None,
                 checkpoints: CheckpointStore | None = None) -> dict:
    """`data`: what slot_files.load_slot read (checked against the model already)."""
    start = time.perf_counter()
    if state is not None and state.recurrent is not None:
        if "recurrent" not in data:
            raise InvalidRequestError("the slot file holds no recurrent state, which this model needs")
        state.restore(slot.id, data["recurrent"], len(data["tokens"]))
    if checkpoints is not None:
        checkpoints.clear(slot.id)  # they were of the tokens the file replaces
    write_slot(cache, slot.table, data)
    slot.cached_tokens = list(data["tokens"])
    slot.cached_lora = tuple(data["lora"])
    return {"n_restored": len(slot.cached_tokens), "ms": (time.perf_counter() - start) * 1e3}


def erase(slot: Slot) -> dict:
    n = len(slot.cached_tokens)
    slot.table.release()
    slot.cached_tokens = []
    return {"n_erased": n}
