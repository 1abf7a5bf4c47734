"""A step's chunks flattened into rows, as numpy int64 arrays: the token ids, positions and pool
indices of every row, which rows give logits, and the given (image) rows. What the native forward
reads (lamplight.native.runner); the PyTorch batch (lamplight.models.batch) is built from the same
rows, so both backends flatten a step one way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .chunks import SequenceChunk, count_leading_decode


@dataclass
class BatchRows:
    token_ids: np.ndarray  # int64 [T] (a given row's placeholder id is 0: its lookup is skipped)
    positions: np.ndarray  # int64 [T]
    kv_write_slots: np.ndarray  # int64 [T] pool index where each token's K/V is stored
    logit_rows: np.ndarray  # int64 [N] rows whose logits are returned, in chunk order
    chunks: Sequence[SequenceChunk]  # what the rows were built from, in row order
    # Rows whose embeddings are given (multimodal splicing): int64 [R], and their values float32
    # [R, n_embd], used without the model's embedding scale.
    given_rows: np.ndarray | None = None
    given_values: np.ndarray | None = None
    # Per row, the end (exclusive) of the key positions it attends to; None: every row is causal
    # (position + 1). Rows of a non-causal span see up to the span's end.
    key_ends: np.ndarray | None = None
    # How many leading rows are single-token (decode) chunks; kernels may treat them apart.
    leading_decode_tokens: int = 0


def batch_rows(chunks: Sequence[SequenceChunk]) -> BatchRows:
    token_ids: list[int] = []
    positions: list[int] = []
    write_slots: list[int] = []
    logit_rows: list[int] = []
    given = _GivenCollector()
    for chunk in chunks:
        n = len(chunk.token_ids)
        if n == 0:
            raise ValueError("a sequence chunk must hold at least one token")
        if len(chunk.kv_slots) != chunk.start_pos + n:
            raise ValueError("kv_slots must cover the cached context and the chunk's own tokens")
        first_row = len(token_ids)
        token_ids.extend(chunk.token_ids)
        given.add(chunk, first_row, token_ids)
        positions.extend(range(chunk.start_pos, chunk.start_pos + n))
        write_slots.extend(chunk.kv_slots[chunk.start_pos :])
        if chunk.all_logits:
            logit_rows.extend(range(first_row, first_row + n))
        elif chunk.need_logits:
            logit_rows.append(first_row + n - 1)
    return BatchRows(
        token_ids=_int64(token_ids),
        positions=_int64(positions),
        kv_write_slots=_int64(write_slots),
        logit_rows=_int64(logit_rows),
        chunks=list(chunks),
        given_rows=given.rows(),
        given_values=given.values(),
        key_ends=given.key_ends(positions),
        leading_decode_tokens=count_leading_decode(chunks),
    )


def _int64(values: list[int]) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def host_floats(values) -> np.ndarray:
    """float32 values on the CPU as numpy: a numpy array as it is, a torch tensor (a vision
    encoder's rows, on any device) converted without importing torch here."""
    if hasattr(values, "detach"):
        values = values.detach().float().cpu().numpy()
    return np.asarray(values, dtype=np.float32)


class _GivenCollector:
    """The chunks' given rows as BatchRows' given rows, values and key ends. The rows' token ids
    (placeholders, outside the vocabulary) become 0 for the embedding lookup they skip."""

    def __init__(self):
        self._rows: list[int] = []
        self._values: list = []
        self.spans: list[tuple[int, int]] = []  # (first row, end row) of each non-causal span

    def add(self, chunk: SequenceChunk, first_row: int, token_ids: list[int]) -> None:
        n = len(chunk.token_ids)
        for given in chunk.given_rows:
            if not 0 <= given.first <= given.first + given.n_rows <= n:
                raise ValueError(f"given rows [{given.first}, {given.first + given.n_rows}) are outside the chunk "
                                 f"of {n} tokens")
            start = first_row + given.first
            self._rows.extend(range(start, start + given.n_rows))
            token_ids[start:start + given.n_rows] = [0] * given.n_rows
            self._values.append(host_floats(given.values))
            if given.non_causal:
                self.spans.append((start, start + given.n_rows))

    def rows(self) -> np.ndarray | None:
        return _int64(self._rows) if self._rows else None

    def values(self) -> np.ndarray | None:
        return np.concatenate(self._values) if self._values else None

    def key_ends(self, positions: list[int]) -> np.ndarray | None:
        if not self.spans:
            return None
        ends = [p + 1 for p in positions]
        for first, end in self.spans:
            ends[first:end] = [positions[end - 1] + 1] * (end - first)
        return _int64(ends)
