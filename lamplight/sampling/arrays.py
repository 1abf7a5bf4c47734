"""What the sampler takes: numpy arrays. A torch tensor (a PyTorch runner's logits, a library
user's mask) is converted without importing torch, so the chain runs where torch is absent."""

from __future__ import annotations

from typing import Any

import numpy as np


def as_logits(logits: Any) -> np.ndarray:
    """A float array of `logits`: numpy passes through; a tensor (any float dtype, any device)
    comes back to the CPU as float32."""
    if hasattr(logits, "detach"):
        return logits.detach().float().cpu().numpy()
    return np.asarray(logits)


def as_mask(mask: Any) -> np.ndarray | None:
    """A bool array of `mask` (None stays None)."""
    if mask is None:
        return None
    if hasattr(mask, "detach"):
        mask = mask.detach().cpu().numpy()
    return np.asarray(mask, dtype=bool)
