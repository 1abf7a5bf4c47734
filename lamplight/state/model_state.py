"""`ModelState`: the storage behind every sequence's state, K/V pool and recurrent pool together."""

from __future__ import annotations

from dataclasses import dataclass

from .kv import KVPool
from .layout import StateSpec
from .recurrent import RecurrentPool


@dataclass
class ModelState:
    """The storage behind every sequence's state, shared by the sequences of one engine: numpy
    pools (`allocate`) or PyTorch ones (lamplight.state.torch_pools.torch_state)."""

    kv: KVPool
    recurrent: RecurrentPool | None = None  # None: the model has no recurrent layer

    @classmethod
    def allocate(cls, spec: StateSpec, num_tokens: int, k_dtype=None, v_dtype=None,
                 n_sequences: int = 1) -> "ModelState":
        """Numpy pools: `num_tokens` K/V entries (K as `k_dtype`, None: f32; V as `v_dtype`, None:
        as K), and `n_sequences` recurrent slots where the model has recurrent layers."""
        recurrent = RecurrentPool(spec.recurrent, n_sequences) if spec.recurrent else None
        return cls(KVPool(spec.kv, num_tokens, k_dtype, v_dtype=v_dtype), recurrent)

    @property
    def device(self):
        return self.kv.device

    def copy_sequence(self, src: int, dst: int) -> None:
        """Recurrent slot `dst` continues from slot `src` (K/V is shared by block tables instead)."""
        if self.recurrent is not None:
            self.recurrent.copy_sequence(src, dst)

    def snapshot(self, slot: int):
        """A copy of slot `slot`'s recurrent state as one flat float32 array of the pools' kind
        (empty without recurrent layers)."""
        return self.recurrent.snapshot(slot) if self.recurrent is not None else self.kv.floats(0)

    def restore(self, slot: int, snapshot, n_tokens: int) -> None:
        """Put a snapshot taken after `n_tokens` tokens back into recurrent slot `slot`."""
        if self.recurrent is not None:
            self.recurrent.restore(slot, snapshot, n_tokens)
