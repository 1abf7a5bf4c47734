"""Token probabilities for `n_probs` (llama-server's completion_probabilities / logprobs)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

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


def raw_token_probs(logits: torch.Tensor, chosen: Sequence[int], n_probs: Sequence[int]) -> list[TokenProbs]:
    """Probabilities from raw logits [rows, vocab] (llama-server's get_token_probabilities)."""
    logits = logits.float()
    return _token_probs(torch.softmax(logits, dim=1), chosen, n_probs, post_sampling=False, rank_by=logits)


def final_token_probs(
    probs: torch.Tensor, chosen: Sequence[int], n_probs: Sequence[int], ids: torch.Tensor | None = None
) -> list[TokenProbs]:
    """Probabilities from the post-chain distribution: [rows, vocab], or [rows, w] over `ids`."""
    return _token_probs(probs, chosen, n_probs, post_sampling=True, ids=ids)


def _token_probs(
    probs: torch.Tensor,
    chosen: Sequence[int],
    n_probs: Sequence[int],
    post_sampling: bool,
    rank_by: torch.Tensor | None = None,
    ids: torch.Tensor | None = None,
) -> list[TokenProbs]:
    """`probs` columns are token ids, or `ids` [rows, w] (ascending) names them."""
    rank_by = probs if rank_by is None else rank_by
    _, top_columns = best_k_sorted(rank_by, max(n_probs))
    top_values = probs.gather(1, top_columns)
    top_ids = top_columns if ids is None else ids.gather(1, top_columns)
    chosen_values = _chosen_values(probs, chosen, ids)
    results = []
    rows = zip(chosen, n_probs, top_ids.tolist(), top_values.tolist(), top_values.log().tolist())
    for row, (token, wanted, row_ids, row_probs, row_logprobs) in enumerate(rows):
        top = [TokenProb(*entry) for entry in zip(row_ids[:wanted], row_probs[:wanted], row_logprobs[:wanted])]
        if post_sampling:
            top = _until_zero(top)
        probability = float(chosen_values[row])
        chosen_prob = TokenProb(token, probability, math.log(probability) if probability > 0 else -math.inf)
        results.append(TokenProbs(chosen_prob, top, post_sampling))
    return results


def _chosen_values(probs: torch.Tensor, chosen: Sequence[int], ids: torch.Tensor | None) -> list[float]:
    chosen_t = torch.tensor(list(chosen), device=probs.device).unsqueeze(1)
    if ids is None:
        return probs.gather(1, chosen_t).squeeze(1).tolist()
    return torch.where(ids == chosen_t, probs, 0.0).sum(dim=1).tolist()


def _until_zero(entries: list[TokenProb]) -> list[TokenProb]:
    for index, entry in enumerate(entries):
        if entry.prob == 0.0:
            return entries[:index]
    return entries
