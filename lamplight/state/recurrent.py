"""Recurrent layers' per-sequence state: a pool of slots, one per sequence.

A recurrent layer (Gated DeltaNet, gated short convolution, Mamba2) folds every token it reads
into a fixed-size state: the last K-1 inputs of its causal convolution (`history`) and, for the
SSM-like mixers, a matrix per head (`matrix`: the delta rule's key-to-value map, Mamba2's SSM
state). Unlike K/V entries this state cannot be indexed by position: slot `s` holds the state
after the first `tokens[s]` tokens of whatever sequence owns it, and a step continues it from
there. Which sequence owns which slot, and checkpoints of it (`snapshot` / `restore`), are the
caller's business (the engine); models read a chunk's slot at its start and write it at its end.

All recurrent state is float32, as llama.cpp keeps it.
"""

from __future__ import annotations

import math

import torch

from .layout import RecurrentLayout


class RecurrentPool:
    """Every recurrent layer's state for `n_sequences` slots: layer i's history
    [n_sequences, K-1, channels] and matrix [n_sequences, *matrix]."""

    def __init__(self, layouts: tuple[RecurrentLayout, ...], n_sequences: int, device: torch.device | str = "cpu"):
        if n_sequences < 1:
            raise ValueError(f"a recurrent state pool needs at least one sequence slot, not {n_sequences}")
        self.layouts = layouts
        self.n_sequences = n_sequences
        self.history = [torch.zeros((n_sequences, *lay.history), device=device) for lay in layouts]
        self.matrix = [torch.zeros((n_sequences, *lay.matrix), device=device) if lay.matrix else None for lay in layouts]
        self.tokens = [0] * n_sequences  # how many tokens each slot's state has folded in

    def read(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Copies of layer `layer`'s history and matrix at `slots` ([B])."""
        matrix = self.matrix[layer]
        return self.history[layer].index_select(0, slots), None if matrix is None else matrix.index_select(0, slots)

    def write(self, layer: int, slots: torch.Tensor, history: torch.Tensor, matrix: torch.Tensor | None) -> None:
        self.history[layer].index_copy_(0, slots, history)
        if matrix is not None:
            self.matrix[layer].index_copy_(0, slots, matrix)

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

    def snapshot(self, slot: int) -> torch.Tensor:
        """One slot's state as one flat float32 tensor (a checkpoint, e.g. kept in RAM)."""
        parts = [h[slot].reshape(-1) for h in self.history] + [m[slot].reshape(-1) for m in self.matrix if m is not None]
        return torch.cat(parts) if parts else torch.zeros(0)

    def restore(self, slot: int, snapshot: torch.Tensor, n_tokens: int) -> None:
        """Put a `snapshot` taken after `n_tokens` tokens back into `slot`."""
        if snapshot.numel() != self.floats_per_sequence:
            raise ValueError(f"a recurrent snapshot of {snapshot.numel()} floats; this model's state has "
                             f"{self.floats_per_sequence}")
        parts = iter(snapshot.to(self.history[0].device if self.history else "cpu").split(self._part_sizes()))
        for h in self.history:
            h[slot] = next(parts).view(h.shape[1:])
        for m in self.matrix:
            if m is not None:
                m[slot] = next(parts).view(m.shape[1:])
        self.tokens[slot] = n_tokens

    def _part_sizes(self) -> list[int]:
        return [math.prod(lay.history) for lay in self.layouts] + [math.prod(lay.matrix) for lay in self.layouts if lay.matrix]

    @property
    def floats_per_sequence(self) -> int:
        return sum(lay.floats for lay in self.layouts)

    def advance(self, slot: int, start_pos: int, n_tokens: int) -> None:
        """Record that a chunk of `n_tokens` at `start_pos` was folded into `slot`."""
        self.tokens[slot] = start_pos + n_tokens
