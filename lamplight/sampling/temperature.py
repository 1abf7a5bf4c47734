"""Temperature: plain scaling, greedy (temperature <= 0) and dynamic temperature (llama.cpp's temp_ext)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .reductions import RowSums, log_softmax, sum_padded_rows, sum_rows
from .truncation import NEG_INF, NO_HINT, SMALL_WIDTH, Hint, rebuild, resolve_width, sorted_candidates


def greedy(logits: np.ndarray, hint: Hint = NO_HINT) -> None:
    """Keep only each row's best logit (the lowest id among equal ones)."""
    if hint.ids is None:
        best = logits.argmax(axis=1)[:, None]  # the first maximum
        value = np.take_along_axis(logits, best, axis=1)
        logits.fill(NEG_INF)
        np.put_along_axis(logits, best, value, axis=1)
        return
    ids = np.sort(hint.ids, axis=1)
    values = np.take_along_axis(logits, ids, axis=1)
    best = values.argmax(axis=1)[:, None]
    rebuild(logits, ids, values, np.arange(ids.shape[1])[None, :] == best)


def scale(logits: np.ndarray, temperature: Sequence[float], hint: Hint = NO_HINT) -> None:
    t = np.asarray(temperature, dtype=np.float32)[:, None]
    if hint.ids is None:
        logits /= t
    else:
        np.put_along_axis(logits, hint.ids, np.take_along_axis(logits, hint.ids, axis=1) / t, axis=1)


def dynamic_temperature(
    logits: np.ndarray,
    temperature: Sequence[float],
    spread: Sequence[float],
    exponent: Sequence[float],
    hint: Hint = NO_HINT,
) -> None:
    """llama.cpp's temp_ext: divide by t = min_t + (max_t - min_t) * (H / log n) ** exponent, where
    H is the entropy of the current candidates and n their number, min_t = max(0, T - spread) and
    max_t = T + spread. t <= 0 is greedy; rows with fewer than 2 candidates are left alone."""
    if hint.ids is not None or resolve_width(logits, hint) <= SMALL_WIDTH:
        values, ids = sorted_candidates(logits, hint)
        t = _dynamic_temperatures(values, temperature, spread, exponent, sum_padded_rows)
        # Sorted best first, so greedy keeps position 0 (the lowest id among equal maxima).
        dropped = (t <= 0)[:, None] & (np.arange(ids.shape[1]) > 0)[None, :]
        rebuild(logits, ids, values / np.where(t > 0, t, np.float32(1.0))[:, None], ~dropped)
        return
    t = _dynamic_temperatures(logits, temperature, spread, exponent, sum_rows)
    cold = np.flatnonzero(t <= 0)
    if cold.size:
        sub = logits[cold]
        greedy(sub)
        logits[cold] = sub
    logits /= np.where(t > 0, t, np.float32(1.0))[:, None]


def _dynamic_temperatures(
    logits: np.ndarray, temperature: Sequence[float], spread: Sequence[float], exponent: Sequence[float],
    sums: RowSums,
) -> np.ndarray:
    """Each row's dynamic temperature (float32); NaN for rows with fewer than 2 candidates."""
    log_probs = log_softmax(logits, sums)
    entropy = -sums(np.where(log_probs > NEG_INF, np.exp(log_probs) * log_probs, np.float32(0.0)))
    n_candidates = np.count_nonzero(logits > NEG_INF, axis=1)
    # llama.cpp's log n counts -inf entries still in its array; only real candidates count here.
    normalized = entropy / np.log(n_candidates.astype(np.float32))
    t = np.asarray(temperature, dtype=np.float32)
    d = np.asarray(spread, dtype=np.float32)
    low = np.maximum(t - d, np.float32(0.0))
    high = t + d
    dynamic = low + (high - low) * np.power(normalized, np.asarray(exponent, dtype=np.float32))
    return np.where(n_candidates > 1, dynamic, np.float32(np.nan))
