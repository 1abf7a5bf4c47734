"""The PyTorch decoder: a model definition (lamplight.models.spec) as modules, computed as
llama.cpp's graphs compute it.

Every architecture is this one decoder: the spec says which weights each layer has, its
`DecoderOptions` what the architecture does with them. The modules compute on the reference
kernels (dequantized float32) until a runner swaps in faster ones (lamplight.runner).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from ..kernels.linear import invariant_linear
from ..gguf.quant import dequantize, dequantize_rows
from ..state import ModelState
from ..state.advance import advance_states
from .activations import ACTIVATIONS
from .batch import ForwardBatch
from .config import ModelConfig
from .layers import DenseFeedForward, LinearGroup, QuantLinear, RMSNorm, Rotary, ScoreShaping, paged_attention
from .moe import MoEFeedForward
from .options import DecoderOptions
from .recurrent import Segment, build_mixer, commit_states, recurrent_segments
from .spec import AttentionSpec, DecoderSpec, FeedForwardSpec, LayerSpec, LinearSpec, PerLayerEmbeddingSpec
from .torch_spec import torch_spec


def _norm(weight: torch.Tensor | None, eps: float) -> RMSNorm | None:
    return None if weight is None else RMSNorm(weight, eps)


def _single(linear: LinearSpec) -> QuantLinear:
    (info,) = linear.weights
    return QuantLinear(info)


class QKNorm(nn.Module):
    """RMSNorm of Q or K: per head (qwen3, gemma3: weight of head_dim) or over the whole
    projection (olmo2: weight of heads * head_dim), told apart by the weight's length."""

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
    def __init__(self, spec: AttentionSpec, cfg: ModelConfig, opts: DecoderOptions, scale: float):
        super().__init__()
        self.heads = heads = spec.heads
        self.rope_index = spec.rope
        self.kv_layer, self.owns_kv = spec.kv_layer, spec.owns_kv
        self.output_gate, self.value_from_key, self.value_norm = spec.output_gate, spec.value_from_key, spec.value_norm
        self.sizes = [heads.n_heads * heads.head_dim_k * (2 if spec.output_gate else 1)]
        if spec.owns_kv:
            self.sizes.append(heads.n_kv_heads * heads.head_dim_k)
            if not spec.value_from_key:
                self.sizes.append(heads.n_kv_heads * heads.head_dim_v)
        self.qkv = LinearGroup(spec.qkv)
        self.wo = _single(spec.wo)
        self.register_buffer("wo_bias", spec.wo.bias, persistent=False)
        self.q_norm = QKNorm(spec.q_norm, cfg.rms_eps, heads.head_dim_k) if spec.q_norm is not None else None
        self.k_norm = QKNorm(spec.k_norm, cfg.rms_eps, heads.head_dim_k) if spec.k_norm is not None else None
        self.eps = cfg.rms_eps
        self.window = spec.window
        self.scale = scale
        self.register_buffer("sinks", spec.sinks, persistent=False)
        self.softcap = opts.attn_softcap
        # Q and K side by side, rotated by the same angles: one rotation for both.
        self.joint_rotation = (self.q_norm is None and self.k_norm is None and spec.rope is not None
                               and self.owns_kv and not self.output_gate and not self.value_from_key)

    @property
    def shaping(self) -> ScoreShaping | None:
        if self.softcap or self.sinks is not None:
            return ScoreShaping(self.softcap, self.sinks)
        return None

    def _heads(self, x: torch.Tensor, n_heads: int, norm: QKNorm | None) -> torch.Tensor:
        return norm(x, n_heads) if norm is not None else x.view(x.shape[0], n_heads, -1)

    def _split(self, x: torch.Tensor):
        """Q, its output gate (or None), and this layer's own raw K and V (None where it has none)."""
        qkv = self.qkv(x)
        parts = list(qkv.split(self.sizes, dim=-1)) if len(self.sizes) > 1 else [qkv]
        q, gate = parts[0], None
        if self.output_gate:  # rows interleaved per head: [q_h | gate_h]
            h = self.heads
            q, gate = q.view(x.shape[0], h.n_heads, 2 * h.head_dim_k).split(h.head_dim_k, dim=-1)
            q, gate = q.reshape(x.shape[0], -1), gate.reshape(x.shape[0], -1)
        k = parts[1] if len(parts) > 1 else None
        v = parts[2] if len(parts) > 2 else (k if self.value_from_key else None)
        return qkv, q, gate, k, v

    def forward(self, x: torch.Tensor, layer: int, step: "Step") -> torch.Tensor:
        h = self.heads
        qkv, q, gate, k, v = self._split(x)
        rope, angles = step.ropes[self.rope_index] if self.rope_index is not None else (None, None)
        rotate = (lambda t: t) if rope is None else (lambda t: rope(t, angles))  # noqa: E731
        if self.joint_rotation:
            n_qk = h.n_heads + h.n_kv_heads
            qk = rotate(qkv[:, : n_qk * h.head_dim_k].view(x.shape[0], n_qk, h.head_dim_k))
            q, k = qk[:, : h.n_heads], qk[:, h.n_heads :]
        else:
            q = rotate(self._heads(q, h.n_heads, self.q_norm))
            if k is not None:
                k = rotate(self._heads(k, h.n_kv_heads, self.k_norm))
        if step.q_factors is not None:
            q = q * step.q_factors[:, None, None]
        if v is not None:
            v = v.reshape(-1, h.n_kv_heads, h.head_dim_v)
            if self.value_norm:
                v = v * torch.rsqrt(v.square().mean(-1, keepdim=True).add_(self.eps))
        out = paged_attention(q, k, v, self.kv_layer, step.state.kv, step.batch, self.scale, self.window, self.shaping)
        if gate is not None:
            out = out * torch.sigmoid(gate)
        out = self.wo(out)
        return out if self.wo_bias is None else out + self.wo_bias


class PerLayerInput(nn.Module):
    """Gemma 4's per-layer input branch: post_norm(proj(act(inp_gate x, ple)))."""

    def __init__(self, spec, activation: str, eps: float):
        super().__init__()
        self.inp_gate = _single(spec.inp_gate)
        self.proj = _single(spec.proj)
        self.post_norm = RMSNorm(spec.post_norm, eps)
        self.activation = ACTIVATIONS[activation]

    def forward(self, h: torch.Tensor, ple: torch.Tensor) -> torch.Tensor:
        return self.post_norm(self.proj(self.activation(self.inp_gate(h), ple)))


class Block(nn.Module):
    """One layer: optional norms before and after each branch, a token mixer (attention or a
    recurrent mixer), dense or MoE FFN, and Gemma 4's per-layer input and output scale."""

    def __init__(self, spec: LayerSpec, cfg: ModelConfig, opts: DecoderOptions, scale: float,
                 recurrent_index: int | None = None):
        super().__init__()
        eps = cfg.rms_eps
        self.attn_norm = _norm(spec.attn_norm, eps)
        self.attn = Attention(spec.attn, cfg, opts, scale) if spec.attn is not None else None
        self.mixer = build_mixer(spec.recurrent, recurrent_index, eps) if spec.recurrent is not None else None
        self.post_attn_norm = _norm(spec.post_attn_norm, eps)
        self.ffn_norm = _norm(spec.ffn_norm, eps)
        self.ffn = DenseFeedForward(spec.ffn) if isinstance(spec.ffn, FeedForwardSpec) else MoEFeedForward(spec.ffn)
        self.post_ffn_norm = _norm(spec.post_ffn_norm, eps)
        self.residual_scale = opts.residual_scale
        pli = spec.per_layer_input
        self.per_layer_input = PerLayerInput(pli, opts.activation, eps) if pli is not None else None
        self.output_scale = spec.output_scale

    @staticmethod
    def _branch(norm: RMSNorm | None, x: torch.Tensor) -> torch.Tensor:
        return x if norm is None else norm(x)

    def _mix(self, x: torch.Tensor, layer: int, step: "Step") -> torch.Tensor:
        return self.attn(x, layer, step) if self.attn is not None else self.mixer(x, step)

    def forward(self, h: torch.Tensor, layer: int, step: "Step") -> torch.Tensor:
        attn = self._branch(self.post_attn_norm, self._mix(self._branch(self.attn_norm, h), layer, step))
        h = h + attn * self.residual_scale if self.residual_scale != 1.0 else h + attn
        ffn = self._branch(self.post_ffn_norm, self.ffn(self._branch(self.ffn_norm, h)))
        h = h + ffn * self.residual_scale if self.residual_scale != 1.0 else h + ffn
        if self.per_layer_input is not None:
            h = h + self.per_layer_input(h, step.per_layer_inputs[:, layer])
        return h if self.output_scale is None else h * self.output_scale


class PerLayerEmbedding(nn.Module):
    """Gemma 4's per-layer inputs [T, L, P]: (rms(model_proj x / sqrt(E)) + table[token] * sqrt(P)) / sqrt(2),
    from the scaled token embedding x. The table is read row by row (it is vocab x L x P)."""

    def __init__(self, spec: PerLayerEmbeddingSpec, cfg: ModelConfig):
        super().__init__()
        self.table = spec.token_embd
        self.model_proj = _single(spec.model_proj)
        self.proj_norm = RMSNorm(spec.proj_norm, cfg.rms_eps)
        self.size, self.n_layers, self.n_embd = spec.size, cfg.n_layers, cfg.n_embd

    def forward(self, token_ids: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        rows = torch.from_numpy(dequantize_rows(self.table, token_ids.cpu().numpy())).to(x.device)
        embedded = rows.view(-1, self.n_layers, self.size) * self.size**0.5
        projected = self.proj_norm((self.model_proj(x) * self.n_embd**-0.5).view(-1, self.n_layers, self.size))
        return (projected + embedded) * 2**-0.5


@dataclass
class Step:
    """What every layer of one forward step shares."""

    batch: ForwardBatch
    state: ModelState
    ropes: list[tuple[Rotary, tuple]]  # per rope of the spec: the module and its angles at the batch's positions
    q_factors: torch.Tensor | None  # per row query temperature, or None
    segments: list[Segment] | None = None  # the recurrent layers' sequences (models with recurrent layers)
    # The recurrent layers' new states, written into the pool once the whole step has succeeded,
    # so that a step that fails leaves every sequence's state as it was (the engine then runs
    # each sequence alone, which must start from the same state).
    state_writes: list = field(default_factory=list)
    per_layer_inputs: torch.Tensor | None = None  # [T, L, P] (gemma4)


class Decoder(nn.Module):
    """`compute(batch, state)` returns logits for `batch.logit_rows`."""

    def __init__(self, spec: DecoderSpec):
        super().__init__()
        self.spec = spec = torch_spec(spec)
        self.config = config = spec.config
        self.opts = spec.options
        self.ropes = nn.ModuleList(Rotary.from_spec(r) for r in spec.ropes)
        self.token_embd_info = spec.token_embd  # raw blocks; float32 only when needed
        recurrent_index = iter(range(len(spec.layers)))
        self.blocks = nn.ModuleList(
            Block(layer, config, spec.options, spec.attn_scale, next(recurrent_index) if layer.recurrent else None)
            for layer in spec.layers)
        self.has_recurrent = any(layer.recurrent is not None for layer in spec.layers)
        ple = spec.per_layer_inputs
        self.per_layer_embedding = PerLayerEmbedding(ple, config) if ple is not None else None
        self.output_norm = RMSNorm(spec.output_norm, config.rms_eps)
        self.output = _single(spec.output) if spec.output is not None else None
        self.register_buffer("output_bias", spec.output_bias, persistent=False)
        self.row_split = None  # set by the fast path: its kernels treat decode rows apart from prompt rows
        self.tied_head_kernel = None  # set by the fast path (e.g. an int8 copy of the embedding)

    @property
    def token_embd(self) -> torch.Tensor:
        """The float32 embedding table, dequantized on first use (for a large vocabulary this
        table is the biggest float32 copy there is)."""
        table = self._buffers.get("_token_embd")
        if table is None:
            table = torch.from_numpy(dequantize(self.token_embd_info))
            self.register_buffer("_token_embd", table, persistent=False)
        return table

    def layer_ropes(self) -> list[Rotary | None]:
        """Per KV pool layer, the rope its keys were rotated with (context shift re-rotates
        them); None for a layer without rotation."""
        owners = [blk.attn for blk in self.blocks if blk.attn is not None and blk.attn.owns_kv]
        return [None if a.rope_index is None else self.ropes[a.rope_index] for a in owners]

    def embed(self, batch: ForwardBatch) -> torch.Tensor:
        """Token embeddings times the model's embedding scale; given rows (images) as they are."""
        h = self.token_embd[batch.token_ids]
        if self.opts.embd_scale != 1.0:
            h = h * self.opts.embd_scale
        if batch.embedding_overrides is not None:
            rows, values = batch.embedding_overrides
            h[rows] = values.to(h.dtype)
        return h

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """Logits from final hidden states: the output weight, or the tied embedding."""
        if self.output is not None:
            logits = self.output(h)
        elif self.tied_head_kernel is not None:
            logits = self.tied_head_kernel(h)
        else:  # fixed row blocks: MKL sums a row in an order that depends on the rows (DenseKernel)
            logits = invariant_linear(h, self.token_embd)
        return logits if self.output_bias is None else logits + self.output_bias

    def compute(self, batch: ForwardBatch, state: ModelState) -> torch.Tensor:
        opts = self.opts
        logits = self.head(self.output_norm(self.run_layers(batch, state)[batch.logit_rows]))
        if opts.logit_scale != 1.0:
            logits = logits / opts.logit_scale
        if opts.final_softcap:
            logits = torch.tanh(logits / opts.final_softcap) * opts.final_softcap
        return logits

    def run_layers(self, batch: ForwardBatch, state: ModelState) -> torch.Tensor:
        """Every row's hidden state after the last layer, before the output norm (what the
        head reads, and what embedding models pool)."""
        opts = self.opts
        h = self.embed(batch)
        temperature = opts.query_temperature
        step = Step(batch, state, [(r, r.angles(batch.positions)) for r in self.ropes],
                    temperature.factors(batch.positions) if temperature else None)
        if self.has_recurrent:
            if state.recurrent is None:
                raise ValueError("this model has recurrent layers: its state needs recurrent slots (new_state)")
            step.segments = recurrent_segments(batch, state.recurrent)
        if self.per_layer_embedding is not None:
            step.per_layer_inputs = self.per_layer_embedding(batch.token_ids, h)
        for i, blk in enumerate(self.blocks):
            h = blk(h, i, step)
        if self.has_recurrent:
            commit_states(step.state_writes, state.recurrent)
            advance_states(batch, state.recurrent)
        return h

    forward = compute
