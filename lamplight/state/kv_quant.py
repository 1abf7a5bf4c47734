"""Quantized KV storage (`-ctk/-ctv q8_0 | q4_0`): each head's row of K or V in blocks of 32
values, in ggml's block formats and with its reference rounding (quantize_row_q8_0_ref,
quantize_row_q4_0_ref), so a value is stored as llama.cpp stores it.

A pool of a quantized type keeps each (head, token) row as `row_bytes(dim)` uint8 bytes; the
pool quantizes on write and dequantizes on read. Copying a token's bytes (block copy-on-write,
the prompt cache, slot files) needs no conversion; a read then write stores the same bytes
(dequantized values quantize back to themselves). The native forward reads and writes the same
layout (src/forward.cpp, LP_KV_Q8_0 / LP_KV_Q4_0).
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
        inverse = torch.where(d != 0, 1.0 / torch.where(d != 0, d, 1.0), 0.0)
        q = _round_half_away(blocks * inverse[..., None]).to(torch.int8)
        return torch.cat([_half_bytes(d), q.view(torch.uint8)], dim=-1)

    def _dequantize(self, blocks: torch.Tensor) -> torch.Tensor:
        d = _half_of(blocks[..., :2])
        return blocks[..., 2:].contiguous().view(torch.int8).to(torch.float32) * d[..., None]


class Q4_0(KVQuant):
    """d = (the value of largest magnitude) / -8 (fp16), then 32 4-bit values min(15, trunc(x / d
    + 8.5)): value j in the low nibble of byte j, value 16 + j in its high nibble."""

    def __init__(self):
        super().__init__("q4_0", 2 + BLOCK // 2, 4)

    def _quantize(self, blocks: torch.Tensor) -> torch.Tensor:
        magnitudes = blocks.abs()
        index = magnitudes.argmax(dim=-1, keepdim=True)  # the first of equal magnitudes, as ggml's strict >
        largest = blocks.gather(-1, index).squeeze(-1)
        largest = torch.where(magnitudes.amax(dim=-1) == 0, 0.0, largest)  # ggml's +0 start, never -0
        d = largest / -8.0
        inverse = torch.where(d != 0, 1.0 / torch.where(d != 0, d, 1.0), 0.0)
        q = torch.clamp(torch.trunc(blocks * inverse[..., None] + 8.5), max=15).to(torch.uint8)
        packed = q[..., :BLOCK // 2] | (q[..., BLOCK // 2:] << 4)
        return torch.cat([_half_bytes(d), packed], dim=-1)

    def _dequantize(self, blocks: torch.Tensor) -> torch.Tensor:
        d = _half_of(blocks[..., :2])
        packed = blocks[..., 2:]
        q = torch.cat([packed & 0x0F, packed >> 4], dim=-1).to(torch.float32) - 8.0
        return q * d[..., None]


Q8_0_TYPE, Q4_0_TYPE = Q8_0(), Q4_0()
# The quantized `-ctk/-ctv` types by name.
QUANT_TYPES: dict[str, KVQuant] = {t.name: t for t in (Q8_0_TYPE, Q4_0_TYPE)}
