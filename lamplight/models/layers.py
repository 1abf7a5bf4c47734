"""Building blocks of the PyTorch decoder: quantized linear, dense FFN, RMSNorm, RoPE, paged attention."""

from __future__ import annotations


import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..gguf.file import TensorInfo
from ..gguf.quant import dequantize
from ..kernels.linear import BATCH_INVARIANT_ROWS, DenseKernel
from ..state.torch_pools import TorchKVPool
from .activations import ACTIVATIONS
from .batch import QUERY_ROW_MULTIPLE, ForwardBatch
from .rope import RopeTables
from .rope_scaling import RopeScaling
from .spec import FeedForwardSpec, LinearSpec, RopeSpec


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
            # Rows in fixed blocks like the fast path's float32 kernels: a row's result does not
            # depend on how many rows share the step (MKL's kernels depend on the rows, DenseKernel).
            self._kernel = DenseKernel(torch.from_numpy(dequantize(self.info)), torch.float32, BATCH_INVARIANT_ROWS)
        return self._kernel

    @kernel.setter
    def kernel(self, kernel) -> None:
        self._kernel = kernel

    @property
    def weight(self) -> torch.Tensor:
        """The float32 weight (dequantized again if the kernel does not hold it)."""
        if isinstance(self._kernel, DenseKernel) and self._kernel.dtype == torch.float32:
            return self._kernel.weight
        return torch.from_numpy(dequantize(self.info))

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


class DenseFeedForward(nn.Module):
    def __init__(self, spec: FeedForwardSpec):
        super().__init__()
        self.gate_up = LinearGroup(spec.gate_up)
        (down,) = spec.down.weights
        self.down = QuantLinear(down)
        self.activation = ACTIVATIONS[spec.activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(self.activation(gate, up))


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

    def __init__(self, n_rot: int, base: float, max_pos: int, neox: bool, freq_factors: np.ndarray | None = None,
                 scaling: RopeScaling | None = None):
        super().__init__()
        self.n_rot = n_rot
        self.neox = neox
        # Unit rotations (rotate_by composes their angles); a scaled rope's magnitude is applied per step.
        tables = RopeTables.compute(n_rot, base, max_pos, freq_factors, scaling)
        self.magnitude = tables.magnitude
        self.register_buffer("cos", torch.from_numpy(tables.cos), persistent=False)
        self.register_buffer("sin", torch.from_numpy(tables.sin), persistent=False)

    @classmethod
    def from_spec(cls, rope: RopeSpec) -> "Rotary":
        return cls(rope.n_rot, rope.base, rope.max_pos, rope.neox, rope.freq_factors, rope.scaling)

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


def _row_block_bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b for a [N, M, K] (M a multiple of QUERY_ROW_MULTIPLE) and b [N, K, P], as one matrix
    product per item and block of QUERY_ROW_MULTIPLE rows: every product has the same shape
    whatever N and M are, so MKL sums each row alike (a batched product's kernels and thread split
    depend on the batch size on Intel's MKL paths). Compiled graphs, and other devices than the
    CPU (whose libraries are not MKL, and where a product a block would cost a launch each), keep
    the batched product."""
    if torch.compiler.is_compiling() or a.device.type != "cpu":
        return torch.bmm(a, b)
    out = a.new_empty(a.shape[0], a.shape[1], b.shape[2])
    for item in range(a.shape[0]):
        for row in range(0, a.shape[1], QUERY_ROW_MULTIPLE):
            torch.mm(a[item, row : row + QUERY_ROW_MULTIPLE], b[item], out=out[item, row : row + QUERY_ROW_MULTIPLE])
    return out


def _grouped_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor, scale: float,
                       shaping: ScoreShaping | None = None) -> torch.Tensor:
    """Attention of a group's queries as two batched matmuls over (KV head, sequence), for decode
    tokens and prompt chunks alike.

    Every operand is contiguous in one fixed layout, query rows are padded to QUERY_ROW_MULTIPLE
    (and multiplied in blocks of that many, _row_block_bmm) and keys to an aligned length
    (padding biased to -inf), so each query's result is
    bit-identical whatever else is in the batch and whether it is a decode token or a row of a
    prompt chunk (SDPA's kernels, and matmuls on strided views, sum in orders that depend on
    the shapes): the reproducibility rule on the PyTorch path.

    q: [B, Q, H, D]; keys, values: [Hkv, B, C, D] (as gathered); bias: [Hkv * B, M, C] with M
    the padded query rows (AttentionGroup.row_bias). Returns [B, Q, H * Dv].
    """
    b, n_q, n_heads, d = q.shape
    n_kv, _, c, dv = values.shape
    group = n_heads // n_kv
    rows = bias.shape[1]
    grouped = q.view(b, n_q, n_kv, group, d).permute(2, 0, 1, 3, 4).reshape(n_kv * b, n_q * group, d)
    if rows != n_q * group:
        grouped = F.pad(grouped, (0, 0, 0, rows - n_q * group))
    keys_t = keys.view(n_kv * b, c, d).transpose(1, 2)
    if shaping is None:
        probs = torch.softmax(_row_block_bmm(grouped, keys_t) * scale + bias, dim=-1)
    else:
        scores = shaping.cap(_row_block_bmm(grouped, keys_t) * scale) + bias
        sinks = None
        if shaping.sinks is not None:  # per query head -> this layout's (KV head, sequence, query, group) rows
            sinks = shaping.sinks.view(n_kv, 1, 1, group).expand(n_kv, b, n_q, group).reshape(n_kv * b, -1, 1)
            sinks = F.pad(sinks, (0, 0, 0, rows - n_q * group))
        probs = shaping.softmax(scores, sinks)
    out = _row_block_bmm(probs, values.view(n_kv * b, c, dv))[:, : n_q * group]  # [Hkv * B, Q * G, Dv]
    return out.reshape(n_kv, b, n_q, group, dv).permute(1, 2, 0, 3, 4).reshape(b, n_q, n_heads * dv)


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor | None,
    v: torch.Tensor | None,
    layer: int,
    kv: TorchKVPool,
    batch: ForwardBatch,
    scale: float,
    window: int | None = None,
    shaping: ScoreShaping | None = None,
) -> torch.Tensor:
    """Store this step's K/V in the pool, then attend every group of queries to its keys.

    q: [T, n_heads, head_dim_k]; k: [T, n_kv_heads, head_dim_k]; v: [T, n_kv_heads, head_dim_v];
    k and v None: a layer reading the K/V an earlier layer wrote this step (gemma4's shared KV).
    Returns [T, n_heads * head_dim_v].
    """
    if k is not None:
        kv.write(layer, batch.kv_write_slots, k, v)
    n_tokens, n_heads, _ = q.shape
    n_kv, _, dv = kv.layout.shape(layer)
    out = None
    for group in batch.groups:
        keys, values = kv.gather(layer, group.kv_index)  # [Hkv, B, C, D]
        keys, values = keys.to(q.dtype), values.to(q.dtype)
        b = keys.shape[1]
        bias = group.row_bias(window, n_kv, n_heads // n_kv)
        attn = _grouped_attention(q[group.query_rows], keys, values, bias, scale, shaping)  # [B, Q, H * Dv]
        if group.is_decode and group.leading_rows and b == n_tokens:
            return attn.view(b, -1)
        if out is None:
            out = q.new_empty(n_tokens, n_heads * dv)
        valid = group.query_valid
        out[group.query_rows[valid]] = attn[valid]
    return out


@torch.inference_mode()
def shift_kv(kv: TorchKVPool, layer_ropes: list[Rotary | None], src: torch.Tensor, dst: torch.Tensor,
             delta: int) -> None:
    """Move cached K/V entries from pool indices `src` to `dst`, re-rotating each layer's keys by
    `delta` positions with that layer's rope (context shift), so nothing has to be recomputed;
    keys of a layer without rope (None) move as they are."""
    for layer, rope in enumerate(layer_ropes):
        k, v = kv.read(layer, src)
        kv.write(layer, dst, k if rope is None else rope.rotate_by(k.float(), delta), v)
