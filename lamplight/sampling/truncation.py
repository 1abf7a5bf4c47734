"""Samplers that remove candidates: top_k, top_p, min_p, typical (typ_p), top_n_sigma, and the
helpers the other samplers share.

All of them work in place on [rows, vocab] logits and remove a candidate by setting its logit to
-inf; a -inf candidate is no candidate (see the package docstring for what that changes against
llama.cpp). Where order matters, equal logits are ordered by ascending token id, so results do
not depend on the sort algorithm, the device or the other rows of the batch.

A `Hint` tells a sampler where the candidates can be: `ids` [rows, w], a list per row of
distinct token ids holding every finite logit of the row (the chain keeps the one top_k made),
or `width`, an upper bound on the number of finite logits per row. With either, the samplers
work on [rows, w] instead of sorting the vocabulary.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

NEG_INF = float("-inf")
SMALL_WIDTH = 4096  # up to this many candidates, gather or topk + sort; beyond, avoid sorting


@dataclass(frozen=True)
class Hint:
    ids: torch.Tensor | None = None  # [rows, w] distinct ids covering every finite logit
    width: int | None = None  # upper bound on the finite logits per row


NO_HINT = Hint()


def count_candidates(logits: torch.Tensor) -> torch.Tensor:
    return (logits > NEG_INF).sum(dim=1, dtype=torch.int32)


def resolve_width(logits: torch.Tensor, hint: Hint) -> int:
    """The candidate list width to use: the hint's ids, its bound, or the counted maximum."""
    if hint.ids is not None:
        return hint.ids.shape[1]
    if hint.width is None or hint.width > SMALL_WIDTH:
        return max(int(count_candidates(logits).max()), 1)
    return max(min(hint.width, logits.shape[1]), 1)


def sorted_candidates(logits: torch.Tensor, hint: Hint = NO_HINT) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits, ids) of every row's candidates, best first, equal logits by ascending id; rows are
    padded with -inf entries (distinct ids) to a common width."""
    if hint.ids is not None:
        ids = torch.sort(hint.ids, dim=1).values
        values = logits.gather(1, ids)
    else:
        width = resolve_width(logits, hint)
        if width * 8 > logits.shape[1]:
            values, ids = torch.sort(logits, dim=1, descending=True, stable=True)
            return values[:, :width], ids[:, :width]
        values, ids = torch.topk(logits, width, dim=1)
        ids, by_id = torch.sort(ids, dim=1)
        values = values.gather(1, by_id)
    values, by_value = torch.sort(values, dim=1, descending=True, stable=True)
    return values, ids.gather(1, by_value)


def rebuild(logits: torch.Tensor, ids: torch.Tensor, values: torch.Tensor, kept: torch.Tensor) -> None:
    """Write `values` where `kept`, else -inf, at `ids`, which cover every finite logit of the row."""
    logits.scatter_(1, ids, torch.where(kept, values, NEG_INF))


def keep_only(logits: torch.Tensor, kept: torch.Tensor) -> None:
    """Set the entries not `kept` to -inf, in place."""
    # min(x, +inf) = x and min(x, -inf) = -inf: branch-free, several times faster on CPU than
    # masked_fill_ with an irregular mask.
    cap = kept.to(logits.dtype).sub_(0.5).mul_(math.inf)
    torch.minimum(logits, cap, out=logits)


def remove(logits: torch.Tensor, removed: torch.Tensor) -> None:
    keep_only(logits, ~removed)


def _column(values: Sequence[float | int], logits: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype, device=logits.device).unsqueeze(1)


def _counts(width: int, device: torch.device) -> torch.Tensor:
    return torch.arange(1, width + 1, device=device).unsqueeze(0)


def _prefix_through_first(stop: torch.Tensor) -> torch.Tensor:
    """Per row, the positions up to and including the first True of `stop` (all if none)."""
    width = stop.shape[1]
    first = torch.where(stop.any(dim=1), stop.int().argmax(dim=1), width - 1)
    return torch.arange(width, device=stop.device).unsqueeze(0) <= first.unsqueeze(1)


def _topk_selection(logits: torch.Tensor, k: torch.Tensor):
    """topk for per-row k: (values, ids, kept-in-topk-order, rows where a tie group is cut at k)."""
    n_vocab = logits.shape[1]
    values, ids = torch.topk(logits, min(int(k.max()) + 1, n_vocab), dim=1)
    position = torch.arange(ids.shape[1], device=logits.device).unsqueeze(0)
    kept = position < k.unsqueeze(1)
    kth = values.gather(1, (k - 1).clamp(min=0).unsqueeze(1))
    after = values.gather(1, k.clamp(max=ids.shape[1] - 1).unsqueeze(1))
    cut_tie = ((k > 0) & (k < n_vocab)).unsqueeze(1) & (after == kth) & (kth > NEG_INF)
    return values, ids, kept, cut_tie.squeeze(1)


def best_k_mask(logits: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Boolean mask of each row's k largest logits, equal logits taken by ascending id (k=0: none)."""
    k = k.clamp(0, logits.shape[1])
    if k.numel() == 0 or int(k.max()) == 0:
        return torch.zeros_like(logits, dtype=torch.bool)
    values, ids, kept, cut_tie = _topk_selection(logits, k)
    mask = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, ids, kept)
    if bool(cut_tie.any()):
        # topk picks arbitrary members of a tie group cut by the k-th place; redo those rows by id.
        rows = cut_tie.nonzero().squeeze(1)
        kth = values[rows].gather(1, (k[rows] - 1).unsqueeze(1))
        mask[rows] = _best_k_by_id(logits[rows], k[rows], kth)
    return mask


def best_k_sorted(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(scores, ids) of each row's k best entries, best first, equal scores by ascending id."""
    k = min(k, scores.shape[1])
    k_tensor = torch.full((scores.shape[0],), k, dtype=torch.long, device=scores.device)
    values, ids, _, cut_tie = _topk_selection(scores, k_tensor)
    ids = ids[:, :k]
    if bool(cut_tie.any()):
        rows = cut_tie.nonzero().squeeze(1)
        exact = _best_k_by_id(scores[rows], k_tensor[rows], values[rows, k - 1 : k])
        ids = ids.index_put((rows,), exact.nonzero()[:, 1].view(len(rows), k))
    ids = torch.sort(ids, dim=1).values
    values, by_value = torch.sort(scores.gather(1, ids), dim=1, descending=True, stable=True)
    return values, ids.gather(1, by_value)


def _best_k_by_id(logits: torch.Tensor, k: torch.Tensor, kth: torch.Tensor) -> torch.Tensor:
    above = logits > kth
    tied = logits == kth
    room = k.unsqueeze(1) - above.sum(dim=1, keepdim=True)
    return above | (tied & (tied.cumsum(dim=1) <= room))


def top_k(logits: torch.Tensor, k: Sequence[int]) -> torch.Tensor | None:
    """Keep the k best candidates of each row (llama.cpp ignores min_keep here).

    Returns ids [rows, w] covering the survivors (for the next samplers), or None.
    """
    k_tensor = torch.tensor(k, dtype=torch.long, device=logits.device).clamp(max=logits.shape[1])
    values, ids, kept, cut_tie = _topk_selection(logits, k_tensor)
    if bool(cut_tie.any()):
        keep_only(logits, best_k_mask(logits, k_tensor))
        return None
    logits.fill_(NEG_INF)
    rebuild(logits, ids, values, kept)
    return ids


def top_p(logits: torch.Tensor, p: Sequence[float], min_keep: Sequence[int], hint: Hint = NO_HINT) -> None:
    """Keep the shortest best-first prefix whose probability sum reaches p, and >= min_keep tokens."""
    p_column, min_keep_column = _column(p, logits), _column(min_keep, logits, torch.long)
    if hint.ids is None and resolve_width(logits, hint) > SMALL_WIDTH:
        _top_p_many_candidates(logits, p_column, min_keep_column)
        return
    values, ids = sorted_candidates(logits, hint)
    probs = torch.softmax(values, dim=1)
    stop = (probs.cumsum(dim=1) >= p_column) & (_counts(ids.shape[1], logits.device) >= min_keep_column)
    rebuild(logits, ids, values, _prefix_through_first(stop))


def _top_p_many_candidates(logits: torch.Tensor, p: torch.Tensor, min_keep: torch.Tensor) -> None:
    """top_p without sorting the vocabulary when the nucleus is found among the best 256 or 4096
    (llama.cpp's adaptive partial sort does the same)."""
    probs_full = torch.softmax(logits, dim=1)
    kept = torch.zeros_like(logits, dtype=torch.bool)
    pending = torch.arange(logits.shape[0], device=logits.device)
    for width in (256, SMALL_WIDTH, logits.shape[1]):
        rows = logits[pending]
        values, ids = sorted_candidates(rows, Hint(width=width))
        probs = probs_full[pending].gather(1, ids)
        stop = (probs.cumsum(dim=1) >= p[pending]) & (_counts(width, logits.device) >= min_keep[pending])
        first = torch.where(stop.any(dim=1), stop.int().argmax(dim=1), width - 1)
        # The prefix is exact unless its last logit ties with the window's last, cut by the window.
        exact = values.gather(1, first.unsqueeze(1)).squeeze(1) > values[:, -1]
        done = (stop.any(dim=1) & exact) | (width == logits.shape[1])
        prefix = torch.arange(width, device=logits.device).unsqueeze(0) <= first.unsqueeze(1)
        kept[pending[done]] = torch.zeros_like(rows[done], dtype=torch.bool).scatter_(1, ids[done], prefix[done])
        pending = pending[~done]
        if pending.numel() == 0:
            break
    keep_only(logits, kept)


def min_p(logits: torch.Tensor, p: Sequence[float], min_keep: Sequence[int], hint: Hint = NO_HINT) -> None:
    """Keep the tokens with probability >= p * (best probability), and at least min_keep tokens."""
    # logf(p) in float32, as llama.cpp compares logit >= max_logit + logf(p).
    log_p = _column([float(np.float32(math.log(np.float32(value)))) for value in p], logits)
    if hint.ids is not None or (hint.width is not None and hint.width <= SMALL_WIDTH):
        values, ids = sorted_candidates(logits, hint)
        counts = _counts(ids.shape[1], logits.device)
        kept = (values >= values[:, :1] + log_p) | (counts <= _column(min_keep, logits, torch.long))
        rebuild(logits, ids, values, kept)
        return
    kept = logits >= logits.amax(dim=1, keepdim=True) + log_p
    if max(min_keep) > 1:
        kept |= best_k_mask(logits, torch.tensor(min_keep, dtype=torch.long, device=logits.device))
    keep_only(logits, kept)


def typical(logits: torch.Tensor, p: Sequence[float], min_keep: Sequence[int], hint: Hint = NO_HINT) -> None:
    """Locally typical sampling: keep the tokens whose surprise is closest to the entropy until
    their probabilities sum to more than p (and at least min_keep tokens)."""
    values, ids = sorted_candidates(logits, hint)
    log_probs = torch.log_softmax(values, dim=1)
    probs = log_probs.exp()
    # llama.cpp adds 0 * log(0) = NaN for a -inf candidate, which makes every score NaN; -inf
    # candidates are simply left out of the entropy here.
    entropy = -torch.where(probs > 0, probs * log_probs, 0.0).sum(dim=1, keepdim=True)
    scores = (-log_probs - entropy).abs()
    by_score = torch.sort(scores, dim=1, stable=True).indices
    cumulative = probs.gather(1, by_score).cumsum(dim=1)
    counts = _counts(ids.shape[1], logits.device)
    stop = (cumulative > _column(p, logits)) & (counts >= _column(min_keep, logits, torch.long))
    kept = torch.zeros_like(stop).scatter_(1, by_score, _prefix_through_first(stop))
    rebuild(logits, ids, values, kept)


def top_n_sigma(logits: torch.Tensor, n: Sequence[float]) -> None:
    """Keep the logits >= max - n * std, std being the population std of the finite logits."""
    count = count_candidates(logits).unsqueeze(1)
    best = logits.amax(dim=1, keepdim=True)
    # Moments of logit - max (-inf entries as 0, left out by `count`): no large offset to cancel.
    shifted = torch.nan_to_num(logits - best, neginf=0.0)
    mean = shifted.sum(dim=1, keepdim=True) / count
    mean_square = torch.linalg.vecdot(shifted, shifted, dim=1).unsqueeze(1) / count
    variance = (mean_square - mean.square()).clamp(min=0.0)
    threshold = best - _column(n, logits) * variance.sqrt()
    remove(logits, logits < threshold)
