"""The quantized KV types' codecs on PyTorch tensors (lamplight.state.kv_quant describes the
types): ggml's reference rounding, block by block, to the byte. What the PyTorch pools
(lamplight.state.torch_pools) write and read through; the native forward has its own
(src/kv_rows.cpp), which stores the same bytes."""

from __future__ import annotations

from typing import Callable

import torch

from .kv_quant import BLOCK, KVQuant


def quantize(kind: KVQuant, x: torch.Tensor) -> torch.Tensor:
    """float [..., dim] -> uint8 [..., row_bytes(dim)]."""
    dim = x.shape[-1]
    blocks = x.to(torch.float32).reshape(*x.shape[:-1], dim // BLOCK, BLOCK)
    return _CODECS[kind.name][0](blocks).reshape(*x.shape[:-1], kind.row_bytes(dim))


def dequantize(kind: KVQuant, raw: torch.Tensor, dim: int) -> torch.Tensor:
    """uint8 [..., row_bytes(dim)] -> float32 [..., dim]."""
    blocks = raw.reshape(*raw.shape[:-1], dim // BLOCK, kind.block_bytes)
    return _CODECS[kind.name][1](blocks).reshape(*raw.shape[:-1], dim)


def _round_half_away(x: torch.Tensor) -> torch.Tensor:
    """C's roundf: halves away from zero (torch.round rounds them to even). Written with the
    fraction, which float32 holds exactly (floor(|x| + 0.5) would round 0.49999997 up)."""
    whole = torch.trunc(x)
    return whole + torch.sign(x) * ((x - whole).abs() >= 0.5)


def _inverse(d: torch.Tensor) -> torch.Tensor:
    """1 / d, and 0 where d is 0 (ggml's `id = d ? 1.0f/d : 0.0f`)."""
    return torch.where(d != 0, 1.0 / torch.where(d != 0, d, 1.0), 0.0)


def _half_bytes(d: torch.Tensor) -> torch.Tensor:
    """float32 [...] -> its fp16 as 2 little-endian bytes [..., 2]."""
    return d.to(torch.float16).contiguous().view(torch.uint8).view(*d.shape, 2)


def _half_of(raw: torch.Tensor) -> torch.Tensor:
    """2 bytes [..., 2] -> the fp16 they hold, as float32 [...]."""
    return raw.contiguous().view(torch.float16).squeeze(-1).to(torch.float32)


def _signed_scale(blocks: torch.Tensor, levels: float) -> torch.Tensor:
    """q4_0/q5_0's scale: the value of largest magnitude (the first of equal ones, as ggml's
    strict >; +0 for an all-zero block, never -0) over -levels."""
    magnitudes = blocks.abs()
    largest = blocks.gather(-1, magnitudes.argmax(dim=-1, keepdim=True)).squeeze(-1)
    largest = torch.where(magnitudes.amax(dim=-1) == 0, 0.0, largest)
    return largest / -levels


def _nibbles(q: torch.Tensor) -> torch.Tensor:
    """Values [..., 32] -> 16 bytes: value j's low 4 bits in byte j's low nibble, value 16 + j's
    in its high nibble."""
    q = q.to(torch.uint8)
    return (q[..., :BLOCK // 2] & 0x0F) | ((q[..., BLOCK // 2:] & 0x0F) << 4)


def _from_nibbles(packed: torch.Tensor) -> torch.Tensor:
    return torch.cat([packed & 0x0F, packed >> 4], dim=-1).to(torch.int64)


_BIT = 1 << torch.arange(BLOCK, dtype=torch.int64)


def _fifth_bits(q: torch.Tensor) -> torch.Tensor:
    """q5's qh: bit 4 of value e as bit e of a little-endian uint32 [..., 4 bytes]."""
    qh = (((q.to(torch.int64) >> 4) & 1) * _BIT).sum(dim=-1, keepdim=True)
    return torch.cat([(qh >> (8 * k)) & 0xFF for k in range(4)], dim=-1).to(torch.uint8)


def _with_fifth_bits(low: torch.Tensor, qh_bytes: torch.Tensor) -> torch.Tensor:
    qh = sum(qh_bytes[..., k:k + 1].to(torch.int64) << (8 * k) for k in range(4))
    return low | (((qh >> torch.arange(BLOCK, dtype=torch.int64)) & 1) << 4)


def _q8_0(blocks: torch.Tensor) -> torch.Tensor:
    """d = max|x| / 127 (fp16), then 32 int8 values round(x / d)."""
    d = blocks.abs().amax(dim=-1) / 127.0
    q = _round_half_away(blocks * _inverse(d)[..., None]).to(torch.int8)
    return torch.cat([_half_bytes(d), q.view(torch.uint8)], dim=-1)


def _q8_0_values(blocks: torch.Tensor) -> torch.Tensor:
    d = _half_of(blocks[..., :2])
    return blocks[..., 2:].contiguous().view(torch.int8).to(torch.float32) * d[..., None]


def _q4_0(blocks: torch.Tensor) -> torch.Tensor:
    """d = (the value of largest magnitude) / -8 (fp16), then 32 4-bit values min(15, trunc(x / d
    + 8.5)), read as (q - 8) d."""
    d = _signed_scale(blocks, 8.0)
    q = torch.clamp(torch.trunc(blocks * _inverse(d)[..., None] + 8.5), max=15)
    return torch.cat([_half_bytes(d), _nibbles(q)], dim=-1)


def _q4_0_values(blocks: torch.Tensor) -> torch.Tensor:
    d = _half_of(blocks[..., :2])
    return (_from_nibbles(blocks[..., 2:]) - 8).to(torch.float32) * d[..., None]


def _q4_1(blocks: torch.Tensor) -> torch.Tensor:
    """d = (max - min) / 15 and m = min (fp16 each), then 32 4-bit values min(15, trunc((x - min) /
    d + 0.5)), read as q d + m."""
    low, high = blocks.amin(dim=-1), blocks.amax(dim=-1)
    d = (high - low) / 15.0
    q = torch.clamp(torch.trunc((blocks - low[..., None]) * _inverse(d)[..., None] + 0.5), max=15)
    return torch.cat([_half_bytes(d), _half_bytes(low), _nibbles(q)], dim=-1)


def _q4_1_values(blocks: torch.Tensor) -> torch.Tensor:
    d, m = _half_of(blocks[..., :2]), _half_of(blocks[..., 2:4])
    return _from_nibbles(blocks[..., 4:]).to(torch.float32) * d[..., None] + m[..., None]


def _q5_0(blocks: torch.Tensor) -> torch.Tensor:
    """q4_0 with a fifth bit: d = (the value of largest magnitude) / -16, values min(31, trunc(x /
    d + 16.5)) read as (q - 16) d; the fifth bits in a uint32 before the nibbles."""
    d = _signed_scale(blocks, 16.0)
    q = torch.clamp(torch.trunc(blocks * _inverse(d)[..., None] + 16.5), max=31)
    return torch.cat([_half_bytes(d), _fifth_bits(q), _nibbles(q)], dim=-1)


def _q5_0_values(blocks: torch.Tensor) -> torch.Tensor:
    d = _half_of(blocks[..., :2])
    q = _with_fifth_bits(_from_nibbles(blocks[..., 6:]), blocks[..., 2:6])
    return (q - 16).to(torch.float32) * d[..., None]


def _q5_1(blocks: torch.Tensor) -> torch.Tensor:
    """q4_1 with a fifth bit: d = (max - min) / 31, m = min, values trunc((x - min) / d + 0.5)
    read as q d + m."""
    low, high = blocks.amin(dim=-1), blocks.amax(dim=-1)
    d = (high - low) / 31.0
    q = torch.trunc((blocks - low[..., None]) * _inverse(d)[..., None] + 0.5)
    return torch.cat([_half_bytes(d), _half_bytes(low), _fifth_bits(q), _nibbles(q)], dim=-1)


def _q5_1_values(blocks: torch.Tensor) -> torch.Tensor:
    d, m = _half_of(blocks[..., :2]), _half_of(blocks[..., 2:4])
    q = _with_fifth_bits(_from_nibbles(blocks[..., 8:]), blocks[..., 4:8])
    return q.to(torch.float32) * d[..., None] + m[..., None]


# ggml's kvalues_iq4nl: iq4_nl's 16 levels, denser near zero.
_IQ4_NL_LEVELS = torch.tensor([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
                              dtype=torch.float32)
_IQ4_NL_ZERO = 8  # the level an all-zero block's values get (ggml leaves them unset; the scale is 0)


def _nearest_level(x: torch.Tensor) -> torch.Tensor:
    """ggml's best_index_int8: the index of the level nearest x, ties to the upper one."""
    upper = torch.searchsorted(_IQ4_NL_LEVELS, x.contiguous(), right=True).clamp(1, 15)
    below, above = _IQ4_NL_LEVELS[upper - 1], _IQ4_NL_LEVELS[upper]
    nearest = torch.where(x - below < above - x, upper - 1, upper)
    return torch.where(x <= _IQ4_NL_LEVELS[0], 0, torch.where(x >= _IQ4_NL_LEVELS[15], 15, nearest))


def _iq4_nl(blocks: torch.Tensor) -> torch.Tensor:
    """d (fp16) and 32 indices into 16 non-linear levels, read as level d. As ggml's
    quantize_row_iq4_nl_ref (the KV cache's writer): the value of largest magnitude maps to level
    -127, every value to its nearest level, and d is then the least-squares scale for those levels
    with weights x^2, the sums taken value by value in order, as C adds them."""
    live = blocks.abs().amax(dim=-1) >= 1e-15  # ggml's GROUP_MAX_EPS
    inverse = 1.0 / torch.where(live, _signed_scale(blocks, 127.0), 1.0)
    levels = _nearest_level(blocks * inverse[..., None])
    q, weight = _IQ4_NL_LEVELS[levels], blocks * blocks
    sumqx = torch.zeros(blocks.shape[:-1])
    sumq2 = torch.zeros(blocks.shape[:-1])
    for j in range(BLOCK):  # in order, one product at a time: C's float sums
        wq = weight[..., j] * q[..., j]
        sumqx = sumqx + wq * blocks[..., j]
        sumq2 = sumq2 + wq * q[..., j]
    d = torch.where(live & (sumq2 > 0), sumqx / torch.where(sumq2 > 0, sumq2, 1.0), 0.0)
    levels = torch.where(live[..., None], levels, _IQ4_NL_ZERO)
    return torch.cat([_half_bytes(d), _nibbles(levels)], dim=-1)


def _iq4_nl_values(blocks: torch.Tensor) -> torch.Tensor:
    d = _half_of(blocks[..., :2])
    return _IQ4_NL_LEVELS[_from_nibbles(blocks[..., 2:])] * d[..., None]


Codec = Callable[[torch.Tensor], torch.Tensor]

# Each type's (quantize, dequantize) of blocks: float32 [..., 32] <-> uint8 [..., block_bytes].
_CODECS: dict[str, tuple[Codec, Codec]] = {
    "q8_0": (_q8_0, _q8_0_values),
    "q4_0": (_q4_0, _q4_0_values),
    "q4_1": (_q4_1, _q4_1_values),
    "q5_0": (_q5_0, _q5_0_values),
    "q5_1": (_q5_1, _q5_1_values),
    "iq4_nl": (_iq4_nl, _iq4_nl_values),
}
