"""After a step: each chunk's recurrent state slot holds the state after the chunk's tokens."""

from __future__ import annotations


def advance_states(batch, pool) -> None:
    """Record in `pool` (a RecurrentPool) that every chunk of `batch` (a ForwardBatch) was folded
    into its state slot. Bookkeeping only: no torch here, whoever computed the step wrote the states."""
    for chunk in batch.chunks:
        pool.advance(chunk.state_slot, chunk.start_pos, len(chunk.token_ids))
