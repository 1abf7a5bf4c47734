"""The recurrent token mixers of the hybrid architectures, on the reference kernels.

Gated DeltaNet (qwen35, qwen35moe), LFM2's gated short convolution (lfm2) and Mamba2
(granitehybrid), as llama.cpp computes them (shared/reference/archs2/README.md has the
formulas). Each keeps a per-sequence state in the step's `ModelState.recurrent` pool
(lamplight.state.recurrent): the last K-1 inputs of its causal convolution and, for DeltaNet and
Mamba2, one matrix per head. A chunk reads its sequence's slot (`SequenceChunk.state_slot`) at
its start (zeros when it starts at position 0) and writes it back at its end.

Reproducibility: a position's state is computed one way whatever the chunking. The recurrence
runs token by token with the same operations for a prompt chunk and a decode step, the
convolution adds its taps in one fixed order, and every transcendental function is evaluated on
rows padded to a multiple of lamplight.models.activations.ALIGN floats, so each value takes the same (vector) code path
whether its row is alone or beside others. Decode tokens of several sequences are one batch of
the same operations; a prompt chunk is a batch of one. (The native forward, src/recurrent.cpp,
folds tokens one by one as well; a chunked parallel form for long prompts would need its chunk
boundaries at absolute multiples of its size to keep these bits.)
"""

from __future__ import annotations

from dataclasses import dataclass
import torch
import torch.nn.functional as F
from torch import nn

from ..state.torch_pools import TorchRecurrentPool
from .batch import ForwardBatch
from .activations import aligned
from .layers import LinearGroup
from .spec import DeltaNetSpec, Mamba2Spec, ShortConvSpec

SOFTPLUS_THRESHOLD = 20.0  # llama.cpp's softplus returns x above this


def softplus(x: torch.Tensor) -> torch.Tensor:
    return F.softplus(x, beta=1.0, threshold=SOFTPLUS_THRESHOLD)


def rms(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """RMSNorm over the last axis (as lamplight.models.layers.RMSNorm computes it)."""
    out = x * torch.rsqrt(x.square().mean(-1, keepdim=True).add_(eps))
    return out if weight is None else out * weight


@dataclass
class Segment:
    """Sequences whose chunks run through a recurrent layer as one batch: all single-token
    chunks of a step together, or one longer chunk."""

    rows: torch.Tensor  # [B, n] rows of the flattened batch, in position order
    slots: torch.Tensor  # [B] recurrent state slots
    fresh: torch.Tensor  # [B] bool: the chunk starts the sequence (state from zeros)


def recurrent_segments(batch: ForwardBatch, pool: TorchRecurrentPool) -> list[Segment]:
    """The step's segments, each chunk's start checked against its slot."""
    decode, segments, first_row, seen = [], [], 0, set()
    for chunk in batch.chunks:
        n = len(chunk.token_ids)
        pool.check_start(chunk.state_slot, chunk.start_pos)
        if chunk.state_slot in seen:
            raise ValueError(f"two chunks of one step on recurrent state slot {chunk.state_slot}")
        seen.add(chunk.state_slot)
        if n == 1:
            decode.append((first_row, chunk))
        else:
            segments.append(_segment([(first_row, chunk)], n, batch.device))
        first_row += n
    if decode:
        segments.insert(0, _segment(decode, 1, batch.device))
    return segments


def _segment(items: list, n: int, device) -> Segment:
    rows = torch.tensor([list(range(r, r + n)) for r, _ in items], dtype=torch.long, device=device)
    slots = torch.tensor([c.state_slot for _, c in items], dtype=torch.long, device=device)
    fresh = torch.tensor([c.start_pos == 0 for _, c in items], dtype=torch.bool, device=device)
    return Segment(rows, slots, fresh)


def commit_states(writes: list, pool: TorchRecurrentPool) -> None:
    """Write a finished step's new states (layer, slots, history, matrix) into the pool."""
    for layer, slots, history, matrix in writes:
        pool.write(layer, slots, history, matrix)


def causal_conv(history: torch.Tensor, u: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal convolution continuing `history`.

    history: [B, K-1, C] (the previous inputs); u: [B, n, C]; weight: [C, K] (tap K-1 multiplies
    the current token). Returns out [B, n, C] and the new history (the last K-1 inputs). The taps
    are added in order, elementwise, so each output is the same sum whatever n is."""
    window = torch.cat((history, u), dim=1)
    n, k = u.shape[1], weight.shape[1]
    out = window[:, :n] * weight[:, 0]
    for j in range(1, k):
        out = out + window[:, j : j + n] * weight[:, j]
    return out, window[:, n:]


class RecurrentMixer(nn.Module):
    """A layer's recurrent mixer: in_proj over every row, the per-sequence scan, out_proj.
    `index` is the layer's place in the recurrent state pool."""

    def __init__(self, in_proj, out, index: int):
        super().__init__()
        self.in_proj = LinearGroup(in_proj)
        self.out = LinearGroup(out)
        self.index = index

    def scan(self, proj: torch.Tensor, history: torch.Tensor, matrix: torch.Tensor | None):
        """proj: [B, n, in_proj outputs] -> (y [B, n, inner], history, matrix)."""
        raise NotImplementedError

    def forward(self, x: torch.Tensor, step) -> torch.Tensor:
        pool: TorchRecurrentPool = step.state.recurrent
        proj = self.in_proj(x)
        inner = None
        for seg in step.segments:
            history, matrix = pool.read(self.index, seg.slots)
            if bool(seg.fresh.any()):
                history[seg.fresh] = 0.0
                if matrix is not None:
                    matrix[seg.fresh] = 0.0
            y, history, matrix = self.scan(proj[seg.rows], history, matrix)
            step.state_writes.append((self.index, seg.slots, history, matrix))
            if inner is None:
                inner = y.new_empty(x.shape[0], y.shape[-1])
            inner[seg.rows.reshape(-1)] = y.reshape(-1, y.shape[-1])
        return self.out(inner)


class GatedDeltaNet(RecurrentMixer):
    """qwen35's linear attention: conv + silu over q|k|v, L2-normalised q/k, per v head the
    delta rule S <- exp(g) S; S <- S + beta (v - S k) k^T; o = S q / sqrt(d), then
    rms(o, ssm_norm) * silu(z)."""

    def __init__(self, spec: DeltaNetSpec, index: int, eps: float):
        super().__init__(spec.in_proj, spec.out, index)
        self.register_buffer("conv", spec.conv, persistent=False)
        self.register_buffer("dt_bias", spec.dt_bias, persistent=False)
        self.register_buffer("a", spec.a, persistent=False)
        self.register_buffer("norm", spec.norm, persistent=False)
        self.n_k, self.n_v, self.d, self.eps = spec.n_k_heads, spec.n_v_heads, spec.head_dim, eps
        self.channels = spec.conv.shape[0]
        # v head h reads q/k head h % n_k (the converter reorders v heads so that this holds)
        self.register_buffer("k_of_v", torch.arange(self.n_v) % self.n_k, persistent=False)

    def _l2(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.square().sum(-1, keepdim=True).add_(self.eps))

    def scan(self, proj, history, matrix):
        b, n, _ = proj.shape
        nk, nv, d = self.n_k, self.n_v, self.d
        mixed, z, beta, alpha = proj.split([self.channels, nv * d, nv, nv], dim=-1)
        conv, history = causal_conv(history, mixed, self.conv)
        c = aligned(F.silu, conv)
        q = self._l2(c[..., : nk * d].reshape(b, n, nk, d))[:, :, self.k_of_v] * d**-0.5
        k = self._l2(c[..., nk * d : 2 * nk * d].reshape(b, n, nk, d))[:, :, self.k_of_v]
        v = c[..., 2 * nk * d :].reshape(b, n, nv, d)
        beta = aligned(torch.sigmoid, beta)
        decay = aligned(torch.exp, aligned(softplus, alpha + self.dt_bias) * self.a)
        state = matrix  # [B, Hv, d_v, d_k]
        out = []
        for t in range(n):
            kt = k[:, t, :, None, :]
            state = state * decay[:, t, :, None, None]
            delta = (v[:, t] - (state * kt).sum(-1)) * beta[:, t, :, None]
            state = state + delta[..., None] * kt
            out.append((state * q[:, t, :, None, :]).sum(-1))
        o = rms(torch.stack(out, dim=1), self.norm, self.eps) * aligned(F.silu, z).reshape(b, n, nv, d)
        return o.reshape(b, n, nv * d), history, state


class ShortConv(RecurrentMixer):
    """LFM2's gated short convolution: [B; C; X] = in_proj h; y = C * conv(B * X)."""

    def __init__(self, spec: ShortConvSpec, index: int):
        super().__init__(spec.in_proj, spec.out, index)
        self.register_buffer("conv", spec.conv, persistent=False)

    def scan(self, proj, history, matrix):
        gate_b, gate_c, x = proj.chunk(3, dim=-1)
        conv, history = causal_conv(history, gate_b * x, self.conv)
        return gate_c * conv, history, matrix


class Mamba2(RecurrentMixer):
    """Mamba2: [z | xBC | dt] = in_proj h; xBC = silu(conv(xBC) + bias); per head h (B/C group
    h // (nh / G)) S <- exp(dt A) S + dt x B^T, y = S C + D x; y * silu(z), then grouped RMSNorm."""

    def __init__(self, spec: Mamba2Spec, index: int, eps: float):
        super().__init__(spec.in_proj, spec.out, index)
        for name in ("conv", "conv_bias", "dt_bias", "a", "d", "norm"):
            self.register_buffer(name, getattr(spec, name), persistent=False)
        self.nh, self.g, self.n, self.inner, self.eps = spec.n_heads, spec.n_groups, spec.d_state, spec.inner, eps
        self.register_buffer("group_of_head", torch.arange(self.nh) // (self.nh // self.g), persistent=False)

    def scan(self, proj, history, matrix):
        b, n, _ = proj.shape
        nh, g, ns, inner = self.nh, self.g, self.n, self.inner
        p = inner // nh
        z, xbc, dt = proj.split([inner, inner + 2 * g * ns, nh], dim=-1)
        conv, history = causal_conv(history, xbc, self.conv)
        xbc = aligned(F.silu, conv + self.conv_bias)
        x = xbc[..., :inner].reshape(b, n, nh, p)
        bm = xbc[..., inner : inner + g * ns].reshape(b, n, g, ns)[:, :, self.group_of_head]
        cm = xbc[..., inner + g * ns :].reshape(b, n, g, ns)[:, :, self.group_of_head]
        dt = aligned(softplus, dt + self.dt_bias)
        decay = aligned(torch.exp, dt * self.a)
        x_dt = x * dt[..., None]
        state = matrix  # [B, nh, P, N]
        out = []
        for t in range(n):
            state = state * decay[:, t, :, None, None] + x_dt[:, t, :, :, None] * bm[:, t, :, None, :]
            out.append((state * cm[:, t, :, None, :]).sum(-1) + self.d[:, None] * x[:, t])
        y = torch.stack(out, dim=1).reshape(b, n, inner) * aligned(F.silu, z)
        y = rms(y.reshape(b, n, g, inner // g), self.norm, self.eps)
        return y.reshape(b, n, inner), history, state


def build_mixer(spec, index: int, eps: float) -> RecurrentMixer:
    if isinstance(spec, DeltaNetSpec):
        return GatedDeltaNet(spec, index, eps)
    if isinstance(spec, ShortConvSpec):
        return ShortConv(spec, index)
    if isinstance(spec, Mamba2Spec):
        return Mamba2(spec, index, eps)
    raise TypeError(f"no PyTorch module for {type(spec).__name__}")
