"""Packing GGUF weights, exactly, into the layouts of the native matmul (src/qmatmul.h).

Every supported type splits exactly into small integers q and per-block float32 scales (and
mins): w = scale * q (+ min), with the very float32 operations gguf's dequantization does, so
`dequantize_packed(pack(info))` equals `lamplight.gguf.quant.dequantize(info)` bit for bit.
  LP_W4    (block 32, q 0..15):     Q4_0 (ZERO8: w = d (q - 8)), Q4_1 (d, m), Q4_K (d sc_j, -dmin m_j)
  LP_W8_32 (block 32, int8 q):      Q8_0, Q5_0 (q - 16), Q5_1 (d, m), Q5_K (d sc_j, -dmin m_j)
  LP_W8    (block 16, int8 q):      Q6_K (d sc_j, q - 32), Q3_K, Q2_K (d sc_j, -dmin m_j)
Products such as d * sc_j are computed here in float32, as gguf computes them, and stored.

The layout (one for every instruction set): a 64-byte header (its int32 at offset 16 holds the
flags), then the columns in groups of 16 (zero columns pad the last one), each group a run of
block records [quants][16 scales][16 mins if FLAG_MIN]; the quants are 64-byte chunks, one per
quad of 4 consecutive k, with byte 4 c + i = column c, k = 4 quad + i. In LP_W4 chunk t holds
quad t in its low nibbles and quad t + 4 in its high ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q
from gguf.quants import Q4_K

from ..gguf.file import TensorInfo

W4, W8, W8_32 = 1, 2, 3
FLAG_MIN, FLAG_ZERO8 = 1, 2
HEADER_BYTES, FLAGS_OFFSET, GROUP, ALIGN = 64, 16, 16, 64
BLOCK = {W4: 32, W8: 16, W8_32: 32}
QUANT_BYTES = {W4: 256, W8: 256, W8_32: 512}

FORMAT_OF = {
    Q.Q4_0: W4, Q.Q4_1: W4, Q.Q4_K: W4,
    Q.Q8_0: W8_32, Q.Q5_0: W8_32, Q.Q5_1: W8_32, Q.Q5_K: W8_32,
    Q.Q6_K: W8, Q.Q3_K: W8, Q.Q2_K: W8,
    Q.MXFP4: W8_32,
}
SUPPORTED = frozenset(FORMAT_OF)


@dataclass
class PackedWeight:
    format: int
    n: int
    k: int
    data: np.ndarray  # uint8, 64-byte aligned start


@dataclass
class _Parts:
    """A weight split exactly: q [n, k] (uint8 for W4, int8 otherwise), scale and min [n, k / block]."""

    format: int
    q: np.ndarray
    scale: np.ndarray
    min: np.ndarray | None
    zero8: bool = False


def can_pack(qtype) -> bool:
    return qtype in SUPPORTED


def pack(info: TensorInfo) -> PackedWeight:
    return _build(_split(info))


def pack_rows(infos: list[TensorInfo]) -> PackedWeight:
    """Several weights with the same k concatenated along n (fused Q/K/V, gate/up).

    W8_32 parts join W8 ones as pairs of 16-blocks; a Q4_0 part joins W4 ones with mins as
    its min = -8 d (exact up to the sign of a zero weight). W4 and W8 parts cannot share.
    """
    parts = [_split(info) for info in infos]
    if len({p.q.shape[1] for p in parts}) != 1:
        raise ValueError("pack_rows needs weights with the same number of input features")
    formats = {p.format for p in parts}
    if W4 in formats and len(formats) > 1:
        raise ValueError(f"4-bit and 8-bit weights cannot share a packed format: {[i.qtype.name for i in infos]}")
    if formats == {W8, W8_32}:
        parts = [_as_16_blocks(p) if p.format == W8_32 else p for p in parts]
    if any(p.min is not None for p in parts):
        parts = [_with_min(p) for p in parts]
    return _build(_Parts(parts[0].format, np.concatenate([p.q for p in parts]),
                         np.concatenate([p.scale for p in parts]),
                         None if parts[0].min is None else np.concatenate([p.min for p in parts]),
                         parts[0].zero8))


def dequantize_packed(p: PackedWeight) -> np.ndarray:
    """The packed weight as float32 [n, k], with the same float32 operations as gguf's dequantization."""
    flags = int(p.data[FLAGS_OFFSET:FLAGS_OFFSET + 4].view(np.int32)[0])
    block, qbytes = BLOCK[p.format], QUANT_BYTES[p.format]
    groups, nblk = -(-p.n // GROUP), p.k // block
    rec = qbytes + 64 * (2 if flags & FLAG_MIN else 1)
    body = p.data[HEADER_BYTES:HEADER_BYTES + groups * nblk * rec].reshape(groups, nblk, rec)
    q = _unchunk(body[..., :qbytes], p.format).astype(np.float32)

    def per_block(column: slice) -> np.ndarray:  # [groups, nblk, 16] floats -> [n, k / block, 1]
        values = np.ascontiguousarray(body[..., column]).view(np.float32)
        return values.transpose(0, 2, 1).reshape(groups * GROUP, nblk, 1)[:p.n]

    q = q[:p.n].reshape(p.n, nblk, block)
    if flags & FLAG_ZERO8:
        q -= np.float32(8)
    w = per_block(slice(qbytes, qbytes + 64)) * q
    if flags & FLAG_MIN:
        w = w + per_block(slice(qbytes + 64, qbytes + 128))
    return w.reshape(p.n, p.k)


# -- splitting GGUF blocks into q, scales and mins --------------------------------------------

def _f16(raw: np.ndarray) -> np.ndarray:
    """[..., 2] uint8 -> [...] float32."""
    return np.ascontiguousarray(raw).view(np.float16)[..., 0].astype(np.float32)


def _nibbles(qs: np.ndarray, chunk: int) -> np.ndarray:
    """[blocks, bytes] -> [blocks, 2 * bytes]: per chunk of bytes, the low nibbles, then the high ones."""
    pairs = qs.reshape(qs.shape[0], -1, 1, chunk) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    return (pairs & 0x0F).reshape(qs.shape[0], -1)


def _high_bits(qh: np.ndarray, n_values: int) -> np.ndarray:
    """Bit i of a little-endian bit field per block: [blocks, bytes] -> [blocks, n_values] in 0..1."""
    return np.unpackbits(qh, axis=-1, bitorder="little")[:, :n_values]


def _split(info: TensorInfo) -> _Parts:
    if info.qtype not in SUPPORTED:
        raise ValueError(f"{info.name}: {info.qtype.name} cannot be packed for the native kernels")
    n, k = info.shape
    t = info.qtype
    q, scale, mn, zero8 = _SPLITTERS[t](info.data.reshape(-1, GGML_QUANT_SIZES[t][1]))
    return _Parts(FORMAT_OF[t], q.reshape(n, k), scale.reshape(n, -1), None if mn is None else mn.reshape(n, -1), zero8)


def _q4_0(b):
    return _nibbles(b[:, 2:], 16), _f16(b[:, 0:2]), None, True


def _q4_1(b):
    return _nibbles(b[:, 4:], 16), _f16(b[:, 0:2]), _f16(b[:, 2:4]), False


def _k_scales(b):
    """Q4_K/Q5_K: (d * sc_j, -(dmin * m_j)) per 32-weight sub-block, [blocks, 8] float32."""
    d, dmin = _f16(b[:, 0:2])[:, None], _f16(b[:, 2:4])[:, None]
    sc, m = Q4_K.get_scale_min(b[:, 4:16].copy())
    return d * sc.astype(np.float32), -(dmin * m.astype(np.float32))


def _q4_k(b):
    scale, mn = _k_scales(b)
    return _nibbles(b[:, 16:], 32), scale, mn, False


def _q8_0(b):
    return b[:, 2:].view(np.int8), _f16(b[:, 0:2]), None, False


def _q5_0(b):
    q = _nibbles(b[:, 6:], 16) | (_high_bits(b[:, 2:6], 32) << 4)
    return q.view(np.int8) - np.int8(16), _f16(b[:, 0:2]), None, False


def _q5_1(b):
    q = _nibbles(b[:, 8:], 16) | (_high_bits(b[:, 4:8], 32) << 4)
    return q.view(np.int8), _f16(b[:, 0:2]), _f16(b[:, 2:4]), False


def _q5_k(b):
    scale, mn = _k_scales(b)
    # qh bit j of byte i is the high bit of sub-block j's value i.
    high = _high_bits(b[:, 16:48], 256).reshape(-1, 32, 8).transpose(0, 2, 1).reshape(-1, 256)
    q = _nibbles(b[:, 48:], 32) | (high << 4)
    return q.view(np.int8), scale, mn, False


def _q6_k(b):
    n_blocks = b.shape[0]
    ql = b[:, :128].reshape(n_blocks, 2, 1, 64) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    qh = b[:, 128:192].reshape(n_blocks, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    q = ((ql & 0x0F).reshape(n_blocks, 256) | ((qh & 0x03).reshape(n_blocks, 256) << 4)).view(np.int8) - np.int8(32)
    scale = _f16(b[:, 208:210])[:, None] * b[:, 192:208].view(np.int8).astype(np.float32)
    return q, scale, None, False


def _q3_k(b):
    n_blocks = b.shape[0]
    hmask, qs, packed, d = b[:, :32], b[:, 32:96], b[:, 96:108], _f16(b[:, 108:110])
    low = (packed[:, :8].reshape(n_blocks, 1, 8) >> np.array([0, 4], dtype=np.uint8).reshape(1, 2, 1)).reshape(n_blocks, 16)
    high = (packed[:, 8:].reshape(n_blocks, 1, 4) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 4, 1)).reshape(n_blocks, 16)
    sc = (((low & 0x0F) | ((high & 0x03) << 4)).view(np.int8) - np.int8(32)).astype(np.float32)
    ql = (qs.reshape(n_blocks, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)) & 0x03
    qh = (hmask.reshape(n_blocks, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 0x01
    # The high bit set means no offset; clear means -4.
    q = ql.reshape(n_blocks, 256).view(np.int8) - ((qh.reshape(n_blocks, 256) ^ 1) << 2).view(np.int8)
    return q, d[:, None] * sc, None, False


def _q2_k(b):
    n_blocks = b.shape[0]
    sc, qs = b[:, :16], b[:, 16:80]
    d, dmin = _f16(b[:, 80:82])[:, None], _f16(b[:, 82:84])[:, None]
    q = (qs.reshape(n_blocks, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)) & 0x03
    scale = d * (sc & 0x0F).astype(np.float32)
    mn = -(dmin * (sc >> 4).astype(np.float32))
    return q.reshape(n_blocks, 256).view(np.int8), scale, mn, False


# MXFP4's 4-bit codes as int8 multiples of half the block scale: w = 2^(e - 128) * q.
_MXFP4_Q = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.int8)


def _mxfp4(b):
    scale = np.ldexp(np.float32(1.0), b[:, 0].astype(np.int32) - 128).astype(np.float32)
    return _MXFP4_Q[_nibbles(b[:, 1:], 16)], scale, None, False


_SPLITTERS = {
    Q.Q4_0: _q4_0, Q.Q4_1: _q4_1, Q.Q4_K: _q4_k, Q.MXFP4: _mxfp4,
    Q.Q8_0: _q8_0, Q.Q5_0: _q5_0, Q.Q5_1: _q5_1, Q.Q5_K: _q5_k,
    Q.Q6_K: _q6_k, Q.Q3_K: _q3_k, Q.Q2_K: _q2_k,
}


# -- pack_rows helpers ---------------------------------------------------------------------------

def _as_16_blocks(p: _Parts) -> _Parts:
    """A W8_32 weight as W8: each 32-block's scale and min serve both of its 16-halves."""
    return _Parts(W8, p.q, np.repeat(p.scale, 2, axis=1), None if p.min is None else np.repeat(p.min, 2, axis=1))


def _with_min(p: _Parts) -> _Parts:
    if p.min is not None:
        return p
    if p.zero8:
        return _Parts(p.format, p.q, p.scale, -8 * p.scale)
    return _Parts(p.format, p.q, p.scale, np.zeros_like(p.scale))


# -- the layout ----------------------------------------------------------------------------------

def _chunks(q: np.ndarray, fmt: int) -> np.ndarray:
    """q [groups * 16, k] -> quant bytes [groups, k / block, quant bytes] (see the module docstring)."""
    groups, k, block = q.shape[0] // GROUP, q.shape[1], BLOCK[fmt]
    if fmt == W4:
        # [g, c, b, half, quad, i]: byte = (half 0) | (half 1) << 4, laid out [g, b, quad, c, i].
        q6 = q.reshape(groups, GROUP, k // 32, 2, 4, 4)
        packed = q6[:, :, :, 0] | (q6[:, :, :, 1] << 4)
        return packed.transpose(0, 2, 3, 1, 4).reshape(groups, k // 32, 256)
    q5 = q.view(np.uint8).reshape(groups, GROUP, k // block, block // 4, 4)
    return q5.transpose(0, 2, 3, 1, 4).reshape(groups, k // block, QUANT_BYTES[fmt])


def _unchunk(quants: np.ndarray, fmt: int) -> np.ndarray:
    """The inverse of _chunks: [groups, k / block, quant bytes] -> q [groups * 16, k] (int)."""
    groups, nblk = quants.shape[:2]
    if fmt == W4:
        packed = quants.reshape(groups, nblk, 4, GROUP, 4).transpose(0, 3, 1, 2, 4)  # [g, c, b, quad, i]
        q = np.stack([packed & 0x0F, packed >> 4], axis=3)  # [g, c, b, half, quad, i]
        return q.reshape(groups * GROUP, nblk * 32)
    block = BLOCK[fmt]
    q = quants.view(np.int8).reshape(groups, nblk, block // 4, GROUP, 4).transpose(0, 3, 1, 2, 4)
    return q.reshape(groups * GROUP, nblk * block)


def _aligned_empty(size: int) -> np.ndarray:
    raw = np.empty(size + ALIGN, dtype=np.uint8)
    start = -raw.ctypes.data % ALIGN
    return raw[start:start + size]


def _build(p: _Parts) -> PackedWeight:
    n, k = p.q.shape
    block, qbytes = BLOCK[p.format], QUANT_BYTES[p.format]
    if k % 32:
        raise ValueError(f"the native kernels need k to be a multiple of 32, not {k}")
    pad = -n % GROUP
    q, scale, mn = p.q, p.scale, p.min
    if pad:  # zero columns: q = 0, scale = 0, min = 0
        q = np.concatenate([q, np.zeros((pad, k), q.dtype)])
        scale = np.concatenate([scale, np.zeros((pad, scale.shape[1]), np.float32)])
        mn = None if mn is None else np.concatenate([mn, np.zeros((pad, mn.shape[1]), np.float32)])
    groups, nblk = (n + pad) // GROUP, k // block
    rec = qbytes + 64 * (1 if mn is None else 2)
    data = _aligned_empty(HEADER_BYTES + groups * nblk * rec)
    header = np.zeros(HEADER_BYTES // 4, np.int32)
    header[FLAGS_OFFSET // 4] = (FLAG_MIN if mn is not None else 0) | (FLAG_ZERO8 if p.zero8 else 0)
    data[:HEADER_BYTES] = header.view(np.uint8)
    body = data[HEADER_BYTES:].reshape(groups, nblk, rec)
    body[..., :qbytes] = _chunks(q, p.format)
    for offset, values in ((qbytes, scale), (qbytes + 64, mn)):
        if values is not None:  # [n, nblk] -> [groups, nblk, 16 floats]
            per_group = values.astype(np.float32, copy=False).reshape(groups, GROUP, nblk).transpose(0, 2, 1)
            body[..., offset:offset + 64] = np.ascontiguousarray(per_group).view(np.uint8)
    return PackedWeight(p.format, n, k, data)
