"""XTC ("exclude top choices"): with some probability per token, remove every candidate whose
probability reaches the threshold except the least likely of them."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .truncation import NEG_INF, NO_HINT, SMALL_WIDTH, Hint, best_k_mask, rebuild, remove, resolve_width, sorted_candidates


def xtc(logits: torch.Tensor, threshold: Sequence[float], min_keep: Sequence[int], hint: Hint = NO_HINT) -> None:
    """Apply XTC in place to rows whose coin already came up (see SequenceSampler.xtc_triggered)."""
    device = logits.device
    threshold_column = torch.tensor(threshold, dtype=torch.float32, device=device).unsqueeze(1)
    min_keep_t = torch.tensor(min_keep, device=device)
    if hint.ids is not None or resolve_width(logits, hint) <= SMALL_WIDTH:
        values, ids = sorted_candidates(logits, hint)
        n_remove = _removed_count(torch.softmax(values, dim=1), values > NEG_INF, threshold_column, min_keep_t)
        positions = torch.arange(ids.shape[1], device=device).unsqueeze(0)
        rebuild(logits, ids, values, positions >= n_remove.unsqueeze(1))
        return
    n_remove = _removed_count(torch.softmax(logits, dim=1), logits > NEG_INF, threshold_column, min_keep_t)
    # The candidates above the threshold are exactly the best ones.
    remove(logits, best_k_mask(logits, n_remove))


def _removed_count(
    probs: torch.Tensor, finite: torch.Tensor, threshold: torch.Tensor, min_keep: torch.Tensor
) -> torch.Tensor:
    """All tokens at or above the threshold but the least likely go, if min_keep tokens remain."""
    above = (probs >= threshold).sum(dim=1)
    n_remove = above - 1
    allowed = (above >= 2) & (finite.sum(dim=1) - n_remove >= min_keep)
    return torch.where(allowed, n_remove, 0)
