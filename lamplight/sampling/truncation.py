"""Samplers that remove candidates: top_k, top_p, min_p, typical (typ_p), top_n_sigma, and the
helpers the other samplers share.

All of them work in place on [rows, vocab] float32 logits (numpy) and remove a candidate by
setting its logit to -inf; a -inf candidate is no candidate (see the package docstring for what
that changes against llama.cpp). Where order matters, equal logits are ordered by ascending token
id, so results do not depend on the sort algorithm or the other rows of the batch.

A `Hint` tells a sampler where the candidates can be: `ids` [rows, w], a list per row of
distinct token ids holding every finite logit of the row (the chain keeps the one top_k made),
or `width`, an upper bound on the number of finite logits per row. With either, the samplers
work on [rows, w] instead of sorting the vocabulary. Sums over such lists use
reductions.sum_padded_rows (the width is the batch's widest row); sums over whole vocabulary rows
use reductions.sum_rows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .reductions import cumulative, log_softmax, softmax, sum_padded_rows, sum_rows

NEG_INF = float("-inf")
SMALL_WIDTH = 4096  # up to this many candidates, gather or select + sort; beyond, avoid sorting
# Selecting the best w entries of a row goes through a threshold from the maxima of this many
# groups per entry (at most one entry a group), when the row is at least 4 times wider than w;
# otherwise a stable sort of the whole row is as cheap.
_GROUPS_PER_ENTRY = 16
_SORT_ABOVE_SHARE = 4


@dataclass(frozen=True)
class Hint:
    ids: np.ndarray | None = None  # [rows, w] distinct ids covering every finite logit
    width: int | None = None  # upper bound on the finite logits per row


NO_HINT = Hint()


def count_candidates(logits: np.ndarray) -> np.ndarray:
    return np.count_nonzero(logits > NEG_INF, axis=1)


def resolve_width(logits: np.ndarray, hint: Hint) -> int:
    """The candidate list width to use: the hint's ids, its bound, or the counted maximum."""
    if hint.ids is not None:
        return hint.ids.shape[1]
    if hint.width is None:
        return max(int(count_candidates(logits).max()), 1)
    return max(min(hint.width, logits.shape[1]), 1)


def stable_descending(values: np.ndarray) -> np.ndarray:
    """Positions of each row's entries, largest first, equal ones by ascending position."""
    # Negated, a stable ascending sort keeps equal entries (also -0.0 and 0.0) in id order and
    # puts -inf entries (+inf negated) last.
    return np.argsort(-values, axis=1, kind="stable")


def best_first_ids(logits: np.ndarray, width: int) -> np.ndarray:
    """[rows, width] ids of each row's `width` largest entries, best first, equal entries by
    ascending id: the first `width` of a stable descending sort, without sorting the row."""
    n_vocab = logits.shape[1]
    width = max(min(width, n_vocab), 1)
    if width * _SORT_ABOVE_SHARE > n_vocab:
        return stable_descending(logits)[:, :width]
    thresholds = _lower_bounds_of_the_best(logits, width)
    return np.stack([_best_first_in_row(row, width, threshold) for row, threshold in zip(logits, thresholds)])


def _lower_bounds_of_the_best(logits: np.ndarray, width: int) -> np.ndarray:
    """Per row, a value that at least `width` entries reach: the width-th largest maximum of
    disjoint groups of entries (each of the best `width` group maxima is an entry of its own)."""
    n_groups = min(width * _GROUPS_PER_ENTRY, logits.shape[1])
    per_group = logits.shape[1] // n_groups
    # Group g holds the entries g, g + n_groups, ...: a maximum over contiguous slices.
    group_max = logits[:, : n_groups * per_group].reshape(len(logits), per_group, n_groups).max(axis=1)
    return np.partition(group_max, n_groups - width, axis=1)[:, n_groups - width]


def _best_first_in_row(row: np.ndarray, width: int, threshold: float) -> np.ndarray:
    candidates = np.flatnonzero(row >= threshold)
    if len(candidates) > 8 * width:  # mostly ties at the threshold (-inf entries, zero probabilities)
        values = row[candidates]
        above = candidates[values > threshold]
        if len(above) >= width:
            candidates = above
        else:  # the best are those above, then the lowest ids among the tied
            candidates = np.sort(np.concatenate((above, candidates[values == threshold][: width - len(above)])))
    if len(candidates) < width:  # a NaN threshold
        return stable_descending(row[None])[0, :width]
    order = np.argsort(-row[candidates], kind="stable")[:width]
    return candidates[order]


def sorted_candidates(logits: np.ndarray, hint: Hint = NO_HINT) -> tuple[np.ndarray, np.ndarray]:
    """(logits, ids) of every row's candidates, best first, equal logits by ascending id; rows are
    padded with -inf entries (distinct ids) to a common width."""
    if hint.ids is None:
        ids = best_first_ids(logits, resolve_width(logits, hint))
        return np.take_along_axis(logits, ids, axis=1), ids
    ids = np.sort(hint.ids, axis=1)
    values = np.take_along_axis(logits, ids, axis=1)
    by_value = stable_descending(values)
    return np.take_along_axis(values, by_value, axis=1), np.take_along_axis(ids, by_value, axis=1)


def rebuild(logits: np.ndarray, ids: np.ndarray, values: np.ndarray, kept: np.ndarray) -> None:
    """Write `values` where `kept`, else -inf, at `ids`, which cover every finite logit of the row."""
    np.put_along_axis(logits, ids, np.where(kept, values, np.float32(NEG_INF)), axis=1)


def keep_only(logits: np.ndarray, kept: np.ndarray) -> None:
    """Set the entries not `kept` to -inf, in place."""
    np.copyto(logits, np.float32(NEG_INF), where=~kept)


def remove(logits: np.ndarray, removed: np.ndarray) -> None:
    np.copyto(logits, np.float32(NEG_INF), where=removed)


def _column(values: Sequence[float | int], dtype: type = np.float32) -> np.ndarray:
    return np.asarray(values, dtype=dtype).reshape(-1, 1)


def _counts(width: int) -> np.ndarray:
    return np.arange(1, width + 1)[None, :]


def _prefix_through_first(stop: np.ndarray) -> np.ndarray:
    """Per row, the positions up to and including the first True of `stop` (all if none)."""
    width = stop.shape[1]
    first = np.where(stop.any(axis=1), stop.argmax(axis=1), width - 1)
    return np.arange(width)[None, :] <= first[:, None]


def best_k_mask(logits: np.ndarray, k: np.ndarray | Sequence[int]) -> np.ndarray:
    """Boolean mask of each row's k largest logits, equal logits taken by ascending id (k=0: none)."""
    k = np.clip(np.asarray(k, dtype=np.int64), 0, logits.shape[1])
    mask = np.zeros(logits.shape, dtype=bool)
    if k.size == 0 or int(k.max()) == 0:
        return mask
    ids = best_first_ids(logits, int(k.max()))
    np.put_along_axis(mask, ids, np.arange(ids.shape[1])[None, :] < k[:, None], axis=1)
    return mask


def best_k_sorted(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(scores, ids) of each row's k best entries, best first, equal scores by ascending id."""
    ids = best_first_ids(scores, k)
    return np.take_along_axis(scores, ids, axis=1), ids


def top_k(logits: np.ndarray, k: Sequence[int]) -> np.ndarray:
    """Keep the k best candidates of each row (llama.cpp ignores min_keep here).

    Returns ids [rows, max k] covering the survivors (for the next samplers).
    """
    k_column = _column(np.minimum(np.asarray(k, dtype=np.int64), logits.shape[1]), np.int64)
    ids = best_first_ids(logits, int(k_column.max()))
    values = np.take_along_axis(logits, ids, axis=1)
    logits.fill(NEG_INF)
    rebuild(logits, ids, values, np.arange(ids.shape[1])[None, :] < k_column)
    return ids


def top_p(logits: np.ndarray, p: Sequence[float], min_keep: Sequence[int], hint: Hint = NO_HINT) -> None:
    """Keep the shortest best-first prefix whose probability sum reaches p, and >= min_keep tokens."""
    p_column, min_keep_column = _column(p), _column(min_keep, np.int64)
    if hint.ids is None and resolve_width(logits, hint) > SMALL_WIDTH:
        _top_p_many_candidates(logits, p_column, min_keep_column)
        return
    values, ids = sorted_candidates(logits, hint)
    probs = softmax(values, sum_padded_rows)
    stop = (cumulative(probs) >= p_column) & (_counts(ids.shape[1]) >= min_keep_column)
    rebuild(logits, ids, values, _prefix_through_first(stop))


def _top_p_many_candidates(logits: np.ndarray, p: np.ndarray, min_keep: np.ndarray) -> None:
    """top_p without sorting the vocabulary when the nucleus is found among the best 256 or 4096
    (llama.cpp's adaptive partial sort does the same)."""
    probs_full = softmax(logits, sum_rows)
    kept = np.zeros(logits.shape, dtype=bool)
    pending = np.arange(logits.shape[0])
    for width in (256, SMALL_WIDTH, logits.shape[1]):
        width = min(width, logits.shape[1])
        rows = logits[pending]
        values, ids = sorted_candidates(rows, Hint(width=width))
        probs = np.take_along_axis(probs_full[pending], ids, axis=1)
        stop = (cumulative(probs) >= p[pending]) & (_counts(width) >= min_keep[pending])
        first = np.where(stop.any(axis=1), stop.argmax(axis=1), width - 1)
        # The prefix is exact unless its last logit ties with the window's last, cut by the window.
        exact = np.take_along_axis(values, first[:, None], axis=1)[:, 0] > values[:, -1]
        done = (stop.any(axis=1) & exact) | (width == logits.shape[1])
        prefix = np.arange(width)[None, :] <= first[:, None]
        done_kept = np.zeros((int(done.sum()), logits.shape[1]), dtype=bool)
        np.put_along_axis(done_kept, ids[done], prefix[done], axis=1)
        kept[pending[done]] = done_kept
        pending = pending[~done]
        if pending.size == 0:
            break
    keep_only(logits, kept)


def min_p(logits: np.ndarray, p: Sequence[float], min_keep: Sequence[int], hint: Hint = NO_HINT) -> None:
    """Keep the tokens with probability >= p * (best probability), and at least min_keep tokens."""
    # logf(p) in float32, as llama.cpp compares logit >= max_logit + logf(p).
    log_p = _column([np.float32(math.log(np.float32(value))) for value in p])
    if hint.ids is not None or (hint.width is not None and hint.width <= SMALL_WIDTH):
        values, ids = sorted_candidates(logits, hint)
        kept = (values >= values[:, :1] + log_p) | (_counts(ids.shape[1]) <= _column(min_keep, np.int64))
        rebuild(logits, ids, values, kept)
        return
    kept = logits >= logits.max(axis=1, keepdims=True) + log_p
    if max(min_keep) > 1:
        kept |= best_k_mask(logits, min_keep)
    keep_only(logits, kept)


def typical(logits: np.ndarray, p: Sequence[float], min_keep: Sequence[int], hint: Hint = NO_HINT) -> None:
    """Locally typical sampling: keep the tokens whose surprise is closest to the entropy until
    their probabilities sum to more than p (and at least min_keep tokens)."""
    values, ids = sorted_candidates(logits, hint)
    log_probs = log_softmax(values, sum_padded_rows)
    probs = np.exp(log_probs)
    # llama.cpp adds 0 * log(0) = NaN for a -inf candidate, which makes every score NaN; -inf
    # candidates are simply left out of the entropy here.
    entropy = -sum_padded_rows(np.where(probs > 0, probs * log_probs, np.float32(0.0)))[:, None]
    scores = np.abs(-log_probs - entropy)
    by_score = np.argsort(scores, axis=1, kind="stable")
    covered = cumulative(np.take_along_axis(probs, by_score, axis=1))
    stop = (covered > _column(p)) & (_counts(ids.shape[1]) >= _column(min_keep, np.int64))
    kept = np.zeros(stop.shape, dtype=bool)
    np.put_along_axis(kept, by_score, _prefix_through_first(stop), axis=1)
    rebuild(logits, ids, values, kept)


def top_n_sigma(logits: np.ndarray, n: Sequence[float]) -> None:
    """Keep the logits >= max - n * std, std being the population std of the finite logits."""
    count = count_candidates(logits).astype(np.float32)[:, None]
    best = logits.max(axis=1, keepdims=True)
    # Moments of logit - max (-inf entries as 0, left out by `count`): no large offset to cancel.
    shifted = np.nan_to_num(logits - best, neginf=0.0)
    mean = sum_rows(shifted)[:, None] / count
    mean_square = sum_rows(shifted * shifted)[:, None] / count
    variance = np.maximum(mean_square - mean * mean, np.float32(0.0))
    threshold = best - _column(n) * np.sqrt(variance)
    remove(logits, logits < threshold)
