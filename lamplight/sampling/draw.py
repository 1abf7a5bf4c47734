"""The inverse-CDF draw: each row's token from its final weights (exp(logit - max), >= 0) and
its own uniform number, with sums that give a row the same bits alone or in any batch.

The running sums are float64 and run over a row's weights in vocabulary order:

* a row with few candidates (at most truncation.SMALL_WIDTH: every candidate list, and a
  whole-vocabulary row with few left) is summed from the left over its nonzero weights, so the
  zeros between them (a list's padding, a whole row's removed tokens) change nothing: the row
  gets the same total and token as a list padded to any width or as a whole-vocabulary row;
* a row with more is always a whole-vocabulary row: blocks of BLOCK vocabulary positions are
  summed pairwise, the block sums added from the left, and the drawn block is summed from the
  left. (numpy adds a whole row from the left at about 3 ns a token.)
"""

from __future__ import annotations

import math

import numpy as np

BLOCK = 1024


def draw_from_lists(weights: np.ndarray, uniforms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(positions, totals) of rows [rows, width] of few candidates each, padding weighing 0."""
    running = np.cumsum(weights, axis=1, dtype=np.float64)
    totals = running[:, -1]
    # The first position whose running sum exceeds the target (searchsorted, side="right").
    positions = np.count_nonzero(running <= (uniforms * totals)[:, None], axis=1)
    positions = np.minimum(positions, weights.shape[1] - 1)
    landed = np.take_along_axis(weights, positions[:, None], axis=1)[:, 0]
    for row in np.flatnonzero(landed <= 0):
        positions[row] = _on_a_weight(weights[row], int(positions[row]))
    return positions, totals


def draw_from_row(weights: np.ndarray, uniform: float, many: bool) -> tuple[int, float]:
    """(position, total) of a whole-vocabulary row; `many`: it has more than SMALL_WIDTH candidates."""
    if many:
        return _draw_in_blocks(weights, uniform)
    nonzero = np.flatnonzero(weights)
    if nonzero.size == 0:
        return 0, math.nan
    running = np.cumsum(weights[nonzero], dtype=np.float64)
    position = min(int(np.searchsorted(running, uniform * running[-1], side="right")), nonzero.size - 1)
    return int(nonzero[position]), float(running[-1])


def _draw_in_blocks(weights: np.ndarray, uniform: float) -> tuple[int, float]:
    values = np.zeros(-(-weights.size // BLOCK) * BLOCK)
    values[: weights.size] = weights
    blocks = values.reshape(-1, BLOCK)
    ends = np.cumsum(blocks.sum(axis=1))
    target = uniform * ends[-1]
    block = min(int(np.searchsorted(ends, target, side="right")), len(ends) - 1)
    running = (ends[block - 1] if block else 0.0) + np.cumsum(blocks[block])
    position = block * BLOCK + min(int(np.searchsorted(running, target, side="right")), BLOCK - 1)
    return _on_a_weight(weights, min(position, weights.size - 1)), float(ends[-1])


def _on_a_weight(weights: np.ndarray, position: int) -> int:
    """Rounding can land past the last candidate (on a zero weight): the last positive weight
    up to there instead."""
    if weights[position] > 0:
        return position
    positive = np.flatnonzero(weights[: position + 1] > 0)
    return int(positive[-1]) if positive.size else position
