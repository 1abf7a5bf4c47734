"""Resident memory by purpose (start-up log, /props `lamplight.memory_mib`)."""

from __future__ import annotations

from typing import Any


def memory_budget(loaded: Any, engine: Any) -> dict[str, float]:
    """In MiB: the weights the runner computes with, the KV cache (all of it: on the CPU its
    pages become resident as tokens fill it, lamplight.state.kv.KVPool), and (where the
    backend tracks them) the step's working buffers so far; a draft model's (-md) beside them."""
    runner = loaded.runner
    budget = {"weights": runner.weight_bytes(), "kv_cache": _kv_bytes(engine.state)}
    scratch = runner.scratch_bytes()
    if scratch is not None:
        budget["scratch"] = scratch
    draft = getattr(engine, "draft_model", None)
    if draft is not None:
        budget["draft_weights"] = draft.runner.weight_bytes()
        budget["draft_kv_cache"] = _kv_bytes(draft.state)
    return {name: round(size / 2**20, 1) for name, size in budget.items()}


def _kv_bytes(state: Any) -> int:
    kv = state.kv
    return sum(t.nbytes for t in (*kv.k, *kv.v))  # numpy arrays (the native pool) or tensors alike


def memory_line(loaded: Any, engine: Any) -> str:
    budget = memory_budget(loaded, engine)
    scratch = f", scratch {budget['scratch']:.0f} MiB so far" if "scratch" in budget else ""
    draft = (f"; draft model: weights {budget['draft_weights']:.0f} MiB, KV cache {budget['draft_kv_cache']:.0f} MiB"
             if "draft_weights" in budget else "")
    return (f"weights {budget['weights']:.0f} MiB, KV cache {budget['kv_cache']:.0f} MiB (resident as it fills)"
            f"{scratch}{draft}")
