"""Quantized KV storage (`-ctk/-ctv q8_0 | q4_0 | q4_1 | q5_0 | q5_1 | iq4_nl`): each head's row of K or V in
blocks of 32 values, in ggml's block formats and with its reference rounding (quantize_row_q8_0_ref
and the q4_0, q4_1, q5_0, q5_1, iq4_nl ones), so a value is stored as llama.cpp stores it.

A pool of a quantized type keeps each (head, token) row as `row_bytes(dim)` uint8 bytes; the
pool quantizes on write and dequantizes on read. Copying a token's bytes (block copy-on-write,
the prompt cache, slot files) needs no conversion; a read then write stores the same bytes
(dequantized values quantize back to themselves). The native forward reads and writes the same
layout (src/kv_rows.cpp, LP_KV_Q8_0 ... LP_KV_IQ4_NL).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

BLOCK = 32


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


@dataclass(frozen=True)
class KVQuant:
    """A block-quantized KV type: its llama.cpp name, the bytes of one block of 32 values, and
    the id the native forward knows it by."""

    name: str
    block_bytes: int
    native_id: int

    @property
    def bits(self) -> float:
        return self.block_bytes * 8 / BLOCK

    def row_bytes(self, dim: int) -> int:
        if dim % BLOCK:
            raise ValueError(f"-ctk/-ctv {self.name}: head size {dim} is not a multiple of {BLOCK}")
        return dim // BLOCK * self.block_bytes

    def quantize(self, x: torch.Tensor) -> torch.Tensor:
        """float [..., dim] -> uint8 [..., row_bytes(dim)]."""
        dim = x.shape[-1]
        blocks = x.to(torch.float32).reshape(*x.shape[:-1], dim // BLOCK, BLOCK)
        return self._quantize(blocks).reshape(*x.shape[:-1], self.row_bytes(dim))

    def dequantize(self, raw: torch.Tensor, dim: int) -> torch.Tensor:
        """uint8 [..., row_bytes(dim)] -> float32 [..., dim]."""
        blocks = raw.reshape(*raw.shape[:-1], dim // BLOCK, self.block_bytes)
        return self._dequantize(blocks).reshape(*raw.shape[:-1], dim)

    def _quantize(self, blocks: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _dequantize(self, blocks: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class Q8_0(KVQuant):
    """d = max|x| / 127 (fp16), then 32 int8 values round(x / d)."""

    def __init__(self):
        super().__init__("q8_0", 2 + BLOCK, 3)

    def _quantize(self, blocks: torch.Tensor) -> torch.Tensor:
        d = blocks.abs().amax(dim=-1) / 127.0
        q = _round_half_away(blocks * _inverse(d)[..., None]).to(torch.int8)
        return torch.cat([_half_bytes(d), q.view(torch.uint8)], dim=-1)

    def _dequantize(self, blocks: torch.Tensor) -> torch.Tensor:
        d = _half_of(blocks[..., :2])
        return blocks[..., 2:].contiguous().view(torch.int8).to(torch.float32) * d[..., None]


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


class Q4_0(KVQuant):
    """d = (the value of largest magnitude) / -8 (fp16), then 32 4-bit values min(15, trunc(x / d
    + 8.5)), read as (q - 8) d."""

    def __init__(self):
        super().__init__("q4_0", 2 + BLOCK // 2, 4)

    def _quantize(self, blocks: torch.Tensor) -> torch.Tensor:
        d = _signed_scale(blocks, 8.0)
        q = torch.clamp(torch.trunc(blocks * _inverse(d)[..., None] + 8.5), max=15)
        return torch.cat([_half_bytes(d), _nibbles(q)], dim=-1)

    def _dequantize(self, blocks: torch.Tensor) -> torch.Tensor:
        d = _half_of(blocks[..., :2])
        return (_from_nibbles(blocks[..., 2:]) - 8).to(torch.float32) * d[..., None]


class Q4_1(KVQuant):
    """d = (max - min) / 15 and m = min (fp16 each), then 32 4-bit values min(15, trunc((x - min) /
    d + 0.5)), read as q d + m."""

    def __init__(self):
        super().__init__("q4_1", 4 + BLOCK // 2, 5)

    def _quantize(self, blocks: torch.Tensor) -> torch.Tensor:
        low, high = blocks.amin(dim=-1), blocks.amax(dim=-1)
        d = (high - low) / 15.0
        q = torch.clamp(torch.trunc((blocks - low[..., None]) * _inverse(d)[..., None] + 0.5), max=15)
        return torch.cat([_half_bytes(d), _half_bytes(low), _nibbles(q)], dim=-1)

    def _dequantize(self, blocks: torch.Tensor) -> torch.Tensor:
        d, m = _half_of(blocks[..., :2]), _half_of(blocks[..., 2:4])
        return _from_nibbles(blocks[..., 4:]).to(torch.float32) * d[..., None] + m[..., None]


class Q5_0(KVQuant):
    """q4_0 with a fifth bit: d = (the value of largest magnitude) / -16, values min(31, trunc(x /
    d + 16.5)) read as (q - 16) d; the fifth bits in a uint32 before the nibbles."""

    def __init__(self):
        super().__init__("q5_0", 6 + BLOCK // 2, 6)

    def _quantize(self, blocks: torch.Tensor) -> torch.Tensor:
        d = _signed_scale(blocks, 16.0)
        q = torch.clamp(torch.trunc(blocks * _inverse(d)[..., None] + 16.5), max=31)
        return torch.cat([_half_bytes(d), _fifth_bits(q), _nibbles(q)], dim=-1)

    def _dequantize(self, blocks: torch.Tensor) -> torch.Tensor:
        d = _half_of(blocks[..., :2])
        q = _with_fifth_bits(_from_nibbles(blocks[..., 6:]), blocks[..., 2:6])
        return (q - 16).to(torch.float32) * d[..., None]


class Q5_1(KVQuant):
    """q4_1 with a fifth bit: d = (max - min) / 31, m = min, values trunc((x - min) / d + 0.5)
    read as q d + m."""

    def __init__(self):
        super().__init__("q5_1", 8 + BLOCK // 2, 7)

    def _quantize(self, blocks: torch.Tensor) -> torch.Tensor:
        low, high = blocks.amin(dim=-1), blocks.amax(dim=-1)
        d = (high - low) / 31.0
        q = torch.trunc((blocks - low[..., None]) * _inverse(d)[..., None] + 0.5)
        return torch.cat([_half_bytes(d), _half_bytes(low), _fifth_bits(q), _nibbles(q)], dim=-1)

    def _dequantize(self, blocks: torch.Tensor) -> torch.Tensor:
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


class IQ4_NL(KVQuant):
    """d (fp16) and 32 indices into 16 non-linear levels, read as level d. As ggml's
    quantize_row_iq4_nl_ref (the KV cache's writer): the value of largest magnitude maps to level
    -127, every value to its nearest level, and d is then the least-squares scale for those levels
    with weights x^2, the sums taken value by value in order, as C adds them."""

    def __init__(self):
        super().__init__("iq4_nl", 2 + BLOCK // 2, 8)

    def _quantize(self, blocks: torch.Tensor) -> torch.Tensor:
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

    def _dequantize(self, blocks: torch.Tensor) -> torch.Tensor:
        d = _half_of(blocks[..., :2])
        return _IQ4_NL_LEVELS[_from_nibbles(blocks[..., 2:])] * d[..., None]


# The quantized `-ctk/-ctv` types by name.
QUANT_TYPES: dict[str, KVQuant] = {t.name: t for t in (Q8_0(), Q4_0(), Q4_1(), Q5_0(), Q5_1(), IQ4_NL())}
