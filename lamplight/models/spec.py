"""The model definition: every weight of a decoder by its role, read once from the GGUF file.

Each backend builds itself from this record (lamplight.runner: the PyTorch modules of
lamplight.models.decoder; lamplight.native: the C++ forward's description), so no backend reads
another one's internals. Large matrices stay `TensorInfo`s (raw GGUF blocks, memory-mapped, no
copy); norms, biases and other small vectors are float32 tensors.

What a layer *has* comes from its tensors (biases, a fused Q/K/V or gate/up, Q/K norms per
head or over the whole projection, norms before or after each branch, sinks, a router); what it
*does* with them comes from the architecture's `DecoderOptions` (lamplight.models.options).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..gguf.file import GGUFError, GGUFFile, TensorInfo
from ..gguf.quant import dequantize
from .config import ModelConfig
from .options import DecoderOptions
from .rope_scaling import RopeScaling


@dataclass(frozen=True)
class LinearSpec:
    """Weights reading the same input, their outputs side by side (Q/K/V, gate/up), and the
    joint bias (zeros where one member has none), or None."""

    weights: tuple[TensorInfo, ...]
    bias: torch.Tensor | None = None

    @property
    def sizes(self) -> list[int]:
        return [w.shape[0] for w in self.weights]

    @property
    def out_features(self) -> int:
        return sum(self.sizes)

    @property
    def in_features(self) -> int:
        return self.weights[0].shape[1]


@dataclass(frozen=True)
class AttentionSpec:
    qkv: LinearSpec  # outputs: Q | K | V
    wo: LinearSpec
    q_norm: torch.Tensor | None  # RMSNorm weight: per head [head_dim] or over the projection
    k_norm: torch.Tensor | None
    sinks: torch.Tensor | None  # one attention-sink logit per query head (gpt-oss)
    rope: int  # index into DecoderSpec.ropes
    window: int | None  # sliding window in tokens, None: full attention


@dataclass(frozen=True)
class FeedForwardSpec:
    gate_up: LinearSpec  # outputs: gate | up
    down: LinearSpec
    activation: str  # lamplight.models.activations.ACTIVATIONS


@dataclass(frozen=True)
class ExpertsSpec:
    """A mixture of experts (llama.cpp's build_moe_ffn): 3-D expert tensors [n_expert, out, in]."""

    router: TensorInfo
    router_bias: torch.Tensor | None
    gate: TensorInfo
    up: TensorInfo
    down: TensorInfo
    gate_bias: torch.Tensor | None  # [n_expert, out] each, or None
    up_bias: torch.Tensor | None
    down_bias: torch.Tensor | None
    n_used: int
    gating: str  # "softmax" or "softmax_selected"
    normalize: bool
    activation: str

    @property
    def n_expert(self) -> int:
        return self.gate.shape[0]


@dataclass(frozen=True)
class LayerSpec:
    attn_norm: torch.Tensor | None  # None: the branch reads the residual stream as it is (olmo2)
    attn: AttentionSpec
    post_attn_norm: torch.Tensor | None
    ffn_norm: torch.Tensor | None
    ffn: FeedForwardSpec | ExpertsSpec
    post_ffn_norm: torch.Tensor | None


@dataclass(frozen=True)
class RopeSpec:
    """One rotary embedding: llama.cpp's NORM layout (adjacent pairs) or NEOX (halves), over the
    first n_rot dimensions, with optional per-pair frequency factors and scaling."""

    n_rot: int
    base: float
    max_pos: int
    neox: bool
    freq_factors: torch.Tensor | None = None
    scaling: RopeScaling = RopeScaling()


@dataclass(frozen=True)
class DecoderSpec:
    config: ModelConfig
    options: DecoderOptions
    token_embd: TensorInfo
    layers: tuple[LayerSpec, ...]
    output_norm: torch.Tensor
    output: LinearSpec | None  # None: the head is the token embedding (tied)
    output_bias: torch.Tensor | None
    ropes: tuple[RopeSpec, ...]  # the layers' rotations (AttentionSpec.rope indexes them)
    attn_scale: float

    def linear_weights(self) -> dict[str, TensorInfo]:
        """Every 2-D weight a linear layer computes with, by GGUF name (what LoRA adapters name)."""
        linears = [self.output] if self.output is not None else []
        for layer in self.layers:
            linears += [layer.attn.qkv, layer.attn.wo]
            ffn = layer.ffn
            linears += [ffn.gate_up, ffn.down] if isinstance(ffn, FeedForwardSpec) else []
        named = {w.name: w for lin in linears for w in lin.weights}
        for layer in self.layers:
            if isinstance(layer.ffn, ExpertsSpec):
                named[layer.ffn.router.name] = layer.ffn.router
        return named


class WeightSource:
    """Takes tensors out of a GGUF file by name, with clear errors for missing ones."""

    def __init__(self, gguf: GGUFFile):
        self.gguf = gguf

    def has(self, name: str) -> bool:
        return name in self.gguf.tensors

    def info(self, name: str) -> TensorInfo:
        info = self.gguf.tensors.get(name)
        if info is None:
            raise GGUFError(f"{self.gguf.path}: tensor {name} is missing")
        return info

    def dense(self, name: str) -> torch.Tensor:
        return dequantize(self.info(name))

    def optional_dense(self, name: str) -> torch.Tensor | None:
        """A norm, bias or other small tensor that only some files (or architectures) have."""
        return self.dense(name) if self.has(name) else None

    def linear(self, *names: str, bias: torch.Tensor | None = None) -> LinearSpec:
        return LinearSpec(tuple(self.info(n) for n in names), bias)


def read_decoder_spec(gguf: GGUFFile, config: ModelConfig, opts: DecoderOptions) -> DecoderSpec:
    w = WeightSource(gguf)
    _refuse_long_rope(w, gguf)
    ropes = _ropes(gguf, w, config, opts)
    sliding = opts.sliding_layers or (False,) * config.n_layers
    layers = tuple(_layer(w, i, config, opts, sliding[i], rope=len(ropes) - 1 if sliding[i] else 0)
                   for i in range(config.n_layers))
    return DecoderSpec(
        config=config,
        options=opts,
        token_embd=w.info("token_embd.weight"),
        layers=layers,
        output_norm=w.dense("output_norm.weight"),
        output=w.linear("output.weight") if w.has("output.weight") else None,
        output_bias=w.optional_dense("output.bias"),
        ropes=ropes,
        attn_scale=opts.attn_scale or config.head_dim_k**-0.5,
    )


def _refuse_long_rope(w: WeightSource, gguf: GGUFFile) -> None:
    if w.has("rope_factors_long.weight") or w.has("rope_factors_short.weight"):
        raise GGUFError(
            f"{gguf.path}: LongRoPE (rope_factors_long/short, Phi-3.5 / Phi-4-mini style) is not supported; "
            "its factors depend on the serving context length"
        )


def _ropes(gguf: GGUFFile, w: WeightSource, cfg: ModelConfig, opts: DecoderOptions) -> tuple[RopeSpec, ...]:
    """The full-attention layers' rope, then the sliding layers' where it differs (another base,
    or no scaling)."""
    n_rot = int(gguf.arch_value("rope.dimension_count", cfg.head_dim_k))
    base = float(gguf.arch_value("rope.freq_base", 10000.0))
    factors = w.optional_dense("rope_freqs.weight")
    full = RopeSpec(n_rot, base, cfg.n_ctx_train, opts.neox_rope, factors, opts.rope_scaling)
    sliding_base = opts.sliding_rope_base or base
    plain_sliding = not opts.scaled_rope_on_sliding and opts.rope_scaling.is_scaled
    if not opts.sliding_layers or (sliding_base == base and not plain_sliding):
        return (full,)
    scaling = RopeScaling() if not opts.scaled_rope_on_sliding else opts.rope_scaling
    return full, RopeSpec(n_rot, sliding_base, cfg.n_ctx_train, opts.neox_rope, factors, scaling)


def _layer(w: WeightSource, i: int, cfg: ModelConfig, opts: DecoderOptions, sliding: bool, rope: int) -> LayerSpec:
    p = f"blk.{i}."
    post_attn = None if opts.ffn_norm_tensor == "post_attention_norm.weight" else w.optional_dense(p + "post_attention_norm.weight")
    return LayerSpec(
        attn_norm=w.optional_dense(p + "attn_norm.weight"),
        attn=_attention(w, p, cfg, opts.window if sliding else None, rope),
        post_attn_norm=post_attn,
        ffn_norm=w.optional_dense(p + opts.ffn_norm_tensor),
        ffn=_experts(w, p, opts) if opts.moe is not None and w.has(p + "ffn_gate_inp.weight") else _feed_forward(w, p, opts),
        post_ffn_norm=w.optional_dense(p + "post_ffw_norm.weight"),
    )


def _attention(w: WeightSource, p: str, cfg: ModelConfig, window: int | None, rope: int) -> AttentionSpec:
    sizes = [cfg.n_heads * cfg.head_dim_k, cfg.n_kv_heads * cfg.head_dim_k, cfg.n_kv_heads * cfg.head_dim_v]
    if w.has(p + "attn_qkv.weight"):  # phi3: one fused projection
        qkv = w.linear(p + "attn_qkv.weight", bias=w.optional_dense(p + "attn_qkv.bias"))
    else:
        qkv = w.linear(*(p + f"attn_{x}.weight" for x in "qkv"), bias=_joint_bias(w, p, sizes))
    if qkv.out_features != sum(sizes):
        raise GGUFError(f"{p}attn_q/k/v: {qkv.out_features} outputs, the head counts and sizes need {sum(sizes)}")
    return AttentionSpec(
        qkv=qkv,
        wo=w.linear(p + "attn_output.weight", bias=w.optional_dense(p + "attn_output.bias")),
        q_norm=w.optional_dense(p + "attn_q_norm.weight"),
        k_norm=w.optional_dense(p + "attn_k_norm.weight"),
        sinks=w.optional_dense(p + "attn_sinks.weight"),
        rope=rope,
        window=window,
    )


def _joint_bias(w: WeightSource, p: str, sizes: list[int]) -> torch.Tensor | None:
    """The Q, K and V biases side by side (zeros for a missing one), or None without any."""
    parts = [w.optional_dense(p + f"attn_{x}.bias") for x in "qkv"]
    if all(b is None for b in parts):
        return None
    return torch.cat([b if b is not None else torch.zeros(n) for b, n in zip(parts, sizes)])


def _feed_forward(w: WeightSource, p: str, opts: DecoderOptions) -> FeedForwardSpec:
    if w.has(p + "ffn_gate.weight"):
        gate_up = w.linear(p + "ffn_gate.weight", p + "ffn_up.weight")
    else:  # phi3: ffn_up holds [gate; up], halves of its output
        gate_up = w.linear(p + "ffn_up.weight")
    return FeedForwardSpec(gate_up, w.linear(p + "ffn_down.weight"), opts.activation)


def _experts(w: WeightSource, p: str, opts: DecoderOptions) -> ExpertsSpec:
    m = opts.moe
    return ExpertsSpec(
        router=w.info(p + "ffn_gate_inp.weight"),
        router_bias=w.optional_dense(p + "ffn_gate_inp.bias"),
        gate=w.info(p + "ffn_gate_exps.weight"),
        up=w.info(p + "ffn_up_exps.weight"),
        down=w.info(p + "ffn_down_exps.weight"),
        gate_bias=w.optional_dense(p + "ffn_gate_exps.bias"),
        up_bias=w.optional_dense(p + "ffn_up_exps.bias"),
        down_bias=w.optional_dense(p + "ffn_down_exps.bias"),
        n_used=m.n_used,
        gating=m.gating,
        normalize=m.normalize,
        activation=m.activation,
    )
