"""The model definition: every weight of a decoder by its role, read once from the GGUF file.

Each backend builds itself from this record (lamplight.runner: the PyTorch modules of
lamplight.models.decoder; lamplight.native: the C++ forward's description), so no backend reads
another one's internals. Large matrices stay `TensorInfo`s (raw GGUF blocks, memory-mapped, no
copy); norms, biases and other small vectors are float32 numpy arrays (the PyTorch modules get
them as tensors through lamplight.models.torch_spec).

What a layer *has* comes from its tensors (biases, a fused Q/K/V or gate/up, Q/K norms per
head or over the whole projection, norms before or after each branch, sinks, a router); what it
*does* with them comes from the architecture's `DecoderOptions` (lamplight.models.options).

A layer mixes tokens either by attention (`LayerSpec.attn`) or by a recurrent mixer
(`LayerSpec.recurrent`: Gated DeltaNet, LFM2's gated short convolution, Mamba2), whose tensors'
shapes are checked against the file's keys here, so a broken file is refused by tensor name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..gguf.file import GGUFError, GGUFFile, TensorInfo
from ..gguf.quant import dequantize
from ..state.layout import KVLayout, RecurrentLayout, StateSpec
from .config import ModelConfig
from .options import RECURRENT_KINDS, DecoderOptions, SSMOptions, layer_kind
from .rope_scaling import RopeScaling


@dataclass(frozen=True)
class LinearSpec:
    """Weights reading the same input, their outputs side by side (Q/K/V, gate/up), and the
    joint bias (zeros where one member has none), or None."""

    weights: tuple[TensorInfo, ...]
    bias: np.ndarray | None = None

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
class HeadShape:
    n_heads: int
    n_kv_heads: int
    head_dim_k: int
    head_dim_v: int


@dataclass(frozen=True)
class AttentionSpec:
    qkv: LinearSpec  # outputs: Q (with its gate rows where output_gate) | own K | own V
    wo: LinearSpec
    q_norm: np.ndarray | None  # RMSNorm weight: per head [head_dim] or over the projection
    k_norm: np.ndarray | None
    sinks: np.ndarray | None  # one attention-sink logit per query head (gpt-oss)
    rope: int | None  # index into DecoderSpec.ropes; None: no rotation (NoPE layers)
    window: int | None  # sliding window in tokens, None: full attention
    heads: HeadShape
    kv_layer: int  # the KV pool layer it attends over
    owns_kv: bool = True  # False: it reads kv_layer, written by an earlier layer (gemma4's shared KV)
    value_from_key: bool = False  # V is the raw K projection (gemma4 layers without attn_v)
    value_norm: bool = False  # V RMS-normalised without weight (gemma4)
    output_gate: bool = False  # Q rows interleave [q_h | gate_h] per head; out *= sigmoid(gate) (qwen35)

    @property
    def kv_shape(self) -> tuple[int, int, int]:
        h = self.heads
        return h.n_kv_heads, h.head_dim_k, h.head_dim_v


@dataclass(frozen=True)
class DeltaNetSpec:
    """Gated DeltaNet (qwen35): in_proj = attn_qkv | attn_gate (z) | ssm_beta | ssm_alpha; the
    conv runs over the qkv channels [q: Hk x d | k: Hk x d | v: Hv x d]; v head h reads q/k head
    h % Hk; one delta-rule matrix [d_v, d_k] per v head."""

    in_proj: LinearSpec
    conv: np.ndarray  # [channels, K]
    dt_bias: np.ndarray  # [Hv]
    a: np.ndarray  # [Hv], stored -exp(A_log)
    norm: np.ndarray  # [d], shared by the heads
    out: LinearSpec
    n_k_heads: int
    n_v_heads: int
    head_dim: int

    @property
    def state_layout(self) -> RecurrentLayout:
        return RecurrentLayout((self.conv.shape[1] - 1, self.conv.shape[0]), (self.n_v_heads, self.head_dim, self.head_dim))


@dataclass(frozen=True)
class ShortConvSpec:
    """LFM2's gated short convolution: in_proj = [B; C; X], y = out_proj(C * conv(B * X))."""

    in_proj: LinearSpec
    conv: np.ndarray  # [E, K]
    out: LinearSpec

    @property
    def state_layout(self) -> RecurrentLayout:
        return RecurrentLayout((self.conv.shape[1] - 1, self.conv.shape[0]))


@dataclass(frozen=True)
class Mamba2Spec:
    """Mamba2 (granitehybrid): in_proj = [z: D | xBC: D + 2GN | dt: nh], conv with bias over xBC,
    head h uses B/C group h // (nh / G), one SSM state [P, N] per head, D skip, gated grouped
    RMSNorm (after the gate)."""

    in_proj: LinearSpec
    conv: np.ndarray  # [D + 2GN, K]
    conv_bias: np.ndarray  # [D + 2GN]
    dt_bias: np.ndarray  # [nh]
    a: np.ndarray  # [nh], stored -exp(A_log)
    d: np.ndarray  # [nh]
    norm: np.ndarray  # [G, D / G]
    out: LinearSpec
    n_heads: int
    n_groups: int
    d_state: int

    @property
    def inner(self) -> int:
        return math.prod(self.norm.shape)  # torch_spec's tensors too

    @property
    def state_layout(self) -> RecurrentLayout:
        return RecurrentLayout((self.conv.shape[1] - 1, self.conv.shape[0]),
                               (self.n_heads, self.inner // self.n_heads, self.d_state))


RecurrentSpec = DeltaNetSpec | ShortConvSpec | Mamba2Spec


@dataclass(frozen=True)
class PerLayerInputSpec:
    """One layer's share of Gemma 4's per-layer embeddings: x += post_norm(proj(act(inp_gate x) * ple))."""

    inp_gate: LinearSpec
    proj: LinearSpec
    post_norm: np.ndarray


@dataclass(frozen=True)
class PerLayerEmbeddingSpec:
    """Gemma 4's per-layer inputs, computed once before layer 0 from the token and its embedding."""

    token_embd: TensorInfo  # [vocab, P * L]
    model_proj: LinearSpec  # E -> P * L
    proj_norm: np.ndarray  # [P]
    size: int  # P


@dataclass(frozen=True)
class FeedForwardSpec:
    gate_up: LinearSpec  # outputs: gate | up
    down: LinearSpec
    activation: str  # lamplight.models.activations.ACTIVATIONS


@dataclass(frozen=True)
class ExpertsSpec:
    """A mixture of experts (llama.cpp's build_moe_ffn): 3-D expert tensors [n_expert, out, in]."""

    router: TensorInfo
    router_bias: np.ndarray | None
    gate: TensorInfo
    up: TensorInfo
    down: TensorInfo
    gate_bias: np.ndarray | None  # [n_expert, out] each, or None
    up_bias: np.ndarray | None
    down_bias: np.ndarray | None
    n_used: int
    gating: str  # "softmax" or "softmax_selected"
    normalize: bool
    activation: str
    shared: FeedForwardSpec | None = None  # a shared expert every token runs (qwen35moe)
    shared_gate: np.ndarray | None = None  # [E]: the shared expert's output times sigmoid(gate . x)

    @property
    def n_expert(self) -> int:
        return self.gate.shape[0]


@dataclass(frozen=True)
class LayerSpec:
    attn_norm: np.ndarray | None  # None: the branch reads the residual stream as it is (olmo2)
    attn: AttentionSpec | None  # the token mixer: attention, or (None) the recurrent mixer below
    post_attn_norm: np.ndarray | None
    ffn_norm: np.ndarray | None
    ffn: FeedForwardSpec | ExpertsSpec
    post_ffn_norm: np.ndarray | None
    recurrent: RecurrentSpec | None = None
    per_layer_input: PerLayerInputSpec | None = None
    output_scale: float | None = None  # the whole residual stream times this after the layer (gemma4)


@dataclass(frozen=True)
class RopeSpec:
    """One rotary embedding: llama.cpp's NORM layout (adjacent pairs) or NEOX (halves), over the
    first n_rot dimensions, with optional per-pair frequency factors and scaling."""

    n_rot: int
    base: float
    max_pos: int
    neox: bool
    freq_factors: np.ndarray | None = None
    scaling: RopeScaling = RopeScaling()


@dataclass(frozen=True)
class DecoderSpec:
    config: ModelConfig
    options: DecoderOptions
    token_embd: TensorInfo
    layers: tuple[LayerSpec, ...]
    output_norm: np.ndarray
    output: LinearSpec | None  # None: the head is the token embedding (tied)
    output_bias: np.ndarray | None
    ropes: tuple[RopeSpec, ...]  # the layers' rotations (AttentionSpec.rope indexes them)
    attn_scale: float
    per_layer_inputs: PerLayerEmbeddingSpec | None = None

    @property
    def state_spec(self) -> StateSpec:
        """What the model keeps per sequence: K/V for the attention layers that own theirs, a
        recurrent state for each recurrent layer."""
        kv = [layer.attn.kv_shape for layer in self.layers if layer.attn is not None and layer.attn.owns_kv]
        recurrent = tuple(layer.recurrent.state_layout for layer in self.layers if layer.recurrent is not None)
        return StateSpec(KVLayout.of_layers(kv), recurrent)

    def linear_weights(self) -> dict[str, TensorInfo]:
        """Every 2-D weight a linear layer computes with, by GGUF name (what LoRA adapters name)."""
        linears = [self.output] if self.output is not None else []
        for layer in self.layers:
            if layer.attn is not None:
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

    def dense(self, name: str) -> np.ndarray:
        return dequantize(self.info(name))

    def optional_dense(self, name: str) -> np.ndarray | None:
        """A norm, bias or other small tensor that only some files (or architectures) have."""
        return self.dense(name) if self.has(name) else None

    def linear(self, *names: str, bias: np.ndarray | None = None) -> LinearSpec:
        return LinearSpec(tuple(self.info(n) for n in names), bias)

    def matrix(self, name: str, out_features: int, in_features: int) -> TensorInfo:
        """A weight that must be [out, in] (numpy order; GGUF's ne is [in, out])."""
        info = self.info(name)
        if tuple(info.shape) != (out_features, in_features):
            raise GGUFError(f"{self.gguf.path}: tensor {name} has shape {_ne(info.shape)}, "
                            f"the file's keys need {_ne((out_features, in_features))}")
        return info

    def shaped(self, name: str, *shape: int) -> np.ndarray:
        """A small dense tensor of exactly `shape` elements (vectors may carry 1-sized dims,
        as Mamba2's ssm_a [1, nh] does)."""
        info = self.info(name)
        squeeze = lambda dims: tuple(d for d in dims if d != 1) or (1,)  # noqa: E731
        if squeeze(info.shape) != squeeze(shape):
            raise GGUFError(f"{self.gguf.path}: tensor {name} has shape {_ne(info.shape)}, "
                            f"the file's keys need {_ne(shape)}")
        return dequantize(info).reshape(shape)


def _ne(shape) -> list[int]:
    """A shape as GGUF's ne lists it (innermost first), which is how tools print tensors."""
    return list(reversed(tuple(shape)))


def read_decoder_spec(gguf: GGUFFile, config: ModelConfig, opts: DecoderOptions) -> DecoderSpec:
    w = WeightSource(gguf)
    _refuse_long_rope(w, gguf)
    ropes = _ropes(gguf, w, config, opts)
    sliding = opts.sliding_layers or (False,) * config.n_layers
    no_rope = opts.no_rope_layers or (False,) * config.n_layers
    kv_layers = _kv_layers(gguf, config, opts, sliding)
    layers = []
    for i in range(config.n_layers):
        rope = None if no_rope[i] else (len(ropes) - 1 if sliding[i] else 0)
        layers.append(_layer(w, i, config, opts, sliding[i], rope, kv_layers[i]))
    return DecoderSpec(
        config=config,
        options=opts,
        token_embd=w.info("token_embd.weight"),
        layers=tuple(layers),
        output_norm=w.dense(opts.output_norm_tensor),
        output=w.linear("output.weight") if w.has("output.weight") else None,
        output_bias=w.optional_dense("output.bias"),
        ropes=ropes,
        attn_scale=opts.attn_scale or config.head_dim_k**-0.5,
        per_layer_inputs=_per_layer_embedding(w, gguf, config),
    )


def _refuse_long_rope(w: WeightSource, gguf: GGUFFile) -> None:
    if w.has("rope_factors_long.weight") or w.has("rope_factors_short.weight"):
        raise GGUFError(
            f"{gguf.path}: LongRoPE (rope_factors_long/short, Phi-3.5 / Phi-4-mini style) is not supported; "
            "its factors depend on the serving context length"
        )


def _ropes(gguf: GGUFFile, w: WeightSource, cfg: ModelConfig, opts: DecoderOptions) -> tuple[RopeSpec, ...]:
    """The full-attention layers' rope, then the sliding layers' where it differs (another base,
    no scaling, or their own rotated dims without rope_freqs)."""
    n_rot = int(gguf.arch_value("rope.dimension_count", cfg.head_dim_k))
    base = float(gguf.arch_value("rope.freq_base", 10000.0))
    factors = w.optional_dense("rope_freqs.weight")
    full = RopeSpec(n_rot, base, cfg.n_ctx_train, opts.neox_rope, factors, opts.rope_scaling)
    sliding_base = opts.sliding_rope_base or base
    plain_sliding = not opts.scaled_rope_on_sliding and opts.rope_scaling.is_scaled
    own_dims = opts.sliding_rope_dims is not None
    if not opts.sliding_layers or (sliding_base == base and not plain_sliding and not own_dims):
        return (full,)
    scaling = RopeScaling() if not opts.scaled_rope_on_sliding else opts.rope_scaling
    if own_dims:
        return full, RopeSpec(opts.sliding_rope_dims, sliding_base, cfg.n_ctx_train, opts.neox_rope, None, scaling)
    return full, RopeSpec(n_rot, sliding_base, cfg.n_ctx_train, opts.neox_rope, factors, scaling)


def _kv_layers(gguf: GGUFFile, cfg: ModelConfig, opts: DecoderOptions, sliding: tuple[bool, ...]) -> list:
    """Per layer: (KV pool layer, owns it) for attention layers, None for recurrent ones. The
    last `shared_kv_layers` layers read the K/V of the last earlier layer of their kind
    (sliding or full), as llama.cpp's gemma4 does."""
    n_own = cfg.n_layers - opts.shared_kv_layers
    out, last_of_kind, count = [], {}, 0
    for i in range(cfg.n_layers):
        if layer_kind(opts, i) != "attention":
            out.append(None)
        elif i < n_own:
            out.append((count, True))
            last_of_kind[sliding[i]] = i, count
            count += 1
        else:
            if sliding[i] not in last_of_kind:
                raise GGUFError(f"{gguf.path}: layer {i} shares the K/V of an earlier "
                                f"{'sliding' if sliding[i] else 'full'} layer, and there is none")
            out.append((last_of_kind[sliding[i]][1], False))
    return out


def _layer(w: WeightSource, i: int, cfg: ModelConfig, opts: DecoderOptions, sliding: bool, rope: int | None,
           kv_layer: tuple[int, bool] | None) -> LayerSpec:
    p = f"blk.{i}."
    post_attn = None if opts.ffn_norm_tensor == "post_attention_norm.weight" else w.optional_dense(p + "post_attention_norm.weight")
    kind = layer_kind(opts, i)
    if kind not in ("attention", *RECURRENT_KINDS):
        raise GGUFError(f"layer kind {kind!r} is not known")
    attn = _attention(w, p, cfg, opts, i, opts.window if sliding else None, rope, sliding, kv_layer) if kind == "attention" else None
    scale = w.optional_dense(p + "layer_output_scale.weight")
    return LayerSpec(
        attn_norm=w.optional_dense(p + "attn_norm.weight"),
        attn=attn,
        post_attn_norm=post_attn,
        ffn_norm=w.optional_dense(p + opts.ffn_norm_tensor),
        ffn=_experts(w, p, opts) if opts.moe is not None and w.has(p + "ffn_gate_inp.weight") else _feed_forward(w, p, opts),
        post_ffn_norm=w.optional_dense(p + "post_ffw_norm.weight"),
        recurrent=None if kind == "attention" else _RECURRENT_READERS[kind](w, p, cfg, opts),
        per_layer_input=_per_layer_input(w, p),
        output_scale=float(scale.reshape(-1)[0]) if scale is not None else None,
    )


def _head_shape(cfg: ModelConfig, opts: DecoderOptions, i: int, sliding: bool) -> HeadShape:
    dims = opts.sliding_head_dims if sliding and opts.sliding_head_dims else (cfg.head_dim_k, cfg.head_dim_v)
    return HeadShape(cfg.n_heads, cfg.kv_heads(i), *dims)


def _attention(w: WeightSource, p: str, cfg: ModelConfig, opts: DecoderOptions, i: int, window: int | None,
               rope: int | None, sliding: bool, kv_layer: tuple[int, bool]) -> AttentionSpec:
    heads = _head_shape(cfg, opts, i, sliding)
    index, owns_kv = kv_layer
    q_rows = heads.n_heads * heads.head_dim_k * (2 if opts.attn_output_gate else 1)
    sizes = [q_rows, heads.n_kv_heads * heads.head_dim_k, heads.n_kv_heads * heads.head_dim_v]
    value_from_key = owns_kv and opts.attn_v_optional and not w.has(p + "attn_v.weight")
    if not owns_kv:  # its queries only: K/V come from an earlier layer's cache
        sizes = sizes[:1]
        qkv = w.linear(p + "attn_q.weight", bias=w.optional_dense(p + "attn_q.bias"))
    elif w.has(p + "attn_qkv.weight"):  # phi3: one fused projection
        qkv = w.linear(p + "attn_qkv.weight", bias=w.optional_dense(p + "attn_qkv.bias"))
    elif value_from_key:
        sizes = sizes[:2]
        qkv = w.linear(p + "attn_q.weight", p + "attn_k.weight", bias=_joint_bias(w, p, sizes, "qk"))
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
        heads=heads,
        kv_layer=index,
        owns_kv=owns_kv,
        value_from_key=value_from_key,
        value_norm=opts.value_norm,
        output_gate=opts.attn_output_gate,
    )


def _ssm(w: WeightSource, opts: DecoderOptions) -> SSMOptions:
    if opts.ssm is None:
        raise GGUFError(f"{w.gguf.path}: recurrent layers without their ssm.* hyperparameters")
    return opts.ssm


def _deltanet(w: WeightSource, p: str, cfg: ModelConfig, opts: DecoderOptions) -> DeltaNetSpec:
    ssm = _ssm(w, opts)
    d, n_k, n_v, e = ssm.state_size, ssm.group_count, ssm.time_step_rank, cfg.n_embd
    if not d or not n_k or n_v % n_k or ssm.inner_size != n_v * d:
        raise GGUFError(f"{w.gguf.path}: Gated DeltaNet sizes: ssm.state_size {d}, ssm.group_count {n_k}, "
                        f"ssm.time_step_rank {n_v}, ssm.inner_size {ssm.inner_size} (need inner = v heads x d)")
    channels = (2 * n_k + n_v) * d
    in_proj = LinearSpec((w.matrix(p + "attn_qkv.weight", channels, e), w.matrix(p + "attn_gate.weight", n_v * d, e),
                          w.matrix(p + "ssm_beta.weight", n_v, e), w.matrix(p + "ssm_alpha.weight", n_v, e)))
    return DeltaNetSpec(
        in_proj=in_proj,
        conv=w.shaped(p + "ssm_conv1d.weight", channels, ssm.conv_kernel),
        dt_bias=w.shaped(p + "ssm_dt.bias", n_v),
        a=w.shaped(p + "ssm_a", n_v),
        norm=w.shaped(p + "ssm_norm.weight", d),
        out=LinearSpec((w.matrix(p + "ssm_out.weight", e, n_v * d),)),
        n_k_heads=n_k,
        n_v_heads=n_v,
        head_dim=d,
    )


def _shortconv(w: WeightSource, p: str, cfg: ModelConfig, opts: DecoderOptions) -> ShortConvSpec:
    e, k = cfg.n_embd, _ssm(w, opts).conv_kernel
    return ShortConvSpec(
        in_proj=LinearSpec((w.matrix(p + "shortconv.in_proj.weight", 3 * e, e),)),
        conv=w.shaped(p + "shortconv.conv.weight", e, k),
        out=LinearSpec((w.matrix(p + "shortconv.out_proj.weight", e, e),)),
    )


def _mamba2(w: WeightSource, p: str, cfg: ModelConfig, opts: DecoderOptions) -> Mamba2Spec:
    ssm = _ssm(w, opts)
    inner, n, g, nh, e = ssm.inner_size, ssm.state_size, ssm.group_count, ssm.time_step_rank, cfg.n_embd
    if not inner or not n or not g or not nh or inner % nh or nh % g or inner % g:
        raise GGUFError(f"{w.gguf.path}: Mamba2 sizes: ssm.inner_size {inner}, ssm.state_size {n}, "
                        f"ssm.group_count {g}, ssm.time_step_rank {nh}")
    channels = inner + 2 * g * n
    return Mamba2Spec(
        in_proj=LinearSpec((w.matrix(p + "ssm_in.weight", inner + channels + nh, e),)),
        conv=w.shaped(p + "ssm_conv1d.weight", channels, ssm.conv_kernel),
        conv_bias=w.shaped(p + "ssm_conv1d.bias", channels),
        dt_bias=w.shaped(p + "ssm_dt.bias", nh),
        a=w.shaped(p + "ssm_a", nh),
        d=w.shaped(p + "ssm_d", nh),
        norm=w.shaped(p + "ssm_norm.weight", g, inner // g),
        out=LinearSpec((w.matrix(p + "ssm_out.weight", e, inner),)),
        n_heads=nh,
        n_groups=g,
        d_state=n,
    )


_RECURRENT_READERS = {"deltanet": _deltanet, "shortconv": _shortconv, "mamba2": _mamba2}


def _per_layer_embedding(w: WeightSource, gguf: GGUFFile, cfg: ModelConfig) -> PerLayerEmbeddingSpec | None:
    if not w.has("per_layer_token_embd.weight"):
        return None
    size = int(gguf.require_arch_value("embedding_length_per_layer_input"))
    width = size * cfg.n_layers
    return PerLayerEmbeddingSpec(
        token_embd=w.matrix("per_layer_token_embd.weight", w.info("token_embd.weight").shape[0], width),
        model_proj=LinearSpec((w.matrix("per_layer_model_proj.weight", width, cfg.n_embd),)),
        proj_norm=w.shaped("per_layer_proj_norm.weight", size),
        size=size,
    )


def _per_layer_input(w: WeightSource, p: str) -> PerLayerInputSpec | None:
    if not w.has(p + "inp_gate.weight"):
        return None
    return PerLayerInputSpec(w.linear(p + "inp_gate.weight"), w.linear(p + "proj.weight"), w.dense(p + "post_norm.weight"))


def _joint_bias(w: WeightSource, p: str, sizes: list[int], members: str = "qkv") -> np.ndarray | None:
    """The Q, K and V biases side by side (zeros for a missing one), or None without any."""
    parts = [w.optional_dense(p + f"attn_{x}.bias") for x in members]
    if all(b is None for b in parts):
        return None
    return np.concatenate([b if b is not None else np.zeros(n, dtype=np.float32) for b, n in zip(parts, sizes)])


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
        shared=_shared_expert(w, p),
        shared_gate=w.optional_dense(p + "ffn_gate_inp_shexp.weight"),
    )


def _shared_expert(w: WeightSource, p: str) -> FeedForwardSpec | None:
    if not w.has(p + "ffn_up_shexp.weight"):
        return None
    return FeedForwardSpec(w.linear(p + "ffn_gate_shexp.weight", p + "ffn_up_shexp.weight"),
                           w.linear(p + "ffn_down_shexp.weight"), "silu")
