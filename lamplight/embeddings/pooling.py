"""Pooling the final hidden states of one input, and normalising the pooled vector, as llama.cpp
does (llama_pooling_type, common_embd_normalize). Imports no torch: `pool` reads a tensor through
its methods only, so the server's API layer reads the pooling names without torch."""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch


class Pooling(str, Enum):
    NONE = "none"  # one vector per token, never normalised
    MEAN = "mean"  # the average over every position, specials included
    CLS = "cls"  # position 0 ([CLS], or the first token such as BOS)
    LAST = "last"  # the final position (Qwen3-Embedding's appended EOS)
    RANK = "rank"  # a classification head on one position: a relevance score

    @classmethod
    def from_gguf_value(cls, value: int | None) -> "Pooling":
        """`{arch}.pooling_type`: 0 none, 1 mean, 2 cls, 3 last, 4 rank (absent: none)."""
        order = (cls.NONE, cls.MEAN, cls.CLS, cls.LAST, cls.RANK)
        if value is None:
            return cls.NONE
        if not isinstance(value, int) or not 0 <= value < len(order):
            raise ValueError(f"pooling_type {value!r} is not one of 0-4 (none, mean, cls, last, rank)")
        return order[value]

    @classmethod
    def parse(cls, name: str) -> "Pooling":
        try:
            return cls(name)
        except ValueError:
            names = ", ".join(p.value for p in cls)
            raise ValueError(f"unknown pooling {name!r} (use one of {names})") from None


def pool(hidden: torch.Tensor, pooling: Pooling, causal: bool) -> torch.Tensor:
    """One input's hidden states [n, d] pooled to [d] (or kept [n, d] for NONE). RANK takes the
    position its head reads: the first for encoders, the last for causal decoders."""
    if pooling is Pooling.NONE:
        return hidden
    if pooling is Pooling.MEAN:
        return hidden.mean(dim=0)
    if pooling is Pooling.CLS or (pooling is Pooling.RANK and not causal):
        return hidden[0]
    return hidden[-1]


def normalize(vector: np.ndarray, p: int) -> np.ndarray:
    """common_embd_normalize: -1 none; 0 scaled so that max |x| is 32760 (int16 range, still
    floats); 1 taxicab; 2 euclidean; p > 2 the p-norm. The divisor is summed in double and
    applied as a float; a zero divisor gives zeros."""
    x = np.asarray(vector, dtype=np.float32)
    if p == -1:
        return x.copy()
    if p == 0:
        divisor = float(np.abs(x).max(initial=0.0)) / 32760.0
    elif p == 2:
        divisor = float(np.sqrt(np.sum((x * x).astype(np.float64))))  # float products, double sum
    else:
        if p < 0:
            raise ValueError(f"embd_normalize {p} is not -1, 0, 1, 2 or a p-norm above 2")
        divisor = float(np.sum(np.abs(x.astype(np.float64)) ** p) ** (1.0 / p))
    scale = np.float32(1.0 / divisor) if divisor > 0.0 else np.float32(0.0)
    return x * scale
