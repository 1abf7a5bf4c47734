"""Per-sequence model state: what a model keeps between the steps of a sequence.

A model declares the state it needs (`StateSpec`); whoever runs sequences (the engine, the
scoring helpers) allocates one `ModelState` for all of them and hands it to every step with
the indices each sequence owns. Today that is the paged KV of the attention layers; recurrent
layers' state and encoder outputs are further fields of the same two records.

This package sits below the models and the runners: it imports neither.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .kv import KVLayout, KVPool


@dataclass(frozen=True)
class StateSpec:
    """The state one model keeps per sequence."""

    kv: KVLayout  # attention layers' keys and values, one entry per token position

    def bytes_per_token(self, k_dtype: torch.dtype = torch.float32, v_dtype: torch.dtype | None = None) -> int:
        return self.kv.bytes_per_token(k_dtype, v_dtype)


@dataclass
class ModelState:
    """The storage behind every sequence's state, shared by the sequences of one engine."""

    kv: KVPool

    @classmethod
    def allocate(cls, spec: StateSpec, num_tokens: int, k_dtype: torch.dtype = torch.float32,
                 v_dtype: torch.dtype | None = None, device: torch.device | str = "cpu") -> "ModelState":
        return cls(KVPool(spec.kv, num_tokens, k_dtype, device, v_dtype))

    @property
    def device(self) -> torch.device:
        return self.kv.device


__all__ = ["KVLayout", "KVPool", "ModelState", "StateSpec"]
