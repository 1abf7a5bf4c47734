"""A decoder-only transformer configured per architecture, computed as llama.cpp's graphs do.

The newer architectures (qwen2/3, mistral3, gemma2, olmo2, granite, phi3, qwen3moe, gpt-oss)
differ from llama in a handful of places each. What a layer *has* is read from its tensors
(biases, fused Q/K/V or gate/up, Q/K norms per head or over the projection, norms before or
after each branch, sinks, a router); what an architecture *does* with them and what the
tensors cannot tell (rope layout, activation, scales, softcaps, which layers slide) comes from
`DecoderOptions`, which each architecture's module fills from its GGUF keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..engine.kv_cache import KVCache
from ..gguf.file import GGUFError, GGUFFile
from .base import CausalLM, ModelConfig, WeightSource, read_common_config
from .batch import ForwardBatch
from .layers import LinearGroup, RMSNorm, Rotary, ScoreShaping, paged_attention
from .moe import MoEFeedForward, silu_glu
from .rope_scaling import RopeScaling, read_rope_scaling


@dataclass(frozen=True)
class MoEOptions:
    n_used: int
    gating: str = "softmax"  # or "softmax_selected" (see MoEFeedForward)
    normalize: bool = True
    activation: Callable = silu_glu


@dataclass(frozen=True)
class QueryTemperature:
    """llama 4 / Mistral 3 attention temperature: q *= 1 + scale * ln(floor((pos + offset) / length) + 1)."""

    scale: float
    length: int
    offset: float = 0.0

    def factors(self, positions: torch.Tensor) -> torch.Tensor:
        steps = torch.floor((positions.double() + self.offset) / self.length)
        return (torch.log(steps + 1.0) * self.scale + 1.0).float()


@dataclass(frozen=True)
class DecoderOptions:
    neox_rope: bool = True
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    scaled_rope_on_sliding: bool = True  # False: sliding layers rotate with the plain rope (OLMo 3)
    activation: Callable = silu_glu  # the dense FFN's gate/up combination
    embd_scale: float = 1.0
    residual_scale: float = 1.0  # branch outputs times this before the residual add (granite)
    logit_scale: float = 1.0  # logits divided by this (granite)
    final_softcap: float | None = None
    attn_softcap: float | None = None
    attn_scale: float | None = None  # None: 1 / sqrt(head_dim)
    sliding_layers: tuple[bool, ...] = ()  # per layer; empty: none
    window: int = 0
    ffn_norm_tensor: str = "ffn_norm.weight"  # gpt-oss calls its FFN input norm post_attention_norm
    query_temperature: QueryTemperature | None = None
    moe: MoEOptions | None = None


def _optional_norm(w: WeightSource, name: str, eps: float) -> RMSNorm | None:
    weight = w.optional_dense(name)
    return None if weight is None else RMSNorm(weight, eps)


class QKNorm(nn.Module):
    """RMSNorm of Q or K: per head (qwen3, weight of head_dim) or over the whole projection
    (olmo2, weight of heads * head_dim), told apart by the weight's length."""

    def __init__(self, weight: torch.Tensor, eps: float, head_dim: int):
        super().__init__()
        self.norm = RMSNorm(weight, eps)
        self.per_head = weight.numel() == head_dim

    def forward(self, x: torch.Tensor, n_heads: int) -> torch.Tensor:
        """x: [T, heads * head_dim] -> [T, heads, head_dim]."""
        if self.per_head:
            return self.norm(x.view(x.shape[0], n_heads, -1))
        return self.norm(x).view(x.shape[0], n_heads, -1)


class Attention(nn.Module):
    def __init__(self, w: WeightSource, p: str, cfg: ModelConfig, opts: DecoderOptions, rope: Rotary, sliding: bool):
        super().__init__()
        self.cfg, self.rope = cfg, rope
        self.sizes = [cfg.n_heads * cfg.head_dim_k, cfg.n_kv_heads * cfg.head_dim_k, cfg.n_kv_heads * cfg.head_dim_v]
        if w.has(p + "attn_qkv.weight"):  # phi3: one fused projection
            self.qkv = LinearGroup(w.linear(p + "attn_qkv.weight"))
            qkv_bias = w.optional_dense(p + "attn_qkv.bias")
        else:
            self.qkv = LinearGroup(*(w.linear(p + f"attn_{x}.weight") for x in "qkv"))
            qkv_bias = self._joint_bias(w, p, self.sizes)
        # Buffers (None where absent) so that .to(device) moves them with the model.
        self.register_buffer("qkv_bias", qkv_bias, persistent=False)
        if sum(self.qkv.sizes) != sum(self.sizes):
            raise GGUFError(f"{p}attn_q/k/v: {sum(self.qkv.sizes)} outputs, the head counts and sizes need {sum(self.sizes)}")
        self.wo = w.linear(p + "attn_output.weight")
        self.register_buffer("wo_bias", w.optional_dense(p + "attn_output.bias"), persistent=False)
        q_norm, k_norm = w.optional_dense(p + "attn_q_norm.weight"), w.optional_dense(p + "attn_k_norm.weight")
        self.q_norm = QKNorm(q_norm, cfg.rms_eps, cfg.head_dim_k) if q_norm is not None else None
        self.k_norm = QKNorm(k_norm, cfg.rms_eps, cfg.head_dim_k) if k_norm is not None else None
        self.window = opts.window if sliding else None
        self.scale = opts.attn_scale if opts.attn_scale else cfg.head_dim_k**-0.5
        self.register_buffer("sinks", w.optional_dense(p + "attn_sinks.weight"), persistent=False)
        self.softcap = opts.attn_softcap

    @property
    def shaping(self) -> ScoreShaping | None:
        if self.softcap or self.sinks is not None:
            return ScoreShaping(self.softcap, self.sinks)
        return None

    @staticmethod
    def _joint_bias(w: WeightSource, p: str, sizes: list[int]) -> torch.Tensor | None:
        """The Q, K and V biases side by side (zeros for a missing one), or None without any."""
        parts = [w.optional_dense(p + f"attn_{x}.bias") for x in "qkv"]
        if all(b is None for b in parts):
            return None
        return torch.cat([b if b is not None else torch.zeros(n) for b, n in zip(parts, sizes)])

    def _project(self, x: torch.Tensor, n_heads: int, norm: QKNorm | None) -> torch.Tensor:
        return norm(x, n_heads) if norm is not None else x.view(x.shape[0], n_heads, -1)

    def forward(self, x: torch.Tensor, layer: int, step: "Step") -> torch.Tensor:
        cfg = self.cfg
        qkv = self.qkv(x)
        if self.qkv_bias is not None:
            qkv = qkv + self.qkv_bias
        q, k, v = qkv.split(self.sizes, dim=-1)
        angles = step.angles[id(self.rope)]
        q = self.rope(self._project(q, cfg.n_heads, self.q_norm), angles)
        k = self.rope(self._project(k, cfg.n_kv_heads, self.k_norm), angles)
        if step.q_factors is not None:
            q = q * step.q_factors[:, None, None]
        v = v.reshape(-1, cfg.n_kv_heads, cfg.head_dim_v)
        out = self.wo(paged_attention(q, k, v, layer, step.kv, step.batch, self.scale, self.window, self.shaping))
        return out if self.wo_bias is None else out + self.wo_bias


class DenseFeedForward(nn.Module):
    def __init__(self, w: WeightSource, p: str, activation: Callable):
        super().__init__()
        if w.has(p + "ffn_gate.weight"):
            self.gate_up = LinearGroup(w.linear(p + "ffn_gate.weight"), w.linear(p + "ffn_up.weight"))
        else:  # phi3: ffn_up holds [gate; up], halves of its output
            self.gate_up = LinearGroup(w.linear(p + "ffn_up.weight"))
        self.down = w.linear(p + "ffn_down.weight")
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(self.activation(gate, up))


class Block(nn.Module):
    """One layer: optional norms before and after each branch, attention, dense or MoE FFN."""

    def __init__(self, w: WeightSource, i: int, cfg: ModelConfig, opts: DecoderOptions, rope: Rotary, sliding: bool):
        super().__init__()
        p = f"blk.{i}."
        eps = cfg.rms_eps
        self.attn_norm = _optional_norm(w, p + "attn_norm.weight", eps)
        self.attn = Attention(w, p, cfg, opts, rope, sliding)
        post_attn = p + "post_attention_norm.weight"
        self.post_attn_norm = None if opts.ffn_norm_tensor == "post_attention_norm.weight" else _optional_norm(w, post_attn, eps)
        self.ffn_norm = _optional_norm(w, p + opts.ffn_norm_tensor, eps)
        if opts.moe is not None and w.has(p + "ffn_gate_inp.weight"):
            m = opts.moe
            self.ffn = MoEFeedForward(w, p, m.n_used, m.gating, m.normalize, m.activation)
        else:
            self.ffn = DenseFeedForward(w, p, opts.activation)
        self.post_ffn_norm = _optional_norm(w, p + "post_ffw_norm.weight", eps)
        self.residual_scale = opts.residual_scale

    @staticmethod
    def _branch(norm: RMSNorm | None, x: torch.Tensor) -> torch.Tensor:
        return x if norm is None else norm(x)

    def forward(self, h: torch.Tensor, layer: int, step: "Step") -> torch.Tensor:
        attn = self._branch(self.post_attn_norm, self.attn(self._branch(self.attn_norm, h), layer, step))
        h = h + attn * self.residual_scale if self.residual_scale != 1.0 else h + attn
        ffn = self._branch(self.post_ffn_norm, self.ffn(self._branch(self.ffn_norm, h)))
        return h + ffn * self.residual_scale if self.residual_scale != 1.0 else h + ffn


@dataclass
class Step:
    """What every layer of one forward step shares."""

    batch: ForwardBatch
    kv: KVCache
    angles: dict[int, tuple]  # id(rope) -> its cos/sin at the batch's positions
    q_factors: torch.Tensor | None  # per row query temperature, or None


class Decoder(CausalLM):
    """The architecture-configurable decoder (see the module docstring)."""

    def __init__(self, gguf: GGUFFile):
        config = read_common_config(gguf)
        super().__init__(config)
        self.opts = opts = self.options(gguf, config)
        w = WeightSource(gguf)
        self._check_rope_factors(w, gguf)
        self.rope, self.rope_sliding = self._ropes(gguf, w, config, opts)
        sliding = opts.sliding_layers or (False,) * config.n_layers
        self.token_embd_info = w.info("token_embd.weight")
        self.blocks = nn.ModuleList(
            Block(w, i, config, opts, self.rope_sliding if sliding[i] else self.rope, sliding[i]) for i in range(config.n_layers)
        )
        self.output_norm = RMSNorm(w.dense("output_norm.weight"), config.rms_eps)
        self.output = w.linear("output.weight") if w.has("output.weight") else None
        self.register_buffer("output_bias", w.optional_dense("output.bias"), persistent=False)
        # The native forward reads `scale` before it refuses an architecture it does not know.
        self.scale = opts.attn_scale or config.head_dim_k**-0.5

    @staticmethod
    def options(gguf: GGUFFile, config: ModelConfig) -> DecoderOptions:
        """What this architecture does beyond its tensors (each architecture's module says)."""
        raise NotImplementedError

    @staticmethod
    def _check_rope_factors(w: WeightSource, gguf: GGUFFile) -> None:
        if w.has("rope_factors_long.weight") or w.has("rope_factors_short.weight"):
            raise GGUFError(
                f"{gguf.path}: LongRoPE (rope_factors_long/short, Phi-3.5 / Phi-4-mini style) is not supported; "
                "its factors depend on the serving context length"
            )

    @staticmethod
    def _ropes(gguf: GGUFFile, w: WeightSource, cfg: ModelConfig, opts: DecoderOptions) -> tuple[Rotary, Rotary]:
        n_rot = int(gguf.arch_value("rope.dimension_count", cfg.head_dim_k))
        base = float(gguf.arch_value("rope.freq_base", 10000.0))
        factors = w.optional_dense("rope_freqs.weight")
        rope = Rotary(n_rot, base, cfg.n_ctx_train, opts.neox_rope, factors, opts.rope_scaling)
        if opts.scaled_rope_on_sliding or not opts.rope_scaling.is_scaled:
            return rope, rope
        return rope, Rotary(n_rot, base, cfg.n_ctx_train, opts.neox_rope, factors)

    def rope_for_layer(self, layer: int) -> Rotary:
        return self.blocks[layer].attn.rope

    def head(self, h: torch.Tensor) -> torch.Tensor:
        logits = super().head(h)
        return logits if self.output_bias is None else logits + self.output_bias

    def compute(self, batch: ForwardBatch, kv: KVCache) -> torch.Tensor:
        opts = self.opts
        h = self.embed(batch)
        if opts.embd_scale != 1.0:
            h = h * opts.embd_scale
        ropes = {id(r): r for r in (self.rope, self.rope_sliding)}
        temperature = opts.query_temperature
        step = Step(batch, kv, {key: r.angles(batch.positions) for key, r in ropes.items()},
                    temperature.factors(batch.positions) if temperature else None)
        for i, blk in enumerate(self.blocks):
            h = blk(h, i, step)
        logits = self.head(self.output_norm(h[batch.logit_rows]))
        if opts.logit_scale != 1.0:
            logits = logits / opts.logit_scale
        if opts.final_softcap:
            logits = torch.tanh(logits / opts.final_softcap) * opts.final_softcap
        return logits


def sliding_pattern(gguf: GGUFFile, n_layers: int, period: int | None = None, default_period: int | None = None) -> tuple[bool, ...]:
    """Which layers use the sliding window, as llama.cpp decides: a fixed `period` for the
    architectures whose loader hard-codes one (gemma2, gpt-oss), else the file's
    attention.sliding_window_pattern (a bool per layer, or a period), else `default_period`.
    A period n makes layer il sliding when il % n < n - 1. None without a window."""
    if not gguf.arch_value("attention.sliding_window", 0):
        return ()
    pattern = period if period is not None else gguf.arch_value("attention.sliding_window_pattern", default_period)
    if pattern is None:
        return ()
    if isinstance(pattern, (int, float)) and not isinstance(pattern, bool):
        n = int(pattern)
        return tuple(il % n < n - 1 for il in range(n_layers))
    values = [bool(x) for x in pattern]
    if len(values) != n_layers:
        raise GGUFError(f"{gguf.path}: attention.sliding_window_pattern has {len(values)} entries for {n_layers} layers")
    return tuple(values)


def gelu_tanh_fp16_table(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """GeGLU as ggml's CPU computes it: GELU (tanh form) looked up in a table indexed by the
    input rounded to fp16 and holding fp16 results; identity above 10, zero below -10."""
    g = F.gelu(gate.half().float(), approximate="tanh").half().float()
    g = torch.where(gate >= 10.0, gate, torch.where(gate <= -10.0, torch.zeros_like(gate), g))
    return g * up


def read_rope(gguf: GGUFFile, config: ModelConfig, **kwargs) -> RopeScaling:
    return read_rope_scaling(gguf, config.n_ctx_train, **kwargs)


def scale_key(gguf: GGUFFile, key: str, default: float = 1.0) -> float:
    """A float hyperparameter where 0 (llama.cpp's 'unset') means the default."""
    value = float(gguf.arch_value(key, 0.0) or 0.0)
    return value if value != 0.0 else default


