"""Recurrent layers' per-sequence state: a pool of slots, one per sequence.

A recurrent layer (Gated DeltaNet, gated short convolution, Mamba2) folds every token it reads
into a fixed-size state: the last K-1 inputs of its causal convolution (`history`) and, for the
SSM-like mixers, a matrix per head (`matrix`: the delta rule's key-to-value map, Mamba2's SSM
state). Unlike K/V entries this state cannot be indexed by position: slot `s` holds the state
after the first `tokens[s]` tokens of whatever sequence owns it, and a step continues it from
there. Which sequence owns which slot, and checkpoints of it (`snapshot` / `restore`), are the
caller's business (the engine); models read a chunk's slot at its start and write it at its end.

All recurrent state is float32, as llama.cpp keeps it. `RecurrentPool` keeps it in numpy arrays
(the native forward's); the PyTorch runners' pools are `TorchRecurrentPool`s
(lamplight.state.torch_pools), tensors with the reads and writes the PyTorch model makes.
"""

from __future__ import annotations

import math

import numpy as np

from .layout import RecurrentLayout


class RecurrentPool:
    """Every recurrent layer's state for `n_sequences` slots: layer i's history
    [n_sequences, K-1, channels] and matrix [n_sequences, *matrix]."""

    def __init__(self, layouts: tuple[RecurrentLayout, ...], n_sequences: int):
        if n_sequences < 1:
            raise ValueError(f"a recurrent state pool needs at least one sequence slot, not {n_sequences}")
        self.layouts = layouts
        self.n_sequences = n_sequences
        self.history = [self._zeros((n_sequences, *lay.history)) for lay in layouts]
        self.matrix = [self._zeros((n_sequences, *lay.matrix)) if lay.matrix else None for lay in layouts]
        self.tokens = [0] * n_sequences  # how many tokens each slot's state has folded in

    def _zeros(self, shape: tuple[int, ...]):
        return np.zeros(shape, dtype=np.float32)

    def _flat(self, parts: list):
        """One flat copy of these flat float32 parts (none: an empty array)."""
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)

    def _as_storage(self, snapshot):
        """A snapshot's values as this pool's arrays take them (any float32 array on the CPU)."""
        return np.asarray(snapshot, dtype=np.float32)

    def check_start(self, slot: int, start_pos: int) -> None:
        """A chunk continues its slot's state: it starts where the slot stopped, or at 0 (a new
        sequence, whose state starts from zeros whatever the slot held)."""
        if not 0 <= slot < self.n_sequences:
            raise ValueError(f"state slot {slot} is outside the pool's {self.n_sequences} recurrent slots")
        if start_pos not in (0, self.tokens[slot]):
            raise ValueError(f"a chunk at position {start_pos} on state slot {slot}, which holds the state after "
                             f"{self.tokens[slot]} tokens (restore a checkpoint or start at 0)")

    def copy_sequence(self, src: int, dst: int) -> None:
        """Slot `dst` continues from `src`'s state (n > 1 choices sharing a prompt)."""
        for history, matrix in zip(self.history, self.matrix):
            history[dst] = history[src]
            if matrix is not None:
                matrix[dst] = matrix[src]
        self.tokens[dst] = self.tokens[src]

    def snapshot(self, slot: int):
        """A copy of one slot's state as one flat float32 array (a checkpoint, e.g. kept in RAM)."""
        return self._flat([h[slot].reshape(-1) for h in self.history]
                          + [m[slot].reshape(-1) for m in self.matrix if m is not None])

    def restore(self, slot: int, snapshot, n_tokens: int) -> None:
        """Put a `snapshot` taken after `n_tokens` tokens back into `slot`."""
        size = math.prod(snapshot.shape)
        if size != self.floats_per_sequence:
            raise ValueError(f"a recurrent snapshot of {size} floats; this model's state has "
                             f"{self.floats_per_sequence}")
        flat, offset = self._as_storage(snapshot).reshape(-1), 0
        for part in [*self.history, *(m for m in self.matrix if m is not None)]:
            n = math.prod(part.shape[1:])
            part[slot] = flat[offset:offset + n].reshape(part.shape[1:])
            offset += n
        self.tokens[slot] = n_tokens

    @property
    def floats_per_sequence(self) -> int:
        return sum(lay.floats for lay in self.layouts)

    def advance(self, slot: int, start_pos: int, n_tokens: int) -> None:
        """Record that a chunk of `n_tokens` at `start_pos` was folded into `slot`."""
        self.tokens[slot] = start_pos + n_tokens
