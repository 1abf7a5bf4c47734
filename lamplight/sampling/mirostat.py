"""Mirostat 1 and 2: truncate to keep the surprise of the drawn token near tau (bits), adapting
mu after every token (mu starts at 2 * tau; the update is in SequenceSampler)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from .truncation import best_k_mask, keep_only

MIROSTAT_M = 100  # llama-server's m: how many of the best tokens estimate the Zipf exponent


def mirostat_v2(logits: torch.Tensor, mu: Sequence[float]) -> None:
    """Keep the tokens whose surprise -log2(p) is at most mu (at least the best one)."""
    surprise = torch.log_softmax(logits, dim=1) * (-1.0 / math.log(2.0))
    kept = surprise <= torch.tensor(mu, dtype=torch.float32, device=logits.device).unsqueeze(1)
    kept.scatter_(1, logits.argmax(dim=1, keepdim=True), True)
    keep_only(logits, kept)


def mirostat_v1(logits: torch.Tensor, mu: Sequence[float]) -> None:
    """Estimate the Zipf exponent s from the best m probabilities, derive k from s and mu, keep top k."""
    device = logits.device
    n_vocab = logits.shape[1]
    m = min(MIROSTAT_M, n_vocab)
    best = torch.topk(torch.softmax(logits, dim=1), m, dim=1).values
    i = torch.arange(m - 1, device=device, dtype=torch.float32)
    t = torch.log((i + 2) / (i + 1)).unsqueeze(0)
    valid = best[:, 1:] > 0  # llama.cpp would take log(p / 0) for -inf candidates
    b = torch.where(valid, torch.log(best[:, :-1] / best[:, 1:]), 0.0)
    s_hat = (t * b).sum(dim=1) / torch.where(valid, t * t, 0.0).sum(dim=1)
    epsilon = s_hat - 1
    mu_t = torch.tensor(mu, dtype=torch.float32, device=device)
    k = ((epsilon * torch.pow(2.0, mu_t)) / (1 - torch.pow(float(n_vocab), -epsilon))) ** (1 / s_hat)
    k = torch.nan_to_num(k, nan=1.0, posinf=float(n_vocab), neginf=1.0).clamp(1, n_vocab).long()
    keep_only(logits, best_k_mask(logits, k))


def updated_mu(mu: float, tau: float, eta: float, chosen_probability: float) -> float:
    """mu - eta * (surprise - tau), in float32 like llama.cpp."""
    f32 = np.float32
    surprise = -np.log2(f32(chosen_probability)) if chosen_probability > 0 else f32(np.inf)
    return float(f32(mu) - f32(eta) * f32(f32(surprise) - f32(tau)))
