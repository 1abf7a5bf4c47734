"""Repetition penalties: repeat (multiplicative), frequency and presence over a window of tokens."""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence

import numpy as np


class PenaltyWindow:
    """The last `size` accepted tokens (prompt included) and how often each occurs among them."""

    def __init__(self, size: int) -> None:
        if size <= 0:
            raise ValueError(f"repeat_last_n: the penalty window must be positive, got {size}")
        self.size = size
        self._tokens: deque[int] = deque()
        self.counts: Counter[int] = Counter()

    def accept(self, token: int) -> None:
        if len(self._tokens) == self.size:
            oldest = self._tokens.popleft()
            self.counts[oldest] -= 1
            if self.counts[oldest] == 0:
                del self.counts[oldest]
        self._tokens.append(token)
        self.counts[token] += 1


def apply_penalties(
    logits: np.ndarray,
    rows: Sequence[int],
    windows: Sequence[PenaltyWindow],
    repeat: Sequence[float],
    frequency: Sequence[float],
    presence: Sequence[float],
) -> None:
    """llama.cpp's penalties, in place, touching only the tokens each row's window holds."""
    n_vocab = logits.shape[1]
    row_index: list[int] = []
    token_index: list[int] = []
    counts: list[int] = []
    param_index: list[int] = []
    for position, (row, window) in enumerate(zip(rows, windows)):
        for token, count in window.counts.items():
            if 0 <= token < n_vocab:
                row_index.append(row)
                token_index.append(token)
                counts.append(count)
                param_index.append(position)
    if not counts:
        return
    index = (np.asarray(row_index), np.asarray(token_index))
    which = np.asarray(param_index)
    repeat_t = np.asarray(repeat, dtype=np.float32)[which]
    frequency_t = np.asarray(frequency, dtype=np.float32)[which]
    presence_t = np.asarray(presence, dtype=np.float32)[which]
    count_t = np.asarray(counts, dtype=np.float32)

    values = logits[index]
    # Dividing a negative logit would make the token more likely, so those are multiplied.
    values = np.where(values <= 0, values * repeat_t, values / repeat_t)
    # Each (row, token) pair occurs once (a window's counts), so plain assignment is exact.
    logits[index] = values - (count_t * frequency_t + presence_t)
