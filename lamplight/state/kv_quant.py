"""Quantized KV storage (`-ctk/-ctv q8_0 | q4_0 | q4_1 | q5_0 | q5_1 | iq4_nl`): each head's row of K or V in
blocks of 32 values, in ggml's block formats and with its reference rounding (quantize_row_q8_0_ref
and the q4_0, q4_1, q5_0, q5_1, iq4_nl ones), so a value is stored as llama.cpp stores it.

A pool of a quantized type keeps each (head, token) row as `row_bytes(dim)` uint8 bytes. The
native forward quantizes and dequantizes them itself (src/kv_rows.cpp, LP_KV_Q8_0 ...
LP_KV_IQ4_NL); the PyTorch pools do it with lamplight.state.kv_quant_torch's codecs, to the same
bytes. Copying a token's bytes (block copy-on-write, the prompt cache) needs no conversion; a
read then write stores the same bytes (dequantized values quantize back to themselves).

This module only describes the types (no torch).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BLOCK = 32


@dataclass(frozen=True)
class KVQuant:
    """A block-quantized KV type: its llama.cpp name, the bytes of one block of 32 values, and
    the id the native forward knows it by. Rows are stored as uint8 bytes."""

    name: str
    block_bytes: int
    native_id: int
    storage = np.uint8

    @property
    def bits(self) -> float:
        return self.block_bytes * 8 / BLOCK

    def row_bytes(self, dim: int) -> int:
        if dim % BLOCK:
            raise ValueError(f"-ctk/-ctv {self.name}: head size {dim} is not a multiple of {BLOCK}")
        return dim // BLOCK * self.block_bytes

    def row_width(self, dim: int) -> int:
        """Elements of `storage` (bytes) in a row of `dim` values."""
        return self.row_bytes(dim)


# The quantized `-ctk/-ctv` types by name: d (fp16) per block, then the values (q8_0: 32 int8;
# the 4-bit ones 16 bytes of nibbles; q4_1/q5_1 a second fp16, the minimum; q5's fifth bits in a
# uint32 before the nibbles).
QUANT_TYPES: dict[str, KVQuant] = {t.name: t for t in (
    KVQuant("q8_0", 2 + BLOCK, 3),
    KVQuant("q4_0", 2 + BLOCK // 2, 4),
    KVQuant("q4_1", 4 + BLOCK // 2, 5),
    KVQuant("q5_0", 6 + BLOCK // 2, 6),
    KVQuant("q5_1", 8 + BLOCK // 2, 7),
    KVQuant("iq4_nl", 2 + BLOCK // 2, 8),
)}
