"""Per-sequence model state: what a model keeps between the steps of a sequence.

A model declares the state it needs (`StateSpec`); whoever runs sequences (the engine, the
scoring helpers) allocates one `ModelState` for all of them and hands it to every step with
the indices each sequence owns: the paged KV of the attention layers (indexed by token slot,
lamplight.state.kv) and, for recurrent layers, one state slot per sequence
(lamplight.state.recurrent). Encoder outputs would be further fields of the same two records.

This package sits below the models and the runners: it imports neither.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .kv import KVLayout, KVPool, KVType
from .recurrent import RecurrentLayout, RecurrentPool


@dataclass(frozen=True)
class StateSpec:
    """The state one model keeps per sequence."""

    kv: KVLayout  # attention layers' keys and values, one entry per token position
    recurrent: tuple[RecurrentLayout, ...] = ()  # one per recurrent layer, in layer order

    def bytes_per_token(self, k_dtype: KVType = torch.float32, v_dtype: KVType | None = None) -> int:
        return self.kv.bytes_per_token(k_dtype, v_dtype)

    def recurrent_bytes_per_sequence(self) -> int:
        """Bytes of recurrent state one sequence holds whatever its length (also one checkpoint's size)."""
        return sum(layout.bytes_per_sequence() for layout in self.recurrent)


@dataclass
class ModelState:
    """The storage behind every sequence's state, shared by the sequences of one engine."""

    kv: KVPool
    recurrent: RecurrentPool | None = None  # None: the model has no recurrent layer

    @classmethod
    def allocate(cls, spec: StateSpec, num_tokens: int, k_dtype: KVType = torch.float32,
                 v_dtype: KVType | None = None, device: torch.device | str = "cpu",
                 n_sequences: int = 1) -> "ModelState":
        """`num_tokens` K/V entries, and `n_sequences` recurrent slots where the model has
        recurrent layers."""
        recurrent = RecurrentPool(spec.recurrent, n_sequences, device) if spec.recurrent else None
        return cls(KVPool(spec.kv, num_tokens, k_dtype, device, v_dtype), recurrent)

    @property
    def device(self) -> torch.device:
        return self.kv.device

    def copy_sequence(self, src: int, dst: int) -> None:
        """Recurrent slot `dst` continues from slot `src` (K/V is shared by block tables instead)."""
        if self.recurrent is not None:
            self.recurrent.copy_sequence(src, dst)

    def snapshot(self, slot: int) -> torch.Tensor:
        """Slot `slot`'s recurrent state as one flat tensor (empty without recurrent layers)."""
        return self.recurrent.snapshot(slot) if self.recurrent is not None else torch.zeros(0)

    def restore(self, slot: int, snapshot: torch.Tensor, n_tokens: int) -> None:
        """Put a snapshot taken after `n_tokens` tokens back into recurrent slot `slot`."""
        if self.recurrent is not None:
            self.recurrent.restore(slot, snapshot, n_tokens)


__all__ = ["KVLayout", "KVPool", "ModelState", "RecurrentLayout", "RecurrentPool", "StateSpec"]
