"""`ModelState`: the storage behind every sequence's state, K/V pool and recurrent pool together."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .kv import KVPool, KVType
from .layout import StateSpec
from .recurrent import RecurrentPool


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
