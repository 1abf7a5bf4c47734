"""Temperature: plain scaling, greedy (temperature <= 0) and dynamic temperature (llama.cpp's temp_ext)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .truncation import NEG_INF, NO_HINT, SMALL_WIDTH, Hint, rebuild, resolve_width, sorted_candidates


def greedy(logits: torch.Tensor, hint: Hint = NO_HINT) -> None:
    """Keep only each row's best logit (the lowest id among equal ones)."""
    if hint.ids is None:
        best = logits.argmax(dim=1, keepdim=True)  # the first maximum
        value = logits.gather(1, best)
        logits.fill_(NEG_INF).scatter_(1, best, value)
        return
    ids = torch.sort(hint.ids, dim=1).values
    values = logits.gather(1, ids)
    best = values.argmax(dim=1, keepdim=True)
    rebuild(logits, ids, values, torch.arange(ids.shape[1], device=logits.device).unsqueeze(0) == best)


def scale(logits: torch.Tensor, temperature: Sequence[float], hint: Hint = NO_HINT) -> None:
    t = torch.tensor(temperature, dtype=torch.float32, device=logits.device).unsqueeze(1)
    if hint.ids is None:
        logits.div_(t)
    else:
        logits.scatter_(1, hint.ids, logits.gather(1, hint.ids) / t)


def dynamic_temperature(
    logits: torch.Tensor,
    temperature: Sequence[float],
    spread: Sequence[float],
    exponent: Sequence[float],
    hint: Hint = NO_HINT,
) -> None:
    """llama.cpp's temp_ext: divide by t = min_t + (max_t - min_t) * (H / log n) ** exponent, where
    H is the entropy of the current candidates and n their number, min_t = max(0, T - spread) and
    max_t = T + spread. t <= 0 is greedy; rows with fewer than 2 candidates are left alone."""
    if hint.ids is not None or resolve_width(logits, hint) <= SMALL_WIDTH:
        values, ids = sorted_candidates(logits, hint)
        t = _dynamic_temperatures(values, temperature, spread, exponent)
        # Sorted best first, so greedy keeps position 0 (the lowest id among equal maxima).
        dropped = (t <= 0).unsqueeze(1) & (torch.arange(ids.shape[1], device=logits.device) > 0).unsqueeze(0)
        rebuild(logits, ids, values / torch.where(t > 0, t, 1.0).unsqueeze(1), ~dropped)
        return
    t = _dynamic_temperatures(logits, temperature, spread, exponent)
    cold = t <= 0
    if bool(cold.any()):
        rows = cold.nonzero().squeeze(1)
        sub = logits[rows]
        greedy(sub)
        logits[rows] = sub
    logits.div_(torch.where(t > 0, t, 1.0).unsqueeze(1))


def _dynamic_temperatures(
    logits: torch.Tensor, temperature: Sequence[float], spread: Sequence[float], exponent: Sequence[float]
) -> torch.Tensor:
    """Each row's dynamic temperature; NaN for rows with fewer than 2 candidates."""
    device = logits.device
    log_probs = torch.log_softmax(logits, dim=1)
    entropy = -torch.where(log_probs > NEG_INF, log_probs.exp() * log_probs, 0.0).sum(dim=1)
    n_candidates = (logits > NEG_INF).sum(dim=1)
    # llama.cpp's log n counts -inf entries still in its array; only real candidates count here.
    normalized = entropy / n_candidates.float().log()
    t = torch.tensor(temperature, dtype=torch.float32, device=device)
    d = torch.tensor(spread, dtype=torch.float32, device=device)
    low = (t - d).clamp(min=0.0)
    high = t + d
    dynamic = low + (high - low) * normalized.pow(torch.tensor(exponent, dtype=torch.float32, device=device))
    return torch.where(n_candidates > 1, dynamic, torch.nan)
