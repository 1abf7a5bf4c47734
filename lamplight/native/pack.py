"""Packing GGUF weights, exactly, into the layouts of the native matmul (src/qmatmul.h).

Every supported type splits exactly into small integers q and per-block float32 scales (and
mins): w = scale * q (+ min), with the very float32 operations gguf's dequantization does, so
`dequantize_packed(pack(info))` equals `lamplight.gguf.quant.dequantize(info)` bit for bit.
  LP_W4    (block 32, q 0..15):     Q4_0 (ZERO8: w = d (q - 8)), Q4_1 (d, m), Q4_K (d sc_j, -dmin m_j)
  LP_W8_32 (block 32, int8 q):      Q8_0, Q5_0 (q - 16), Q5_1 (d, m), Q5_K (d sc_j, -dmin m_j)
  LP_W8    (block 16, int8 q):      Q3_K, Q2_K (d sc_j, -dmin m_j); Q6_K beside other 8-bit weights
  LP_W6    (block 16, q 0..63):     Q6_K (d sc_j, q - 32)
Products such as d * sc_j are computed here in float32, as gguf computes them, and stored; or,
for the k-quants (FLAG_SUPER), kept as gguf has them: a float32 d per 256 k and an int8 factor
per block, multiplied by the kernel. That product is exact (an fp16 times an integer of at most 8
bits), so both layouts give the same scales, and the super one reads 4.625 bits a Q4_K weight
instead of 6 (6.6 a Q6_K one instead of 8 as LP_W6 with float scales, 10 as LP_W8). The kernel
multiplies a super layout by activations with one scale per 256 k (as llama.cpp's Q8_K), adding
the blocks' integer sums times their factors in int32 (qmatmul.cpp), and a float one by
activations per block of 32.

The layout (one for every instruction set): a 64-byte header (its int32 at offset 16 holds the
flags), then the columns in groups of 16 (zero columns pad the last one). Without FLAG_SUPER a
group is a run of block records [quants][16 scales][16 mins if FLAG_MIN]; with it, a run of
super-blocks of 256 k, each [16 float32 d, or with FLAG_MIN 16 fp16 d and 16 fp16 dmin][the
blocks' 16 int8 scale factors each][their 16 min factors each, if FLAG_MIN] then the blocks'
quants. The quants are 64-byte chunks, one per quad of 4 consecutive k, with byte 4 c + i =
column c, k = 4 quad + i. In LP_W4 chunk t holds quad t in its low nibbles and quad t + 4 in its
high ones. LP_W6 stores q + 32 in three chunks: chunk 0 holds the low 4 bits of quads 0 (low
nibbles) and 2 (high), chunk 1 those of quads 1 and 3, chunk 2 the high 2 bits of quad j at
bits 2 j.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q
from gguf.quants import Q4_K

from ..gguf.file import TensorInfo

W4, W8, W8_32, W6 = 1, 2, 3, 4
FLAG_MIN, FLAG_ZERO8, FLAG_SUPER = 1, 2, 4
HEADER_BYTES, FLAGS_OFFSET, GROUP, ALIGN = 64, 16, 16, 64
SUPER = 256  # k per super-block (FLAG_SUPER)
BLOCK = {W4: 32, W8: 16, W8_32: 32, W6: 16}
QUANT_BYTES = {W4: 256, W8: 256, W8_32: 512, W6: 192}

FORMAT_OF = {
    Q.Q4_0: W4, Q.Q4_1: W4, Q.Q4_K: W4,
    Q.Q8_0: W8_32, Q.Q5_0: W8_32, Q.Q5_1: W8_32, Q.Q5_K: W8_32,
    Q.Q6_K: W6, Q.Q3_K: W8, Q.Q2_K: W8,
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
class _Factors:
    """Per-block scales (or mins) as gguf's k-quants keep them: d [n, k / 256] float32 times an
    integer factor [n, k / block] (int8); d * factor is exact in float32."""

    d: np.ndarray
    factor: np.ndarray

    def values(self, block: int) -> np.ndarray:
        return np.repeat(self.d, SUPER // block, axis=1) * self.factor.astype(np.float32)


@dataclass
class _Parts:
    """A weight split exactly: q [n, k] (uint8 for W4, int8 otherwise), scale and min [n, k / block]
    (float32), and for the k-quants the same scales and mins as factors of d."""

    format: int
    q: np.ndarray
    scale: np.ndarray
    min: np.ndarray | None
    zero8: bool = False
    factors: tuple[_Factors, _Factors | None] | None = None


def can_pack(qtype) -> bool:
    return qtype in SUPPORTED


def pack(info: TensorInfo, super_scales: bool = True) -> PackedWeight:
    """`super_scales=False` stores a k-quant's scales as float32 products (FLAG_SUPER off)."""
    return _build(_split(info), super_scales)


def pack_rows(infos: list[TensorInfo], super_scales: bool = True) -> PackedWeight:
    """Several weights with the same k concatenated along n (fused Q/K/V, gate/up).

    W8_32 parts join W8 ones as pairs of 16-blocks; a Q4_0 part joins W4 ones with mins as
    its min = -8 d (exact up to the sign of a zero weight); W6 parts beside other 8-bit ones are
    W8 (their q - 32 as int8). W4 and 8-bit parts cannot share.
    """
    parts = [_split(info) for info in infos]
    if len({p.q.shape[1] for p in parts}) != 1:
        raise ValueError("pack_rows needs weights with the same number of input features")
    formats = {p.format for p in parts}
    if W4 in formats and len(formats) > 1:
        raise ValueError(f"4-bit and 8-bit weights cannot share a packed format: {[i.qtype.name for i in infos]}")
    if W6 in formats and len(formats) > 1:
        parts = [dataclasses.replace(p, format=W8) if p.format == W6 else p for p in parts]
        formats = {p.format for p in parts}
    if formats == {W8, W8_32}:
        parts = [_as_16_blocks(p) if p.format == W8_32 else p for p in parts]
    if any(p.min is not None for p in parts):
        parts = [_with_min(p) for p in parts]
    factors = None
    if all(p.factors is not None for p in parts):
        factors = (_join([p.factors[0] for p in parts]),
                   None if parts[0].min is None else _join([p.factors[1] for p in parts]))
    return _build(_Parts(parts[0].format, np.concatenate([p.q for p in parts]),
                         np.concatenate([p.scale for p in parts]),
                         None if parts[0].min is None else np.concatenate([p.min for p in parts]),
                         parts[0].zero8, factors), super_scales)


def dequantize_packed(p: PackedWeight) -> np.ndarray:
    """The packed weight as float32 [n, k], with the same float32 operations as gguf's dequantization."""
    flags = int(p.data[FLAGS_OFFSET:FLAGS_OFFSET + 4].view(np.int32)[0])
    block, qbytes = BLOCK[p.format], QUANT_BYTES[p.format]
    groups, nblk = -(-p.n // GROUP), p.k // block
    if flags & FLAG_SUPER:
        quants, scale, mn = _read_super(p, flags)
    else:
        rec = qbytes + 64 * (2 if flags & FLAG_MIN else 1)
        body = p.data[HEADER_BYTES:HEADER_BYTES + groups * nblk * rec].reshape(groups, nblk, rec)
        quants = body[..., :qbytes]
        scale = _per_column(np.ascontiguousarray(body[..., qbytes:qbytes + 64]).view(np.float32))
        mn = _per_column(np.ascontiguousarray(body[..., qbytes + 64:qbytes + 128]).view(np.float32)) \
            if flags & FLAG_MIN else None
    q = _unchunk(quants, p.format).astype(np.float32)[:p.n].reshape(p.n, nblk, block)
    if flags & FLAG_ZERO8:
        q -= np.float32(8)
    w = scale[:p.n, :, None] * q
    if mn is not None:
        w = w + mn[:p.n, :, None]
    return w.reshape(p.n, p.k)


def _per_column(values: np.ndarray) -> np.ndarray:
    """[groups, blocks, 16] -> [groups * 16, blocks]."""
    return values.transpose(0, 2, 1).reshape(values.shape[0] * GROUP, values.shape[1])


def _super_sizes(fmt: int, with_min: bool) -> tuple[int, int, int]:
    """(blocks per super-block, its header bytes, its bytes) for FLAG_SUPER: one 64-byte line of
    d (16 float32, or with mins 16 fp16 d and 16 fp16 dmin), then the factors."""
    per_super = SUPER // BLOCK[fmt]
    header = 64 + GROUP * per_super * (2 if with_min else 1)
    return per_super, header, header + per_super * QUANT_BYTES[fmt]


def _d_dtype(with_min: bool) -> type:
    return np.float16 if with_min else np.float32


def _read_super(p: PackedWeight, flags: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """A FLAG_SUPER body: quants [groups, blocks, quant bytes], scales and mins [groups * 16, blocks]."""
    with_min = bool(flags & FLAG_MIN)
    per_super, header, size = _super_sizes(p.format, with_min)
    groups, supers = -(-p.n // GROUP), p.k // SUPER
    body = p.data[HEADER_BYTES:HEADER_BYTES + groups * supers * size].reshape(groups, supers, size)
    quants = body[..., header:].reshape(groups, supers * per_super, QUANT_BYTES[p.format])
    d_dtype = _d_dtype(with_min)
    d_bytes = GROUP * np.dtype(d_dtype).itemsize

    def values(which: int) -> np.ndarray:
        d = np.ascontiguousarray(body[..., d_bytes * which:d_bytes * (which + 1)]).view(d_dtype).astype(np.float32)
        start = 64 + GROUP * per_super * which
        factor = body[..., start:start + GROUP * per_super].view(np.int8).reshape(groups, supers, per_super, GROUP)
        product = d[:, :, None, :] * factor.astype(np.float32)
        return _per_column(product.reshape(groups, supers * per_super, GROUP))

    return quants, values(0), values(1) if with_min else None


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
    split = _SPLITTERS[t](info.data.reshape(-1, GGML_QUANT_SIZES[t][1]))
    if isinstance(split[1], _Factors):  # a k-quant: one d per GGUF block of 256
        q, scale_f, min_f = split
        scale_f, min_f = (None if f is None else _Factors(f.d.reshape(n, -1), f.factor.reshape(n, -1))
                          for f in (scale_f, min_f))
        block = BLOCK[FORMAT_OF[t]]
        return _Parts(FORMAT_OF[t], q.reshape(n, k), scale_f.values(block), None if min_f is None else min_f.values(block),
                      False, (scale_f, min_f))
    q, scale, mn, zero8 = split
    return _Parts(FORMAT_OF[t], q.reshape(n, k), scale.reshape(n, -1), None if mn is None else mn.reshape(n, -1), zero8)


def _q4_0(b):
    return _nibbles(b[:, 2:], 16), _f16(b[:, 0:2]), None, True


def _q4_1(b):
    return _nibbles(b[:, 4:], 16), _f16(b[:, 0:2]), _f16(b[:, 2:4]), False


# The k-quants' splitters return (q, scale factors, min factors or None): w = d f q + dmin f' (per
# GGUF block of 256, d and dmin [blocks, 1]; factors [blocks, sub-blocks]).

def _k_scales(b):
    """Q4_K/Q5_K: d * sc_j and -dmin * m_j per 32-weight sub-block (-(dmin m) is (-dmin) m)."""
    d, dmin = _f16(b[:, 0:2])[:, None], _f16(b[:, 2:4])[:, None]
    sc, m = Q4_K.get_scale_min(b[:, 4:16].copy())
    return _Factors(d, sc.astype(np.int8)), _Factors(-dmin, m.astype(np.int8))


def _q4_k(b):
    scale, mn = _k_scales(b)
    return _nibbles(b[:, 16:], 32), scale, mn


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
    return q.view(np.int8), scale, mn


def _q6_k(b):
    n_blocks = b.shape[0]
    ql = b[:, :128].reshape(n_blocks, 2, 1, 64) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    qh = b[:, 128:192].reshape(n_blocks, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    q = ((ql & 0x0F).reshape(n_blocks, 256) | ((qh & 0x03).reshape(n_blocks, 256) << 4)).view(np.int8) - np.int8(32)
    return q, _Factors(_f16(b[:, 208:210])[:, None], b[:, 192:208].view(np.int8).copy()), None


def _q3_k(b):
    n_blocks = b.shape[0]
    hmask, qs, packed, d = b[:, :32], b[:, 32:96], b[:, 96:108], _f16(b[:, 108:110])
    low = (packed[:, :8].reshape(n_blocks, 1, 8) >> np.array([0, 4], dtype=np.uint8).reshape(1, 2, 1)).reshape(n_blocks, 16)
    high = (packed[:, 8:].reshape(n_blocks, 1, 4) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 4, 1)).reshape(n_blocks, 16)
    sc = ((low & 0x0F) | ((high & 0x03) << 4)).view(np.int8) - np.int8(32)
    ql = (qs.reshape(n_blocks, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)) & 0x03
    qh = (hmask.reshape(n_blocks, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 0x01
    # The high bit set means no offset; clear means -4.
    q = ql.reshape(n_blocks, 256).view(np.int8) - ((qh.reshape(n_blocks, 256) ^ 1) << 2).view(np.int8)
    return q, _Factors(d[:, None], sc), None


def _q2_k(b):
    n_blocks = b.shape[0]
    sc, qs = b[:, :16], b[:, 16:80]
    d, dmin = _f16(b[:, 80:82])[:, None], _f16(b[:, 82:84])[:, None]
    q = (qs.reshape(n_blocks, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)) & 0x03
    return (q.reshape(n_blocks, 256).view(np.int8), _Factors(d, (sc & 0x0F).view(np.int8)),
            _Factors(-dmin, (sc >> 4).view(np.int8)))


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
    factors = None
    if p.factors is not None:
        factors = tuple(None if f is None else _Factors(f.d, np.repeat(f.factor, 2, axis=1)) for f in p.factors)
    return _Parts(W8, p.q, np.repeat(p.scale, 2, axis=1), None if p.min is None else np.repeat(p.min, 2, axis=1),
                  factors=factors)


def _with_min(p: _Parts) -> _Parts:
    if p.min is not None:
        return p
    if p.zero8:
        return _Parts(p.format, p.q, p.scale, -8 * p.scale)
    factors = None
    if p.factors is not None:
        scale = p.factors[0]
        factors = (scale, _Factors(np.zeros_like(scale.d), np.zeros_like(scale.factor)))
    return _Parts(p.format, p.q, p.scale, np.zeros_like(p.scale), factors=factors)


def _join(factors: list[_Factors]) -> _Factors:
    return _Factors(np.concatenate([f.d for f in factors]), np.concatenate([f.factor for f in factors]))


# -- the layout ----------------------------------------------------------------------------------

def _chunks(q: np.ndarray, fmt: int) -> np.ndarray:
    """q [groups * 16, k] -> quant bytes [groups, k / block, quant bytes] (see the module docstring)."""
    groups, k, block = q.shape[0] // GROUP, q.shape[1], BLOCK[fmt]
    if fmt == W6:
        u = (q.astype(np.int16) + 32).astype(np.uint8).reshape(groups, GROUP, k // 16, 4, 4)  # [g, c, b, quad, i]
        low, high = u & 0x0F, u >> 4
        chunks = [low[:, :, :, 0] | (low[:, :, :, 2] << 4), low[:, :, :, 1] | (low[:, :, :, 3] << 4),
                  high[:, :, :, 0] | (high[:, :, :, 1] << 2) | (high[:, :, :, 2] << 4) | (high[:, :, :, 3] << 6)]
        # each [g, c, b, i] -> [g, b, c, i]: 64 bytes per chunk
        return np.concatenate([c.transpose(0, 2, 1, 3).reshape(groups, k // 16, 64) for c in chunks], axis=-1)
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
    if fmt == W6:
        c = quants.reshape(groups, nblk, 3, GROUP, 4).transpose(0, 3, 1, 2, 4).astype(np.int16)  # [g, c, b, chunk, i]
        low = [c[:, :, :, 0] & 0x0F, c[:, :, :, 1] & 0x0F, c[:, :, :, 0] >> 4, c[:, :, :, 1] >> 4]
        u = np.stack([low[j] | (((c[:, :, :, 2] >> (2 * j)) & 0x03) << 4) for j in range(4)], axis=3)  # [g, c, b, quad, i]
        return (u - 32).reshape(groups * GROUP, nblk * 16)
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


def _build(p: _Parts, super_scales: bool = True) -> PackedWeight:
    n, k = p.q.shape
    if k % 32:
        raise ValueError(f"the native kernels need k to be a multiple of 32, not {k}")
    if super_scales and p.factors is not None and k % SUPER == 0 and _d_fits(p):
        return _build_super(p)
    block, qbytes = BLOCK[p.format], QUANT_BYTES[p.format]
    rows = n + -n % GROUP  # zero columns: q = 0, scale = 0, min = 0
    q, scale = _padded(p.q, rows), _padded(p.scale, rows)
    mn = None if p.min is None else _padded(p.min, rows)
    groups, nblk = rows // GROUP, k // block
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


def _d_fits(p: _Parts) -> bool:
    """With mins the super layout keeps d and dmin as fp16: gguf's k-quants store them so, exactly."""
    if p.min is None:
        return True
    return all(np.array_equal(f.d.astype(np.float16).astype(np.float32), f.d) for f in p.factors)


def _padded(values: np.ndarray, rows: int) -> np.ndarray:
    """values [n, ...] with zero rows up to `rows` (zero columns of the weight); values itself
    when there are none to add (no copy of a large q)."""
    if rows == values.shape[0]:
        return values
    return np.concatenate([values, np.zeros((rows - values.shape[0], *values.shape[1:]), values.dtype)])


def _build_super(p: _Parts) -> PackedWeight:
    """FLAG_SUPER's layout (see the module docstring)."""
    n, k = p.q.shape
    with_min = p.min is not None
    rows = n + -n % GROUP
    groups, supers = rows // GROUP, k // SUPER
    per_super, header, size = _super_sizes(p.format, with_min)
    data = _aligned_empty(HEADER_BYTES + groups * supers * size)
    flags = np.zeros(HEADER_BYTES // 4, np.int32)
    flags[FLAGS_OFFSET // 4] = FLAG_SUPER | (FLAG_MIN if with_min else 0)
    data[:HEADER_BYTES] = flags.view(np.uint8)
    body = data[HEADER_BYTES:].reshape(groups, supers, size)
    quants = _chunks(_padded(p.q, rows), p.format)  # [groups, blocks, quant bytes]
    body[..., header:] = quants.reshape(groups, supers, per_super * QUANT_BYTES[p.format])
    d_dtype = _d_dtype(with_min)
    d_bytes = GROUP * np.dtype(d_dtype).itemsize
    for which, f in enumerate(p.factors[: 2 if with_min else 1]):
        d = _padded(f.d.astype(d_dtype), rows).reshape(groups, GROUP, supers).transpose(0, 2, 1)
        body[..., d_bytes * which:d_bytes * (which + 1)] = np.ascontiguousarray(d).view(np.uint8)
        factor = _padded(f.factor, rows).reshape(groups, GROUP, supers, per_super).transpose(0, 2, 3, 1)
        start = 64 + GROUP * per_super * which
        body[..., start:start + GROUP * per_super] = np.ascontiguousarray(factor).reshape(groups, supers, -1).view(np.uint8)
    return PackedWeight(p.format, n, k, data)
