"""XTC ("exclude top choices"): with some probability per token, remove every candidate whose
probability reaches the threshold except the least likely of them."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .reductions import softmax, sum_padded_rows, sum_rows
from .truncation import NEG_INF, NO_HINT, SMALL_WIDTH, Hint, best_k_mask, rebuild, remove, resolve_width, sorted_candidates


def xtc(logits: np.ndarray, threshold: Sequence[float], min_keep: Sequence[int], hint: Hint = NO_HINT) -> None:
    """Apply XTC in place to rows whose coin already came up (see SequenceSampler.xtc_triggered)."""
    threshold_column = np.asarray(threshold, dtype=np.float32)[:, None]
    min_keep_array = np.asarray(min_keep, dtype=np.int64)
    if hint.ids is not None or resolve_width(logits, hint) <= SMALL_WIDTH:
        values, ids = sorted_candidates(logits, hint)
        probs = softmax(values, sum_padded_rows)
        n_remove = _removed_count(probs, values > NEG_INF, threshold_column, min_keep_array)
        rebuild(logits, ids, values, np.arange(ids.shape[1])[None, :] >= n_remove[:, None])
        return
    n_remove = _removed_count(softmax(logits, sum_rows), logits > NEG_INF, threshold_column, min_keep_array)
    # The candidates above the threshold are exactly the best ones.
    remove(logits, best_k_mask(logits, n_remove))


def _removed_count(probs: np.ndarray, finite: np.ndarray, threshold: np.ndarray, min_keep: np.ndarray) -> np.ndarray:
    """All tokens at or above the threshold but the least likely go, if min_keep tokens remain."""
    above = np.count_nonzero(probs >= threshold, axis=1)
    n_remove = above - 1
    allowed = (above >= 2) & (np.count_nonzero(finite, axis=1) - n_remove >= min_keep)
    return np.where(allowed, n_remove, 0)
