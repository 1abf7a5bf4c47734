"""The BERT-family encoders: `bert` (BERT, BGE, MiniLM; bge-reranker with its `cls.*` head) and
`nomic-bert` (nomic-embed-text), as llama.cpp's build_bert computes them.

x = token_embd[t] + token_types[0] + position_embd[p] (bert; nomic-bert rotates Q and K instead),
then LayerNorm; each layer is post-norm: x = LN(x + attn(x)), x = LN(x + ffn(x)); attention sees
every token of its own input (no causal mask); the FFN is GELU (bert, with biases) or SwiGLU
(nomic-bert, no biases). llama.cpp adds row 0 of token_types to every token, also in rerank pairs.

Batch invariance: the linears pad their rows like the engine's batch-invariant kernels, and
attention runs over inputs of one length at a time with no padding, so an input's states do not
depend on what else is in the step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F

from ..gguf.file import GGUFError, GGUFFile
from ..kernels.linear import BATCH_INVARIANT_ROWS, DenseKernel
from ..models.activations import gelu_tanh_fp16_table
from ..models.layers import Rotary
from ..models.spec import WeightSource

ENCODER_ARCHITECTURES = ("bert", "nomic-bert")


class Linear:
    """A weight (and optional bias) computed with the batch-invariant float32 kernel."""

    def __init__(self, w: WeightSource, name: str, bias: str | None = None):
        self.kernel = DenseKernel(w.dense(name), torch.float32, BATCH_INVARIANT_ROWS)
        self.bias = w.optional_dense(bias) if bias else None

    @property
    def out_features(self) -> int:
        return self.kernel.out_features

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = self.kernel(x)
        return y if self.bias is None else y + self.bias


@dataclass
class LayerNorm:
    weight: torch.Tensor
    bias: torch.Tensor | None
    eps: float

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)


def _layer_norm(w: WeightSource, name: str, eps: float) -> LayerNorm:
    return LayerNorm(w.dense(name + ".weight"), w.optional_dense(name + ".bias"), eps)


def _gelu(x: torch.Tensor) -> torch.Tensor:
    # ggml's CPU GELU: the tanh form looked up in an fp16 table (times 1: no gate product here).
    return gelu_tanh_fp16_table(x, 1.0)


class EncoderLayer:
    def __init__(self, w: WeightSource, i: int, n_embd: int, eps: float):
        p = f"blk.{i}."
        if w.has(p + "attn_qkv.weight"):  # nomic-bert: one fused projection, rows q | k | v
            self.qkv = [Linear(w, p + "attn_qkv.weight", p + "attn_qkv.bias")]
        else:
            self.qkv = [Linear(w, p + f"attn_{x}.weight", p + f"attn_{x}.bias") for x in "qkv"]
        if sum(lin.out_features for lin in self.qkv) != 3 * n_embd:
            raise GGUFError(f"{p}attn_q/k/v: the projections do not give 3 x {n_embd} outputs")
        self.wo = Linear(w, p + "attn_output.weight", p + "attn_output.bias")
        self.attn_norm = _layer_norm(w, p + "attn_output_norm", eps)
        self.gate = Linear(w, p + "ffn_gate.weight") if w.has(p + "ffn_gate.weight") else None
        self.up = Linear(w, p + "ffn_up.weight", p + "ffn_up.bias")
        self.down = Linear(w, p + "ffn_down.weight", p + "ffn_down.bias")
        self.ffn_norm = _layer_norm(w, p + "layer_output_norm", eps)

    def ffn(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate is not None:  # SwiGLU
            return self.down(F.silu(self.gate(x)) * self.up(x))
        return self.down(_gelu(self.up(x)))


class Encoder:
    """`hidden_states(inputs)`: every input's final hidden states [n, n_embd]."""

    causal = False
    kernels = "pytorch float32 encoder"
    shared = False  # its own weights (no generating model serves an encoder)

    def __init__(self, gguf: GGUFFile):
        if gguf.architecture not in ENCODER_ARCHITECTURES:
            raise GGUFError(f"{gguf.path}: {gguf.architecture!r} is not an encoder architecture")
        w = WeightSource(gguf)
        self.n_embd = int(gguf.require_arch_value("embedding_length"))
        self.n_heads = int(gguf.require_arch_value("attention.head_count"))
        if self.n_embd % self.n_heads:
            raise GGUFError(f"{gguf.path}: embedding_length {self.n_embd} is not a multiple of head_count {self.n_heads}")
        self.head_dim = self.n_embd // self.n_heads
        eps = float(gguf.arch_value("attention.layer_norm_epsilon", 1e-12))
        self.n_ctx_train = int(gguf.arch_value("context_length", 512))
        self.token_embd = w.dense("token_embd.weight")
        self.vocab_size = self.token_embd.shape[0]
        types = w.optional_dense("token_types.weight")
        self.type_row = types[0] if types is not None else None
        self.position_embd = w.optional_dense("position_embd.weight")
        if self.position_embd is not None:
            self.n_ctx_train = min(self.n_ctx_train, self.position_embd.shape[0])
        self.rotary = None
        if gguf.architecture == "nomic-bert":
            base = float(gguf.arch_value("rope.freq_base", 10000.0))
            self.rotary = Rotary(self.head_dim, base, self.n_ctx_train, neox=True)
        self.embd_norm = _layer_norm(w, "token_embd_norm", eps)
        n_layers = int(gguf.require_arch_value("block_count"))
        self.layers = [EncoderLayer(w, i, self.n_embd, eps) for i in range(n_layers)]

    @torch.inference_mode()
    def hidden_states(self, inputs: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        lengths = [len(ids) for ids in inputs]
        positions = torch.cat([torch.arange(n) for n in lengths])
        x = self._embed(torch.tensor([t for ids in inputs for t in ids], dtype=torch.long), positions)
        angles = self.rotary.angles(positions) if self.rotary is not None else None
        for layer in self.layers:
            x = layer.attn_norm(x + layer.wo(self._attention(layer, x, lengths, angles)))
            x = layer.ffn_norm(x + layer.ffn(x))
        return list(x.split(lengths))

    def _embed(self, token_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = self.token_embd[token_ids]
        if self.type_row is not None:
            x = x + self.type_row
        if self.position_embd is not None:
            x = x + self.position_embd[positions]
        return self.embd_norm(x)

    def _attention(self, layer: EncoderLayer, x: torch.Tensor, lengths: list[int], angles) -> torch.Tensor:
        qkv = torch.cat([lin(x) for lin in layer.qkv], dim=-1) if len(layer.qkv) > 1 else layer.qkv[0](x)
        q, k, v = (part.reshape(-1, self.n_heads, self.head_dim) for part in qkv.split(self.n_embd, dim=-1))
        if angles is not None:
            q, k = self.rotary(q, angles), self.rotary(k, angles)
        out = torch.empty_like(x)
        for rows, n in _same_length_groups(lengths):
            # [B, n, H, D] -> [B, H, n, D]: inputs of one length side by side, no padding.
            shape = (len(rows) // n, n, self.n_heads, self.head_dim)
            attn = F.scaled_dot_product_attention(*(t[rows].view(shape).transpose(1, 2) for t in (q, k, v)))
            out[rows] = attn.transpose(1, 2).reshape(len(rows), self.n_embd)
        return out


def _same_length_groups(lengths: list[int]) -> list[tuple[torch.Tensor, int]]:
    """The rows of the inputs of each length, input by input."""
    starts, first = [], 0
    for n in lengths:
        starts.append(first)
        first += n
    by_length: dict[int, list[torch.Tensor]] = {}
    for start, n in zip(starts, lengths):
        by_length.setdefault(n, []).append(torch.arange(start, start + n))
    return [(torch.cat(rows), n) for n, rows in by_length.items()]
