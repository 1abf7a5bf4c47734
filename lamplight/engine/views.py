"""JSON views of the engine's slots for GET /slots and the KV figures of /metrics.

Read without a lock from HTTP threads: a view may be one step out of date."""

from __future__ import annotations

from .kv_cache import KVCache
from .sequence import SeqState
from .slots import Slot

# Keys of generation_settings that llama-server leaves out of /slots params.
SLOT_PARAMS_OMIT = ("grammar", "grammar_lazy", "grammar_triggers", "preserved_tokens", "stop", "logit_bias",
                    "dry_sequence_breakers")


def slot_json(slot: Slot, n_ctx_slot: int, speculative: bool = False) -> dict:
    """One entry of GET /slots, shaped like llama-server's; `speculative`: whether the server
    drafts (a running request's own fields decide for its slot)."""
    seq = slot.seq
    entry = {
        "id": slot.id,
        "n_ctx": n_ctx_slot,
        "speculative": seq.speculator is not None if seq is not None else speculative,
        "is_processing": seq is not None,
        "id_task": slot.id_task,
        "n_prompt_tokens": slot.n_prompt_tokens,
        "n_prompt_tokens_processed": seq.n_computed - seq.n_cached if seq else 0,
        "n_prompt_tokens_cache": seq.n_cached if seq else 0,
    }
    settings = slot.settings
    if settings is not None:
        entry["params"] = {k: v for k, v in settings.items() if k not in SLOT_PARAMS_OMIT}
    if seq is not None or settings is not None:
        entry["next_token"] = [
            {
                "has_next_token": seq is not None and seq.state != SeqState.DONE,
                "has_new_line": seq is not None and "\n" in seq.text,
                "n_remain": seq.request.n_predict - len(seq.generated) if seq and seq.request.n_predict >= 0 else -1,
                "n_decoded": len(seq.generated) if seq else 0,
            }
        ]
    return entry


def kv_usage(cache: KVCache, slots: list[Slot]) -> tuple[float, int]:
    """(share of KV blocks in use, tokens the slots hold, running or kept for reuse)."""
    used = 1.0 - cache.allocator.num_free / cache.num_blocks
    tokens = sum(slot.seq.n_computed if slot.seq is not None else len(slot.cached_tokens) for slot in slots)
    return used, tokens
