"""RoPE tables: the cos and sin of every position's rotation angles, computed once per rope.

One numpy computation, read by both backends: lamplight.models.layers.Rotary wraps the tables
as tensors, the native forward (lamplight.native.runner) is handed them as they are. Angles are
computed in float64 and their cos and sin rounded once to float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .rope_scaling import RopeScaling


@dataclass(frozen=True)
class RopeTables:
    """cos and sin [max_pos, n_rot / 2] float32 of unit rotations, and the magnitude a scaled
    rope (YaRN) multiplies the rotated values by. The tables stay unit rotations so that
    rotating by a difference of positions (context shift) composes angles only."""

    cos: np.ndarray
    sin: np.ndarray
    magnitude: float = 1.0

    @classmethod
    def compute(cls, n_rot: int, base: float, max_pos: int, freq_factors=None,
                scaling: RopeScaling | None = None) -> "RopeTables":
        """The tables of pairs turning at base^(-2i / n_rot) / freq_factors[i] (any array-like of
        n_rot / 2 values, or None), with the scaling's frequencies and magnitude."""
        scaling = scaling or RopeScaling()
        inv_freq = scaling.inverse_frequencies(plain_inverse_frequencies(n_rot, base, freq_factors), n_rot, base)
        angles = np.arange(max_pos, dtype=np.float64)[:, None] * inv_freq[None, :]
        return cls(np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32), scaling.magnitude())

    def scaled(self) -> tuple[np.ndarray, np.ndarray]:
        """cos and sin with the magnitude folded in (float32 products, as the PyTorch path's
        `cos * magnitude`): what the native forward multiplies by."""
        if self.magnitude == 1.0:
            return self.cos, self.sin
        magnitude = np.float32(self.magnitude)
        return self.cos * magnitude, self.sin * magnitude


def plain_inverse_frequencies(n_rot: int, base: float, freq_factors=None) -> np.ndarray:
    """Each rotary pair's inverse frequency before scaling, float64 [n_rot / 2]."""
    inv_freq = 1.0 / (base ** (np.arange(0, n_rot, 2, dtype=np.float64) / n_rot))
    if freq_factors is not None:
        inv_freq = inv_freq / np.asarray(freq_factors, dtype=np.float64)
    return inv_freq
