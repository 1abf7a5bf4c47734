"""What one step computes for each sequence: a chunk of its tokens (`SequenceChunk`) and the
embedding rows given for some of them (`GivenRows`, an image's). Described without torch: the
engine builds them, each runner flattens them its own way (lamplight.models.rows for numpy,
lamplight.models.batch for PyTorch)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence


@dataclass(frozen=True, eq=False)
class GivenRows:
    """Embeddings given for rows [first, first + n) of a chunk (counted from the chunk's first
    token): they replace the token embeddings as they are, without the model's embedding scale
    (an image's projector rows). `non_causal`: these rows attend to each other both ways (gemma3's
    image rows; text stays causal), so the chunk must hold all of them."""

    first: int
    values: Any  # float [n, n_embd]: a numpy array or a torch tensor
    non_causal: bool = False

    @property
    def n_rows(self) -> int:
        return int(self.values.shape[0])


@dataclass(frozen=True)
class SequenceChunk:
    """The part of one sequence computed in this step.

    `kv_slots` lists, in position order, the pool index of every K/V entry the chunk attends to:
    the cached context followed by the chunk's own tokens (whose entries are written this step).
    `state_slot` is the recurrent state slot the sequence owns (models with recurrent layers):
    read at the chunk's start, written at its end. The slot must hold the state after exactly
    `start_pos` tokens (a chunk at 0 starts from zeros whatever the slot held).
    """

    token_ids: Sequence[int]
    start_pos: int
    kv_slots: Sequence[int]
    need_logits: bool = True  # usually only the last chunk of a prompt, or a decode token
    all_logits: bool = False  # logits for every token of the chunk (teacher forcing, scoring)
    state_slot: int = 0
    given_rows: tuple[GivenRows, ...] = field(default=(), compare=False)  # media rows, in row order


def count_leading_decode(chunks: Sequence[SequenceChunk]) -> int:
    """How many chunks at the start of a step are single tokens (decode tokens)."""
    return next((i for i, c in enumerate(chunks) if len(c.token_ids) != 1), len(chunks))
