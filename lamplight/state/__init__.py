"""Per-sequence model state: what a model keeps between the steps of a sequence.

A model declares the state it needs (`StateSpec`, lamplight.state.layout); whoever runs
sequences (the engine, the scoring helpers) allocates one `ModelState` for all of them and hands
it to every step with the indices each sequence owns: the paged KV of the attention layers
(indexed by token slot, lamplight.state.kv) and, for recurrent layers, one state slot per
sequence (lamplight.state.recurrent). Encoder outputs would be further fields of the same two
records.

The layouts, the KV types and the pools on numpy (the native forward's) import without torch;
the pools on PyTorch storage (lamplight.state.torch_pools: the PyTorch runners') are imported on
first use.

This package sits below the models and the runners: it imports neither.
"""

from __future__ import annotations

import importlib

from .kv import KVPool
from .kv_types import KV_TYPES, KVType, kv_type
from .layout import KVLayout, RecurrentLayout, StateSpec
from .model_state import ModelState
from .recurrent import RecurrentPool

# The names backed by PyTorch storage, by the module that defines each.
_TORCH_NAMES = {"TorchKVPool": ".torch_pools", "TorchRecurrentPool": ".torch_pools", "torch_state": ".torch_pools"}


def __getattr__(name: str):
    module = _TORCH_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module, __name__), name)


__all__ = ["KV_TYPES", "KVLayout", "KVPool", "KVType", "ModelState", "RecurrentLayout", "RecurrentPool", "StateSpec",
           "TorchKVPool", "TorchRecurrentPool", "kv_type", "torch_state"]
