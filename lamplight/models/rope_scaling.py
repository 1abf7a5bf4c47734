"""RoPE frequency scaling read from a GGUF file, with llama.cpp's semantics (ggml's rope_yarn).

llama.cpp computes, for rotary pair i of n_rot dimensions at position p:

    theta_extrap = p * base^(-2i / n_rot) / freq_factor_i
    theta_interp = freq_scale * theta_extrap
    linear:  theta = theta_interp,                               magnitude attn_factor
    YaRN:    theta = mix(theta_interp, theta_extrap, ramp_i),    magnitude attn_factor * (1 + 0.1 ln(1/freq_scale))

where ramp_i is 1 for the fast-turning pairs below the "corr dims" (kept as they are) and 0
for the slow ones above them (interpolated). Everything but p is a per-pair constant, so a
scaled rope is a plain rope with other inverse frequencies and a magnitude.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ..gguf.file import GGUFError, GGUFFile

# llama.cpp's defaults for the YaRN correction range (llama_hparams.yarn_beta_fast/slow).
DEFAULT_BETA_FAST = 32.0
DEFAULT_BETA_SLOW = 1.0


@dataclass(frozen=True)
class RopeScaling:
    """How to scale rope frequencies: kind 'none', 'linear' or 'yarn'."""

    kind: str = "none"
    freq_scale: float = 1.0  # 1 / rope.scaling.factor
    n_ctx_orig: int = 0  # rope.scaling.original_context_length (YaRN's correction range)
    beta_fast: float = DEFAULT_BETA_FAST
    beta_slow: float = DEFAULT_BETA_SLOW
    ext_factor: float = 0.0  # how much of YaRN's ramp applies (1 for YaRN, 0 otherwise)
    attn_factor: float = 1.0  # magnitude llama.cpp passes to ggml_rope_ext

    @property
    def is_scaled(self) -> bool:
        return self.kind != "none" and (self.freq_scale != 1.0 or self.ext_factor != 0.0)

    def plain(self) -> "RopeScaling":
        """The same file's rope without scaling (OLMo 3's sliding-window layers)."""
        return RopeScaling()

    def with_attn_factor(self, attn_factor: float) -> "RopeScaling":
        return replace(self, attn_factor=attn_factor)

    def magnitude(self) -> float:
        """What ggml multiplies cos and sin by: YaRN adds 1 + 0.1 ln(1/freq_scale)."""
        if self.ext_factor != 0.0:
            return self.attn_factor * (1.0 + 0.1 * math.log(1.0 / self.freq_scale))
        return self.attn_factor

    def inverse_frequencies(self, inv_freq: np.ndarray, n_rot: int, base: float) -> np.ndarray:
        """Scale the plain per-pair inverse frequencies `inv_freq` (float64, n_rot / 2)."""
        if self.kind == "none":
            return inv_freq
        interp = inv_freq * self.freq_scale
        if self.ext_factor == 0.0:
            return interp
        mix = yarn_ramp(n_rot, self.n_ctx_orig, base, self.beta_fast, self.beta_slow) * self.ext_factor
        return interp * (1 - mix) + inv_freq * mix


def yarn_corr_dims(n_rot: int, n_ctx_orig: int, base: float, beta_fast: float, beta_slow: float) -> tuple[float, float]:
    """ggml_rope_yarn_corr_dims: the pair range over which YaRN blends (floored/ceiled, clamped)."""

    def corr_dim(n_turns: float) -> float:
        return n_rot * math.log(n_ctx_orig / (n_turns * 2 * math.pi)) / (2 * math.log(base))

    start = math.floor(corr_dim(beta_fast))
    end = math.ceil(corr_dim(beta_slow))
    return float(max(0, start)), float(min(n_rot - 1, end))


def yarn_ramp(n_rot: int, n_ctx_orig: int, base: float, beta_fast: float, beta_slow: float) -> np.ndarray:
    """rope_yarn_ramp per rotary pair (float64): 1 keeps the pair's frequency, 0 interpolates it."""
    low, high = yarn_corr_dims(n_rot, n_ctx_orig, base, beta_fast, beta_slow)
    pair = np.arange(n_rot // 2, dtype=np.float64)
    y = (pair - low) / max(0.001, high - low)
    return 1 - np.clip(y, 0, 1)


def read_rope_scaling(gguf: GGUFFile, n_ctx_train: int, yarn_log_multiplier: bool = True) -> RopeScaling:
    """The file's rope.scaling.* keys as llama.cpp reads them (llama_model::load_hparams and
    llama_context's yarn_ext_factor default).

    `yarn_log_multiplier`: whether rope.scaling.yarn_log_multiplier sets the attention factor
    as llama.cpp's generic loader does (get_mscale(f, 1) / get_mscale(f, log_mul)).
    """
    kind = str(gguf.arch_value("rope.scaling.type", "linear"))
    factor = float(gguf.arch_value("rope.scaling.factor", 0.0) or gguf.arch_value("rope.scale_linear", 0.0) or 0.0)
    freq_scale = 1.0 if factor == 0.0 else 1.0 / factor
    if kind == "none" or (kind == "linear" and freq_scale == 1.0):
        return RopeScaling()
    if kind not in ("linear", "yarn"):
        raise GGUFError(f"{gguf.path}: rope scaling {kind!r} is not supported (supported: none, linear, yarn)")
    if kind == "linear":
        return RopeScaling("linear", freq_scale, attn_factor=float(gguf.arch_value("rope.scaling.attn_factor", 1.0)))
    attn_factor = 1.0
    log_mul = float(gguf.arch_value("rope.scaling.yarn_log_multiplier", 0.0))
    if yarn_log_multiplier and log_mul != 0.0:
        attn_factor = _get_mscale(1.0 / freq_scale, 1.0) / _get_mscale(1.0 / freq_scale, log_mul)
    attn_factor = float(gguf.arch_value("rope.scaling.yarn_attn_factor", attn_factor))
    return RopeScaling(
        "yarn",
        freq_scale,
        n_ctx_orig=int(gguf.arch_value("rope.scaling.original_context_length", 0) or n_ctx_train),
        beta_fast=float(gguf.arch_value("rope.scaling.yarn_beta_fast", DEFAULT_BETA_FAST)),
        beta_slow=float(gguf.arch_value("rope.scaling.yarn_beta_slow", DEFAULT_BETA_SLOW)),
        ext_factor=float(gguf.arch_value("rope.scaling.yarn_ext_factor", 1.0)),
        attn_factor=attn_factor,
    )


def _get_mscale(scale: float, mscale: float) -> float:
    return 1.0 if scale <= 1.0 else 0.1 * mscale * math.log(scale) + 1.0
