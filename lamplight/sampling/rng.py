"""Counter-based random numbers: one uniform per (seed, token index, choice index, purpose).

There is no generator state to share or advance, so a request draws the same numbers whatever
else runs in the batch, in whatever row, and after a restart from the same point.
"""

from __future__ import annotations

_MASK64 = (1 << 64) - 1
_GOLDEN_GAMMA = 0x9E3779B97F4A7C15

# What a uniform is for, so that XTC's coin and the token draw never reuse a number.
PURPOSE_DRAW = 0
PURPOSE_XTC = 1


def _splitmix64(value: int) -> int:
    z = (value + _GOLDEN_GAMMA) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def counter_uniform(seed: int, token_index: int, choice_index: int, purpose: int) -> float:
    """A uniform float64 in [0, 1), a pure function of its four arguments."""
    state = _splitmix64(seed & _MASK64)
    for counter in (token_index, choice_index, purpose):
        state = _splitmix64(state ^ (counter & _MASK64))
    return (state >> 11) * (1.0 / (1 << 53))
