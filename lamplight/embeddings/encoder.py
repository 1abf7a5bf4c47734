"""The BERT-family encoders: `bert` (BERT, BGE, MiniLM; bge-reranker with its `cls.*` head) and
`nomic-bert` (nomic-embed-text), as llama.cpp's build_bert computes them.

x = token_embd[t] + token_types[0] + position_embd[p] (bert; nomic-bert rotates Q and K instead),
then LayerNorm; each layer is post-norm: x = LN(x + attn(x)), x = LN(x + ffn(x)); attention sees
every token of its own input (no causal mask); the FFN is GELU (bert, with biases) or SwiGLU
(nomic-bert, no biases). llama.cpp adds row 0 of token_types to every token, also in rerank pairs.

With the native and fast backends, linears of quantized weights run on the native integer kernels
(8-bit activations, as llama.cpp computes them), fp16 and bf16 ones on the native float32 kernels
reading them as stored (six rows share each widened column: on an AVX-512 Zen 5, 7.2 s for a
64-document rerank of a bge-reranker-base-shaped F16 file against 11.8 s on PyTorch's float32
matmul, whose weights also take twice the memory); float32 ones, and every linear on the other
backends, on PyTorch's float32 matmul. Their attention and residual layer norms too run natively
with those backends (src/encoder_attention.cpp, src/layer_norm.cpp), else on PyTorch's
scaled_dot_product_attention and layer_norm.

Batch invariance: the native linears compute each row alone; the PyTorch ones pad their rows like
the engine's batch-invariant kernels; attention runs over inputs of one length at a time with no
padding, so an input's states do not depend on what else is in the step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType

from ..gguf.file import GGUFError, GGUFFile
from ..heap import keep_freed_buffers
from ..kernels.linear import BATCH_INVARIANT_ROWS, DenseKernel
from ..models.activations import GELU_IDENTITY_FROM, fp16_gelu_table, gelu_tanh_fp16_table
from ..models.layers import Rotary
from ..models.torch_spec import TorchWeightSource
from ..native import abi, pack, runtime
from ..native.elementwise import ATTEND_FULL_LANES, add_layer_norm, attend_full, fp16_lookup
from ..native.linear import NativeLinear
from ..native.threads import configured_threads

NATIVE_BACKENDS = ("native", "fast")

ENCODER_ARCHITECTURES = ("bert", "nomic-bert")


class Linear:
    """Weights reading one input, outputs side by side (fused Q/K/V), and their optional biases,
    computed with the batch-invariant float32 kernel."""

    def __init__(self, w: TorchWeightSource, names: Sequence[str], biases: Sequence[str | None]):
        self.kernel = DenseKernel(torch.cat([w.dense(name) for name in names]), torch.float32, BATCH_INVARIANT_ROWS)
        self.bias = _joint_bias(w, names, biases)

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


def _joint_bias(w: TorchWeightSource, names: Sequence[str], biases: Sequence[str | None]) -> torch.Tensor | None:
    """The weights' biases side by side (zeros for a weight without one), or None if none has one."""
    parts = [w.optional_dense(b) if b else None for b in biases]
    if all(p is None for p in parts):
        return None
    return torch.cat([p if p is not None else torch.zeros(w.info(n).shape[0]) for p, n in zip(parts, names)])


class _NativeLinears:
    """Builds an encoder's linears: native where every weight of the linear is quantized in a
    packable type or fp16/bf16, else PyTorch; and says which weight types went where (the
    start-up log)."""

    def __init__(self, lib):
        self.lib = lib
        self.native: set[str] = set()
        self.other: set[str] = set()

    def __call__(self, w: TorchWeightSource, names: Sequence[str],
                 biases: Sequence[str | None]) -> Linear | NativeLinear:
        infos = [w.info(n) for n in names]
        types = {i.qtype.name for i in infos}
        if all(pack.can_pack(i.qtype) or _widened_natively(i) for i in infos):
            self.native |= types
            return NativeLinear(self.lib, infos, _joint_bias(w, names, biases))
        self.other |= types
        return Linear(w, names, biases)

    def describe(self) -> str:
        """e.g. 'native avx512vnni encoder (Q8_0 weights; 2 threads)', with the types of the
        linears left on PyTorch ('...; F16 on pytorch float32; ...'), or 'pytorch float32 encoder'."""
        if not self.native:
            return "pytorch float32 encoder"
        parts = [f"{', '.join(sorted(self.native))} weights"]
        if self.other:
            parts.append(f"{', '.join(sorted(self.other))} on pytorch float32")
        return f"native {self.lib.lp_isa().decode()} encoder ({'; '.join(parts)}; {self.lib.lp_get_threads()} threads)"


def _widened_natively(info) -> bool:
    """fp16 and bf16 weights the native kernels read as stored, widening them exactly (k a multiple
    of their tiles' 16): the float32 products of PyTorch's matmul, in a fixed order per row."""
    return info.qtype in (GGMLQuantizationType.F16, GGMLQuantizationType.BF16) and info.shape[1] % abi.DENSE_TILE_K == 0


def _layer_norm(w: TorchWeightSource, name: str, eps: float) -> LayerNorm:
    return LayerNorm(w.dense(name + ".weight"), w.optional_dense(name + ".bias"), eps)


def _gelu(x: torch.Tensor) -> torch.Tensor:
    # ggml's CPU GELU: the tanh form looked up in an fp16 table (times 1: no gate product here).
    return gelu_tanh_fp16_table(x, 1.0)


def _native_gelu(lib) -> Callable[[torch.Tensor], torch.Tensor]:
    """_gelu's bits in one pass on the library's threads (a third of the time of 3 passes), into
    its input (the up projection's rows, read by nothing else)."""
    table = fp16_gelu_table()
    return lambda x: fp16_lookup(lib, table, x, GELU_IDENTITY_FROM, in_place=True)


class EncoderLayer:
    def __init__(self, w: TorchWeightSource, i: int, n_embd: int, eps: float, linear=Linear, gelu=_gelu):
        p = f"blk.{i}."
        self.gelu = gelu

        def one(name: str, bias: str | None = None):
            return linear(w, [p + name + ".weight"], [p + bias + ".bias" if bias else None])

        if w.has(p + "attn_qkv.weight"):  # nomic-bert: one fused projection, rows q | k | v
            self.qkv = one("attn_qkv", "attn_qkv")
        else:
            self.qkv = linear(w, [p + f"attn_{x}.weight" for x in "qkv"], [p + f"attn_{x}.bias" for x in "qkv"])
        if self.qkv.out_features != 3 * n_embd:
            raise GGUFError(f"{p}attn_q/k/v: the projections do not give 3 x {n_embd} outputs")
        self.wo = one("attn_output", "attn_output")
        self.attn_norm = _layer_norm(w, p + "attn_output_norm", eps)
        self.gate = one("ffn_gate") if w.has(p + "ffn_gate.weight") else None
        self.up = one("ffn_up", "ffn_up")
        self.down = one("ffn_down", "ffn_down")
        self.ffn_norm = _layer_norm(w, p + "layer_output_norm", eps)

    def ffn(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate is not None:  # SwiGLU
            return self.down(F.silu(self.gate(x)) * self.up(x))
        return self.down(self.gelu(self.up(x)))


class Encoder:
    """`hidden_states(inputs)`: every input's final hidden states [n, n_embd]."""

    causal = False
    shared = False  # its own weights (no generating model serves an encoder)

    def __init__(self, gguf: GGUFFile, backend: str = "reference"):
        if gguf.architecture not in ENCODER_ARCHITECTURES:
            raise GGUFError(f"{gguf.path}: {gguf.architecture!r} is not an encoder architecture")
        w = TorchWeightSource(gguf)
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
        keep_freed_buffers()
        lib = runtime.library() if backend in NATIVE_BACKENDS else None
        self.lib = lib
        if lib is not None:
            lib.lp_set_threads(configured_threads())  # -t, else the default (lamplight.native.threads)
            linear, gelu = _NativeLinears(lib), _native_gelu(lib)
        else:
            linear, gelu = Linear, _gelu
        self.layers = [EncoderLayer(w, i, self.n_embd, eps, linear, gelu) for i in range(n_layers)]
        self.kernels = linear.describe() if lib is not None else "pytorch float32 encoder"

    @torch.inference_mode()
    def hidden_states(self, inputs: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        # Computed with the inputs ordered by length (stable: as given within one length), so
        # that attention's groups of one length are slices of the rows, not gathered copies;
        # every other step is row by row, so the order changes no bits.
        order = sorted(range(len(inputs)), key=lambda i: len(inputs[i]))
        lengths = [len(inputs[i]) for i in order]
        positions = torch.cat([torch.arange(n) for n in lengths])
        x = self._embed(torch.tensor([t for i in order for t in inputs[i]], dtype=torch.long), positions)
        angles = self.rotary.angles(positions) if self.rotary is not None else None
        groups = _same_length_slices(lengths)
        for layer in self.layers:
            x = self._add_norm(layer.attn_norm, x, layer.wo(self._attention(layer, x, groups, angles)))
            x = self._add_norm(layer.ffn_norm, x, layer.ffn(x))
        out: list[torch.Tensor] = [None] * len(inputs)  # type: ignore[list-item]
        for i, part in zip(order, x.split(lengths)):
            out[i] = part
        return out

    def _add_norm(self, norm: LayerNorm, x: torch.Tensor, branch: torch.Tensor) -> torch.Tensor:
        """norm(x + branch): on the native threads in one pass, into the branch's rows (a fresh
        tensor), with the native backends; else PyTorch's add and layer_norm."""
        if self.lib is None or not branch.is_contiguous() or branch.dtype != torch.float32:
            return norm(x + branch)
        return add_layer_norm(self.lib, branch, x.contiguous(), norm.weight, norm.bias, norm.eps, out=branch)

    def _embed(self, token_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = self.token_embd[token_ids]
        if self.type_row is not None:
            x = x + self.type_row
        if self.position_embd is not None:
            x = x + self.position_embd[positions]
        return self.embd_norm(x)

    def _attention(self, layer: EncoderLayer, x: torch.Tensor, groups: list[tuple[int, int, int]], angles) -> torch.Tensor:
        qkv = layer.qkv(x)
        q, k, v = (part.reshape(-1, self.n_heads, self.head_dim) for part in qkv.split(self.n_embd, dim=-1))
        if angles is not None:
            q, k = self.rotary(q, angles), self.rotary(k, angles)
        if self.lib is not None and self.head_dim % ATTEND_FULL_LANES == 0:
            return self._native_attention(q, k, v, groups)
        out = torch.empty_like(x)
        for start, end, n in groups:
            # [B, n, H, D] -> [B, H, n, D]: inputs of one length side by side, no padding.
            shape = ((end - start) // n, n, self.n_heads, self.head_dim)
            attn = F.scaled_dot_product_attention(*(t[start:end].view(shape).transpose(1, 2) for t in (q, k, v)))
            out[start:end] = attn.transpose(1, 2).reshape(end - start, self.n_embd)
        return out

    def _native_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          groups: list[tuple[int, int, int]]) -> torch.Tensor:
        """The same on the native threads (src/encoder_attention.cpp): 1.4-1.7x PyTorch's, and no
        OpenMP team spinning beside the native pool between a step's phases."""
        q, k, v = (t.reshape(-1, self.n_embd) for t in (q, k, v))
        scale = 1.0 / math.sqrt(self.head_dim)
        out = torch.empty(q.shape[0], self.n_embd)
        for start, end, n in groups:
            attend_full(self.lib, q[start:end], k[start:end], v[start:end], (end - start) // n, self.n_heads, scale,
                        out=out[start:end])
        return out


def _same_length_slices(lengths: list[int]) -> list[tuple[int, int, int]]:
    """(first row, end row, length) of each run of inputs of one length, for lengths in order."""
    groups: list[tuple[int, int, int]] = []
    first = 0
    for n in lengths:
        if groups and groups[-1][2] == n:
            groups[-1] = (groups[-1][0], first + n, n)
        else:
            groups.append((first, first + n, n))
        first += n
    return groups
