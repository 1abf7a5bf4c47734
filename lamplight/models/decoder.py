"""The PyTorch decoder: a model definition (lamplight.models.spec) as modules, computed as
llama.cpp's graphs compute it.

Every architecture is this one decoder: the spec says which weights each layer has, its
`DecoderOptions` what the architecture does with them. The modules compute on the reference
kernels (dequantized float32) until a runner swaps in faster ones (lamplight.runner).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..gguf.quant import dequantize
from ..state import ModelState
from .activations import ACTIVATIONS
from .batch import ForwardBatch
from .config import ModelConfig
from .layers import LinearGroup, QuantLinear, RMSNorm, Rotary, ScoreShaping, paged_attention
from .moe import MoEFeedForward
from .options import DecoderOptions
from .spec import AttentionSpec, DecoderSpec, FeedForwardSpec, LayerSpec, LinearSpec


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
        self.cfg, self.rope_index = cfg, spec.rope
        self.sizes = [cfg.n_heads * cfg.head_dim_k, cfg.n_kv_heads * cfg.head_dim_k, cfg.n_kv_heads * cfg.head_dim_v]
        self.qkv = LinearGroup(spec.qkv)
        self.wo = _single(spec.wo)
        self.register_buffer("wo_bias", spec.wo.bias, persistent=False)
        self.q_norm = QKNorm(spec.q_norm, cfg.rms_eps, cfg.head_dim_k) if spec.q_norm is not None else None
        self.k_norm = QKNorm(spec.k_norm, cfg.rms_eps, cfg.head_dim_k) if spec.k_norm is not None else None
        self.window = spec.window
        self.scale = scale
        self.register_buffer("sinks", spec.sinks, persistent=False)
        self.softcap = opts.attn_softcap

    @property
    def shaping(self) -> ScoreShaping | None:
        if self.softcap or self.sinks is not None:
            return ScoreShaping(self.softcap, self.sinks)
        return None

    def _heads(self, x: torch.Tensor, n_heads: int, norm: QKNorm | None) -> torch.Tensor:
        return norm(x, n_heads) if norm is not None else x.view(x.shape[0], n_heads, -1)

    def forward(self, x: torch.Tensor, layer: int, step: "Step") -> torch.Tensor:
        cfg = self.cfg
        qkv = self.qkv(x)
        q, k, v = qkv.split(self.sizes, dim=-1)
        rope, angles = step.ropes[self.rope_index]
        if self.q_norm is None and self.k_norm is None:
            # Q and K sit side by side and rotate by the same angles: one rotation for both.
            n_qk = cfg.n_heads + cfg.n_kv_heads
            qk = rope(qkv[:, : n_qk * cfg.head_dim_k].view(x.shape[0], n_qk, cfg.head_dim_k), angles)
            q, k = qk[:, : cfg.n_heads], qk[:, cfg.n_heads :]
        else:
            q = rope(self._heads(q, cfg.n_heads, self.q_norm), angles)
            k = rope(self._heads(k, cfg.n_kv_heads, self.k_norm), angles)
        if step.q_factors is not None:
            q = q * step.q_factors[:, None, None]
        v = v.reshape(-1, cfg.n_kv_heads, cfg.head_dim_v)
        out = self.wo(paged_attention(q, k, v, layer, step.state.kv, step.batch, self.scale, self.window, self.shaping))
        return out if self.wo_bias is None else out + self.wo_bias


class DenseFeedForward(nn.Module):
    def __init__(self, spec: FeedForwardSpec):
        super().__init__()
        self.gate_up = LinearGroup(spec.gate_up)
        self.down = _single(spec.down)
        self.activation = ACTIVATIONS[spec.activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(self.activation(gate, up))


class Block(nn.Module):
    """One layer: optional norms before and after each branch, attention, dense or MoE FFN."""

    def __init__(self, spec: LayerSpec, cfg: ModelConfig, opts: DecoderOptions, scale: float):
        super().__init__()
        eps = cfg.rms_eps
        self.attn_norm = _norm(spec.attn_norm, eps)
        self.attn = Attention(spec.attn, cfg, opts, scale)
        self.post_attn_norm = _norm(spec.post_attn_norm, eps)
        self.ffn_norm = _norm(spec.ffn_norm, eps)
        self.ffn = DenseFeedForward(spec.ffn) if isinstance(spec.ffn, FeedForwardSpec) else MoEFeedForward(spec.ffn)
        self.post_ffn_norm = _norm(spec.post_ffn_norm, eps)
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
    state: ModelState
    ropes: list[tuple[Rotary, tuple]]  # per rope of the spec: the module and its angles at the batch's positions
    q_factors: torch.Tensor | None  # per row query temperature, or None


class Decoder(nn.Module):
    """`compute(batch, state)` returns logits for `batch.logit_rows`."""

    def __init__(self, spec: DecoderSpec):
        super().__init__()
        self.spec = spec
        self.config = config = spec.config
        self.opts = spec.options
        self.ropes = nn.ModuleList(Rotary.from_spec(r) for r in spec.ropes)
        self.token_embd_info = spec.token_embd  # raw blocks; float32 only when needed
        self.blocks = nn.ModuleList(Block(layer, config, spec.options, spec.attn_scale) for layer in spec.layers)
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
            table = dequantize(self.token_embd_info)
            self.register_buffer("_token_embd", table, persistent=False)
        return table

    def layer_ropes(self) -> list[Rotary]:
        """The rope each layer rotates its keys with (context shift re-rotates them)."""
        return [self.ropes[blk.attn.rope_index] for blk in self.blocks]

    def embed(self, batch: ForwardBatch) -> torch.Tensor:
        h = self.token_embd[batch.token_ids]
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
        else:
            logits = F.linear(h, self.token_embd)
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
        if opts.embd_scale != 1.0:
            h = h * opts.embd_scale
        temperature = opts.query_temperature
        step = Step(batch, state, [(r, r.angles(batch.positions)) for r in self.ropes],
                    temperature.factors(batch.positions) if temperature else None)
        for i, blk in enumerate(self.blocks):
            h = blk(h, i, step)
        return h

    forward = compute
