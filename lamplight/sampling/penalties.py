"""Repetition penalties: repeat (multiplicative), frequency and presence over a window of tokens."""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence

import torch


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
    logits: torch.Tensor,
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
    device = logits.device
    index = (torch.tensor(row_index, device=device), torch.tensor(token_index, device=device))
    which = torch.tensor(param_index, device=device)
    repeat_t = torch.tensor(repeat, dtype=torch.float32, device=device)[which]
    frequency_t = torch.tensor(frequency, dtype=torch.float32, device=device)[which]
    presence_t = torch.tensor(presence, dtype=torch.float32, device=device)[which]
    count_t = torch.tensor(counts, dtype=torch.float32, device=device)

    values = logits[index]
    # Dividing a negative logit would make the token more likely, so those are multiplied.
    values = torch.where(values <= 0, values * repeat_t, values / repeat_t)
    values = values - (count_t * frequency_t + presence_t)
    logits[index] = values
