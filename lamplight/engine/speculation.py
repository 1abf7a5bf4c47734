"""Speculative decoding's verification side: where a draft fits and what it is computed as.

A sequence's draft (lamplight.speculative) rides in the step as single-token chunks after its
decode token, one per drafted position, each attending to the positions before it: decode
rows, computed exactly as the decode step of that position would be (the reproducibility
rule: a decode row is the same whatever else the batch holds). The engine then samples the
rows in order with the sequence's own sampler, grammar and random stream, and keeps tokens up
to the first that differs from the draft, that one included. So a request's tokens with
speculation are the tokens without it; only the number of steps changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..models.chunks import SequenceChunk
from .sequence import Sequence


def draft_limit(seq: Sequence) -> int:
    """The most tokens `seq` may draft this step: room in its context for the draft, the token
    after it and one more (llama-server's n_ctx - n_tokens - 2), and no more than its n_predict
    leaves after the decode token."""
    limit = seq.n_ctx_slot - seq.n_computed - 2
    n_predict = seq.request.n_predict
    if n_predict >= 0:
        limit = min(limit, n_predict - len(seq.generated) - 1)
    return limit


def draft_chunks(seq: Sequence, draft: list[int]) -> list[SequenceChunk]:
    """The draft's rows: token i at the position after the decode token's + i, each a decode row
    seeing every position up to its own (the K/V of the rows before it is written this step)."""
    first = seq.n_computed + 1
    return [SequenceChunk([token], first + i, seq.table.slots(0, first + i + 1), state_slot=seq.slot_id)
            for i, token in enumerate(draft)]


def verify_chunk(seq: Sequence, draft: list[int]) -> SequenceChunk:
    """The decode token and its draft as one chunk with every row's logits: for runners whose
    chunk rows are computed as decode rows (ModelRunner.chunk_rows_are_decode_rows)."""
    pos = seq.n_computed
    end = pos + 1 + len(draft)
    return SequenceChunk([seq.tokens[pos], *draft], pos, seq.table.slots(0, end), all_logits=True,
                         state_slot=seq.slot_id)


@dataclass
class SpecStats:
    """Totals for /metrics (llama-server's spec_decode_* names)."""

    draft_tokens: int = 0
    accepted_tokens: int = 0
    drafts: int = 0  # verification steps
    accepted_per_position: list[int] = field(default_factory=list)

    def record(self, drafted: int, accepted: int) -> None:
        self.draft_tokens += drafted
        self.accepted_tokens += accepted
        self.drafts += 1
        if len(self.accepted_per_position) < drafted:
            self.accepted_per_position.extend([0] * (drafted - len(self.accepted_per_position)))
        for i in range(accepted):
            self.accepted_per_position[i] += 1
