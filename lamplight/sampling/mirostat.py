"""Mirostat 1 and 2: truncate to keep the surprise of the drawn token near tau (bits), adapting
mu after every token (mu starts at 2 * tau; the update is in SequenceSampler)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .reductions import log_softmax, softmax, sum_rows
from .truncation import best_k_mask, best_k_sorted, keep_only

MIROSTAT_M = 100  # llama-server's m: how many of the best tokens estimate the Zipf exponent


def mirostat_v2(logits: np.ndarray, mu: Sequence[float]) -> None:
    """Keep the tokens whose surprise -log2(p) is at most mu (at least the best one)."""
    surprise = log_softmax(logits, sum_rows) * np.float32(-1.0 / math.log(2.0))
    kept = surprise <= np.asarray(mu, dtype=np.float32)[:, None]
    np.put_along_axis(kept, logits.argmax(axis=1)[:, None], True, axis=1)
    keep_only(logits, kept)


def mirostat_v1(logits: np.ndarray, mu: Sequence[float]) -> None:
    """Estimate the Zipf exponent s from the best m probabilities, derive k from s and mu, keep top k."""
    n_vocab = logits.shape[1]
    m = min(MIROSTAT_M, n_vocab)
    best, _ = best_k_sorted(softmax(logits, sum_rows), m)
    i = np.arange(m - 1, dtype=np.float32)
    t = np.log((i + 2) / (i + 1))[None, :]
    valid = best[:, 1:] > 0  # llama.cpp would take log(p / 0) for -inf candidates
    b = np.where(valid, np.log(best[:, :-1] / best[:, 1:]), np.float32(0.0))
    # Sums over m - 1 entries whatever the batch: numpy's pairwise sum is reproducible here.
    s_hat = sum_rows(t * b) / sum_rows(np.where(valid, t * t, np.float32(0.0)))
    epsilon = s_hat - 1
    mu_t = np.asarray(mu, dtype=np.float32)
    k = ((epsilon * np.power(np.float32(2.0), mu_t)) / (1 - np.power(np.float32(n_vocab), -epsilon))) ** (1 / s_hat)
    k = np.clip(np.nan_to_num(k, nan=1.0, posinf=float(n_vocab), neginf=1.0), 1, n_vocab).astype(np.int64)
    keep_only(logits, best_k_mask(logits, k))


def updated_mu(mu: float, tau: float, eta: float, chosen_probability: float) -> float:
    """mu - eta * (surprise - tau), in float32 like llama.cpp."""
    f32 = np.float32
    surprise = -np.log2(f32(chosen_probability)) if chosen_probability > 0 else f32(np.inf)
    return float(f32(mu) - f32(eta) * f32(f32(surprise) - f32(tau)))
