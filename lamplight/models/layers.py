"""Building blocks of the PyTorch decoder: quantized linear, RMSNorm, RoPE, paged attention."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..gguf.file import TensorInfo
from ..gguf.quant import dequantize
from ..kernels.linear import DenseKernel
from ..state.kv import KVPool
from .batch import ForwardBatch
from .rope_scaling import RopeScaling
from .spec import LinearSpec, RopeSpec


class QuantLinear(nn.Module):
    """A linear layer whose weight comes from GGUF blocks.

    It keeps the GGUF tensor (raw blocks, memory-mapped, no copy) and computes with a *kernel*:
    the reference path is the dequantized float32 weight; `lamplight.runner.fast_path` swaps in
    packed or bf16 kernels without touching model code. LoRA adapters add on top of any kernel.
    """

    def __init__(self, info: TensorInfo):
        super().__init__()
        self.info = info
        self.name = info.name
        self.qtype = info.qtype
        self.raw = info.data
        self.out_features, self.in_features = info.shape
        self._kernel = None  # dequantized on first use: the native path never needs a float32 copy
        self.loras: list[tuple[int, torch.Tensor, torch.Tensor, float]] = []
        self.lora_scales = None  # lamplight.models.lora.LoraScales, shared by all layers

    @property
    def kernel(self):
        """What computes the layer on the PyTorch path: the float32 reference weight unless the
        fast path set another kernel."""
        if self._kernel is None:
            self._kernel = DenseKernel(dequantize(self.info), torch.float32)
        return self._kernel

    @kernel.setter
    def kernel(self, kernel) -> None:
        self._kernel = kernel

    @property
    def weight(self) -> torch.Tensor:
        """The float32 weight (dequantized again if the kernel does not hold it)."""
        if isinstance(self._kernel, DenseKernel) and self._kernel.dtype == torch.float32:
            return self._kernel.weight
        return dequantize(self.info)

    def add_lora(self, index: int, a: torch.Tensor, b: torch.Tensor, factor: float, scales) -> None:
        self.loras.append((index, a, b, factor))
        self.lora_scales = scales

    def add_lora_(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Add the active adapters' deltas to this layer's output `y` (in place) and return it."""
        for index, a, b, factor in self.loras:
            scale = self.lora_scales.scales[index] * factor
            if scale:
                y.add_(F.linear(F.linear(x, a), b), alpha=scale)
        return y

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.add_lora_(x, self.kernel(x))


class LinearGroup(nn.Module):
    """Several linears reading the same input (Q/K/V, gate/up): one fused matmul when possible,
    plus the joint bias of the spec, if any."""

    def __init__(self, spec: LinearSpec):
        super().__init__()
        self.members = nn.ModuleList(QuantLinear(info) for info in spec.weights)
        self.fused = None  # a kernel computing all members' outputs side by side
        self.sizes = spec.sizes
        # A buffer (None where absent) so that .to(device) moves it with the model.
        self.register_buffer("bias", spec.bias, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self._matmul(x)
        return y if self.bias is None else y + self.bias

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        """All members' outputs side by side: [..., sum of out_features]."""
        if self.fused is None:
            return torch.cat([m(x) for m in self.members], dim=-1)
        y = self.fused(x)
        if any(m.loras for m in self.members):
            for m, part in zip(self.members, y.split(self.sizes, dim=-1)):
                m.add_lora_(x, part)
        return y


class RMSNorm(nn.Module):
    def __init__(self, weight: torch.Tensor, eps: float):
        super().__init__()
        self.register_buffer("weight", weight, persistent=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Written out: F.rms_norm is a chain of about ten small ops on CPU, this is five.
        return x * torch.rsqrt(x.square().mean(-1, keepdim=True).add_(self.eps)) * self.weight


class Rotary(nn.Module):
    """Rotary position embedding in one of llama.cpp's two layouts.

    `neox=False` (llama.cpp's LLAMA_ROPE_TYPE_NORM, used for `llama` GGUFs, whose Q/K rows the
    converter permuted) rotates adjacent pairs (x0, x1), (x2, x3)...; `neox=True` rotates the two
    halves (x_i, x_{i+d/2}). Only the first `n_rot` dimensions rotate.
    """

    def __init__(self, n_rot: int, base: float, max_pos: int, neox: bool, freq_factors: torch.Tensor | None = None,
                 scaling: RopeScaling | None = None):
        super().__init__()
        self.n_rot = n_rot
        self.neox = neox
        inv_freq = 1.0 / (base ** (torch.arange(0, n_rot, 2, dtype=torch.float64) / n_rot))
        if freq_factors is not None:
            inv_freq = inv_freq / freq_factors.to(torch.float64)
        # Scaled ropes (YaRN, linear) change the frequencies and the rotated dims' magnitude; the
        # tables stay unit rotations so that rotate_by (context shift) composes angles only.
        scaling = scaling or RopeScaling()
        inv_freq = scaling.inverse_frequencies(inv_freq, n_rot, base)
        self.magnitude = scaling.magnitude()
        angles = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv_freq[None, :]
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    @classmethod
    def from_spec(cls, rope: RopeSpec) -> "Rotary":
        return cls(rope.n_rot, rope.base, rope.max_pos, rope.neox, rope.freq_factors, rope.scaling)

    def tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [max_pos, n_rot / 2] with the scaling's magnitude folded in."""
        if self.magnitude == 1.0:
            return self.cos, self.sin
        return self.cos * self.magnitude, self.sin * self.magnitude

    def angles(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """cos, sin and cos + i sin at `positions`, shaped to broadcast over heads: computed once
        per step and shared by every layer."""
        cos, sin = self.cos[positions][:, None, :], self.sin[positions][:, None, :]
        if self.magnitude != 1.0:
            cos, sin = cos * self.magnitude, sin * self.magnitude
        return cos, sin, torch.complex(cos, sin)

    def forward(self, x: torch.Tensor, angles: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """x: [T, heads, head_dim]; angles: `self.angles(positions)` for the T positions."""
        cos, sin, turn = angles
        if not self.neox and self.n_rot == x.shape[-1] and not torch.compiler.is_compiling():
            # Adjacent pairs are complex numbers: one complex product rotates them all (eagerly
            # the fewest ops; inductor generates no code for complex numbers, so not compiled).
            pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
            return torch.view_as_real(pairs * turn).flatten(-2)
        return self._rotate(x, cos, sin)

    def rotate_by(self, x: torch.Tensor, delta: int) -> torch.Tensor:
        """Move already-rotated keys by `delta` positions (rotations compose by adding angles)."""
        sign = 1.0 if delta >= 0 else -1.0
        return self._rotate(x, self.cos[abs(delta)], sign * self.sin[abs(delta)])

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        rot, rest = x[..., : self.n_rot], x[..., self.n_rot :]
        if self.neox:
            a, b = rot.chunk(2, dim=-1)
            rotated = torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)
        else:
            a, b = rot[..., 0::2], rot[..., 1::2]
            rotated = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)
        return torch.cat((rotated, rest), dim=-1) if rest.numel() else rotated


class ScoreShaping:
    """What some architectures do to attention scores beyond scale and mask, as llama.cpp does.

    `softcap`: scores become softcap * tanh(scores / softcap) before the mask (gemma2).
    `sinks`: one learned logit per query head joins every softmax and takes its share of the
    probability without contributing a value (gpt-oss's attention sinks).
    """

    def __init__(self, softcap: float | None = None, sinks: torch.Tensor | None = None):
        self.softcap = softcap or None
        self.sinks = sinks

    def cap(self, scores: torch.Tensor) -> torch.Tensor:
        return scores if self.softcap is None else torch.tanh(scores / self.softcap) * self.softcap

    def softmax(self, scores: torch.Tensor, sinks: torch.Tensor | None) -> torch.Tensor:
        """Softmax over the last dim; `sinks` (broadcast to scores[..., :1]) as an extra column."""
        if sinks is None:
            return torch.softmax(scores, dim=-1)
        sinks = sinks.to(scores.dtype).expand(*scores.shape[:-1], 1)
        return torch.softmax(torch.cat((scores, sinks), dim=-1), dim=-1)[..., :-1]


def _decode_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor, scale: float,
                      shaping: ScoreShaping | None = None) -> torch.Tensor:
    """Attention for one query per sequence, as two batched matmuls over (KV head, sequence).

    Every operand is contiguous in one fixed layout and padding keys (aligned, biased to -inf)
    leave each row's result bit-identical whatever else is in the batch: SDPA's kernels, and
    matmuls on strided views, sum rows in an order that depends on the batch size.

    q: [B, H, D]; keys, values: [Hkv, B, C, D] (as gathered); bias: [Hkv * B, H / Hkv, C].
    Returns [B, H * Dv].
    """
    b, n_heads, d = q.shape
    n_kv, _, c, dv = values.shape
    grouped = q.view(b, n_kv, n_heads // n_kv, d).transpose(0, 1).reshape(n_kv * b, -1, d)
    keys_t = keys.view(n_kv * b, c, d).transpose(1, 2)
    if shaping is None:
        probs = torch.softmax(torch.baddbmm(bias, grouped, keys_t, alpha=scale), dim=-1)
    else:
        scores = shaping.cap(torch.bmm(grouped, keys_t) * scale) + bias
        sinks = None
        if shaping.sinks is not None:  # per query head -> this layout's (KV head, sequence, group) rows
            sinks = shaping.sinks.view(n_kv, 1, -1, 1).expand(n_kv, b, n_heads // n_kv, 1).reshape(n_kv * b, -1, 1)
        probs = shaping.softmax(scores, sinks)
    out = torch.bmm(probs, values.view(n_kv * b, c, dv))  # [Hkv * B, G, Dv]
    return out.view(n_kv, b, -1, dv).transpose(0, 1).reshape(b, n_heads * dv)


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layer: int,
    kv: KVPool,
    batch: ForwardBatch,
    scale: float,
    window: int | None = None,
    shaping: ScoreShaping | None = None,
) -> torch.Tensor:
    """Store this step's K/V in the pool, then attend every group of queries to its keys.

    q: [T, n_heads, head_dim_k]; k: [T, n_kv_heads, head_dim_k]; v: [T, n_kv_heads, head_dim_v].
    Returns [T, n_heads * head_dim_v].
    """
    kv.write(layer, batch.kv_write_slots, k, v)
    n_tokens, n_heads, _ = q.shape
    n_kv, dv = v.shape[1], v.shape[-1]
    out = None
    for group in batch.groups:
        keys, values = kv.gather(layer, group.kv_index)  # [Hkv, B, C, D]
        keys, values = keys.to(q.dtype), values.to(q.dtype)
        b = keys.shape[1]
        if group.is_decode and group.leading_rows and b == n_tokens:
            return _decode_attention(q, keys, values, group.decode_bias(window, n_kv, n_heads // n_kv), scale, shaping)
        if out is None:
            out = q.new_empty(n_tokens, n_heads * dv)
        if group.is_decode:
            bias = group.decode_bias(window, n_kv, n_heads // n_kv)
            rows = slice(0, b) if group.leading_rows else group.query_rows[:, 0]
            out[rows] = _decode_attention(q[group.query_rows[:, 0]], keys, values, bias, scale, shaping)
            continue
        mask = group.mask if window is None else group.window_mask(window)
        gq = q[group.query_rows].transpose(1, 2)  # [B, H, Q, D]
        if shaping is None:
            attn = F.scaled_dot_product_attention(
                gq, keys.transpose(0, 1), values.transpose(0, 1), attn_mask=mask, scale=scale, enable_gqa=True
            )
        else:
            attn = _shaped_attention(gq, keys.transpose(0, 1), values.transpose(0, 1), mask, scale, shaping)
        attn = attn.transpose(1, 2).reshape(b, -1, n_heads * dv)  # [B, Q, H * Dv]
        valid = group.query_valid
        out[group.query_rows[valid]] = attn[valid]
    return out


def _shaped_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, scale: float,
                      shaping: ScoreShaping) -> torch.Tensor:
    """Prompt attention written out (SDPA has no softcap or sinks).

    q: [B, H, Q, D]; keys, values: [B, Hkv, C, D]; mask: [B, 1, Q, C]. Returns [B, H, Q, Dv].
    """
    group = q.shape[1] // keys.shape[1]
    keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
    scores = shaping.cap(torch.matmul(q, keys.transpose(-1, -2)) * scale).masked_fill(~mask, float("-inf"))
    sinks = None if shaping.sinks is None else shaping.sinks.view(1, -1, 1, 1)
    return torch.matmul(shaping.softmax(scores, sinks), values)


@torch.inference_mode()
def shift_kv(kv: KVPool, layer_ropes: list[Rotary], src: torch.Tensor, dst: torch.Tensor, delta: int) -> None:
    """Move cached K/V entries from pool indices `src` to `dst`, re-rotating each layer's keys by
    `delta` positions with that layer's rope (context shift), so nothing has to be recomputed."""
    for layer, rope in enumerate(layer_ropes):
        k, v = kv.read(layer, src)
        kv.write(layer, dst, rope.rotate_by(k.float(), delta), v)
