"""Per-row sums and softmax that give a row the same bits alone or in any batch.

numpy sums a contiguous row pairwise, so the result depends on the row's length and on where its
zeros are. Two kinds of rows reach these sums:

* rows of the whole vocabulary: the same length in every batch, so `sum_rows` (numpy's pairwise
  sum of each contiguous row) is both fast and reproducible;
* candidate lists padded with -inf to the widest row of the batch: `sum_padded_rows` adds from the
  left in float64, where a padding entry (a 0) changes nothing, so the row's own length decides.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

RowSums = Callable[[np.ndarray], np.ndarray]


def sum_rows(values: np.ndarray) -> np.ndarray:
    """[rows] float32: each row's pairwise sum (rows of one length whatever the batch)."""
    return np.ascontiguousarray(values).sum(axis=1)


def sum_padded_rows(values: np.ndarray) -> np.ndarray:
    """[rows] float32: each row's sum from the left in float64 (padding zeros change nothing)."""
    if values.shape[1] == 0:
        return np.zeros(values.shape[0], dtype=np.float32)
    return np.cumsum(values, axis=1, dtype=np.float64)[:, -1].astype(np.float32)


def cumulative(values: np.ndarray) -> np.ndarray:
    """Running sums along each row, accumulated in float64 and rounded to float32 (what torch's
    float32 cumsum gives on the CPU)."""
    return np.cumsum(values, axis=1, dtype=np.float64).astype(np.float32)


def softmax(logits: np.ndarray, sums: RowSums) -> np.ndarray:
    """Row-wise softmax in float32; a row without a finite logit is all NaN."""
    weights = np.exp(logits - logits.max(axis=1, keepdims=True))
    return weights / sums(weights)[:, None]


def log_softmax(logits: np.ndarray, sums: RowSums) -> np.ndarray:
    shifted = logits - logits.max(axis=1, keepdims=True)
    return shifted - np.log(sums(np.exp(shifted)))[:, None]
