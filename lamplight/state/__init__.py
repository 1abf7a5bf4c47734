"""Per-sequence model state: what a model keeps between the steps of a sequence.

A model declares the state it needs (`StateSpec`, lamplight.state.layout); whoever runs
sequences (the engine, the scoring helpers) allocates one `ModelState` for all of them and hands
it to every step with the indices each sequence owns: the paged KV of the attention layers
(indexed by token slot, lamplight.state.kv) and, for recurrent layers, one state slot per
sequence (lamplight.state.recurrent). Encoder outputs would be further fields of the same two
records.

The layouts import without torch; the pools (PyTorch tensors) are imported on first use, so
that describing a model does not load torch.

This package sits below the models and the runners: it imports neither.
"""

from __future__ import annotations

import importlib

from .layout import KVLayout, RecurrentLayout, StateSpec

# The names backed by PyTorch storage, by the module that defines each.
_POOLS = {"KVPool": ".kv", "ModelState": ".model_state", "RecurrentPool": ".recurrent"}


def __getattr__(name: str):
    module = _POOLS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module, __name__), name)


__all__ = ["KVLayout", "KVPool", "ModelState", "RecurrentLayout", "RecurrentPool", "StateSpec"]
