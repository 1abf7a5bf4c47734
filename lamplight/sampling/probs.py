"""Token probabilities for `n_probs` (llama-server's completion_probabilities / logprobs)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .reductions import softmax, sum_rows
from .truncation import best_k_sorted


@dataclass(frozen=True)
class TokenProb:
    token_id: int
    prob: float
    logprob: float  # -inf where prob is 0 (llama-server writes the lowest float instead)


@dataclass(frozen=True)
class TokenProbs:
    """The chosen token's probability and the n_probs most likely tokens, best first.

    post_sampling False: softmax of the raw logits over the whole vocabulary, before any sampler,
    bias or grammar; `top` has n_probs entries ordered by logit. post_sampling True: the final
    distribution the token was drawn from; `top` ordered by probability, at most n_probs entries,
    stopping before the first zero.
    """

    chosen: TokenProb
    top: list[TokenProb]
    post_sampling: bool


def raw_token_probs(logits: np.ndarray, chosen: Sequence[int], n_probs: Sequence[int]) -> list[TokenProbs]:
    """Probabilities from raw logits [rows, vocab] (llama-server's get_token_probabilities)."""
    logits = np.ascontiguousarray(logits, dtype=np.float32)
    return _token_probs(softmax(logits, sum_rows), chosen, n_probs, post_sampling=False, rank_by=logits)


def final_token_probs(
    probs: np.ndarray, chosen: Sequence[int], n_probs: Sequence[int], ids: np.ndarray | None = None
) -> list[TokenProbs]:
    """Probabilities from the post-chain distribution: [rows, vocab], or [rows, w] over `ids`."""
    return _token_probs(probs, chosen, n_probs, post_sampling=True, ids=ids)


def _token_probs(
    probs: np.ndarray,
    chosen: Sequence[int],
    n_probs: Sequence[int],
    post_sampling: bool,
    rank_by: np.ndarray | None = None,
    ids: np.ndarray | None = None,
) -> list[TokenProbs]:
    """`probs` columns are token ids, or `ids` [rows, w] (ascending) names them."""
    rank_by = probs if rank_by is None else rank_by
    _, top_columns = best_k_sorted(rank_by, max(n_probs))
    top_values = np.take_along_axis(probs, top_columns, axis=1)
    top_ids = top_columns if ids is None else np.take_along_axis(ids, top_columns, axis=1)
    chosen_values = _chosen_values(probs, chosen, ids)
    results = []
    with np.errstate(divide="ignore"):  # log(0) = -inf, as documented on TokenProb
        top_logprobs = np.log(top_values)
    rows = zip(chosen, n_probs, top_ids.tolist(), top_values.tolist(), top_logprobs.tolist())
    for row, (token, wanted, row_ids, row_probs, row_logprobs) in enumerate(rows):
        top = [TokenProb(*entry) for entry in zip(row_ids[:wanted], row_probs[:wanted], row_logprobs[:wanted])]
        if post_sampling:
            top = _until_zero(top)
        probability = float(chosen_values[row])
        chosen_prob = TokenProb(token, probability, math.log(probability) if probability > 0 else -math.inf)
        results.append(TokenProbs(chosen_prob, top, post_sampling))
    return results


def _chosen_values(probs: np.ndarray, chosen: Sequence[int], ids: np.ndarray | None) -> list[float]:
    chosen_column = np.asarray(list(chosen), dtype=np.int64)[:, None]
    if ids is None:
        return np.take_along_axis(probs, chosen_column, axis=1)[:, 0].tolist()
    # One entry of the row's list at most is the chosen token: the sum is that entry (or 0).
    return np.where(ids == chosen_column, probs, np.float32(0.0)).sum(axis=1).tolist()


def _until_zero(entries: list[TokenProb]) -> list[TokenProb]:
    for index, entry in enumerate(entries):
        if entry.prob == 0.0:
            return entries[:index]
    return entries
