"""stb_image's baseline JPEG decoder (stb_image.h, which llama.cpp's server decodes with), in numpy.

PIL's libjpeg uses another IDCT rounding, chroma upsampling and YCbCr conversion: up to 2 levels
apart on a photo, 3 after llama.cpp's bicubic resize. stb's integer IDCT (its SSE2 version is
bit-identical to the C one), its "fancy" triangle upsampling and its 20-bit fixed-point colour
conversion are reproduced exactly here. Huffman decoding is plain Python (about a second per
megapixel); everything after it is vectorized.

Baseline and extended-Huffman sequential files with 1 or 3 components (SOF0/SOF1) are read;
others (progressive, lossless, arithmetic, 12-bit, CMYK) raise UnsupportedJPEG and decode.py
falls back to PIL. Corrupt data is an ImageError, as stb's failure is llama.cpp's 400.
"""

from __future__ import annotations

import numpy as np

from .errors import ImageError

# Natural (row-major) index of the k-th coefficient in zigzag order; runs past 63 stay at 63 as in stb.
DEZIGZAG = [0, 1, 8, 16, 9, 2, 3, 10, 17, 24, 32, 25, 18, 11, 4, 5, 12, 19, 26, 33, 40, 48, 41, 34, 27, 20, 13,
            6, 7, 14, 21, 28, 35, 42, 49, 56, 57, 50, 43, 36, 29, 22, 15, 23, 30, 37, 44, 51, 58, 59, 52, 45, 38,
            31, 39, 46, 53, 60, 61, 54, 47, 55, 62, 63] + [63] * 15
RGB_COMPONENT_IDS = (82, 71, 66)  # 'R', 'G', 'B': stb then skips the colour transform


class UnsupportedJPEG(Exception):
    """A JPEG variant this decoder does not read (decode.py falls back to PIL)."""


def decode_baseline_jpeg(data: bytes) -> np.ndarray:
    """uint8 [height, width, 3] as stb_image decodes `data` with 3 requested channels."""
    try:
        frame = _parse(data)
    except (IndexError, KeyError, ValueError) as exc:
        raise ImageError(f"corrupt JPEG: {exc}") from None
    planes = [_idct_plane(c) for c in frame.components]
    return _to_rgb(frame, [_upsample(frame, c, p) for c, p in zip(frame.components, planes)])


class _Component:
    def __init__(self, ident: int, h: int, v: int, tq: int):
        self.id, self.h, self.v, self.tq = ident, h, v, tq
        self.dc_pred = 0


class _Frame:
    def __init__(self, width: int, height: int, components: list[_Component]):
        self.width, self.height, self.components = width, height, components
        self.h_max = max(c.h for c in components)
        self.v_max = max(c.v for c in components)
        self.mcus_x = -(-width // (8 * self.h_max))
        self.mcus_y = -(-height // (8 * self.v_max))
        for c in components:
            c.x = (width * c.h + self.h_max - 1) // self.h_max  # samples the component has
            c.y = (height * c.v + self.v_max - 1) // self.v_max
            c.coef = np.zeros((self.mcus_y * c.v, self.mcus_x * c.h, 64), dtype=np.int16)
        self.jfif = False
        self.adobe_transform: int | None = None


def _parse(data: bytes) -> _Frame:
    if data[:2] != b"\xff\xd8":
        raise ImageError("not a JPEG file (no SOI marker)")
    quant: dict[int, np.ndarray] = {}
    huffman: dict[tuple[int, int], tuple[list[int], list[int]]] = {}
    frame: _Frame | None = None
    restart_interval = 0
    jfif, adobe_transform = False, None
    pos = 2
    while True:
        while data[pos] != 0xFF or data[pos + 1] == 0xFF:  # stb skips fill bytes
            pos += 1
        marker = data[pos + 1]
        pos += 2
        if marker == 0xD9:  # EOI
            break
        if 0xD0 <= marker <= 0xD7 or marker == 0x01:
            continue
        length = int.from_bytes(data[pos : pos + 2], "big")
        body = data[pos + 2 : pos + length]
        if len(body) != length - 2:
            raise ImageError("truncated JPEG segment")
        pos += length
        if marker == 0xDB:
            _read_quant(body, quant)
        elif marker == 0xC4:
            _read_huffman(body, huffman)
        elif marker == 0xDD:
            restart_interval = int.from_bytes(body[:2], "big")
        elif marker in (0xC0, 0xC1):
            frame = _read_frame(body)
        elif 0xC2 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            raise UnsupportedJPEG(f"JPEG SOF{marker - 0xC0} (progressive, lossless or arithmetic)")
        elif marker == 0xE0 and body[:5] == b"JFIF\0":
            jfif = True
        elif marker == 0xEE and body[:5] == b"Adobe" and len(body) >= 12:
            adobe_transform = body[11]
        elif marker == 0xDA:
            if frame is None:
                raise ImageError("JPEG scan before its frame header")
            pos = _read_scan(data, pos, body, frame, quant, huffman, restart_interval)
    if frame is None:
        raise ImageError("JPEG without a frame header")
    frame.jfif, frame.adobe_transform = jfif, adobe_transform
    return frame


def _read_quant(body: bytes, quant: dict[int, np.ndarray]) -> None:
    pos = 0
    while pos < len(body):
        precision, table = body[pos] >> 4, body[pos] & 15
        pos += 1
        size = 2 if precision else 1
        values = [int.from_bytes(body[pos + i * size : pos + (i + 1) * size], "big") for i in range(64)]
        pos += 64 * size
        natural = np.zeros(64, dtype=np.int64)
        natural[DEZIGZAG[:64]] = values
        quant[table] = natural


def _read_huffman(body: bytes, huffman: dict) -> None:
    """Each table as two 65536-entry lookups by the next 16 bits: symbol and code length (0: invalid)."""
    pos = 0
    while pos < len(body):
        cls, table = body[pos] >> 4, body[pos] & 15
        counts = list(body[pos + 1 : pos + 17])
        symbols = body[pos + 17 : pos + 17 + sum(counts)]
        pos += 17 + sum(counts)
        lut_sym = np.zeros(1 << 16, dtype=np.int64)
        lut_len = np.zeros(1 << 16, dtype=np.int64)
        code, k = 0, 0
        for length in range(1, 17):
            for _ in range(counts[length - 1]):
                start = code << (16 - length)
                end = start + (1 << (16 - length))
                if end > 1 << 16:
                    raise ImageError("bad JPEG Huffman table")
                lut_sym[start:end], lut_len[start:end] = symbols[k], length
                code, k = code + 1, k + 1
            code <<= 1
        huffman[(cls, table)] = (lut_sym.tolist(), lut_len.tolist())


def _read_frame(body: bytes) -> _Frame:
    precision, height, width, n = body[0], int.from_bytes(body[1:3], "big"), int.from_bytes(body[3:5], "big"), body[5]
    if precision != 8:
        raise UnsupportedJPEG(f"{precision}-bit JPEG")
    if n not in (1, 3):
        raise UnsupportedJPEG(f"JPEG with {n} components")
    if width == 0 or height == 0:
        raise ImageError("JPEG with an empty size")
    comps = [_Component(body[6 + 3 * i], body[7 + 3 * i] >> 4, body[7 + 3 * i] & 15, body[8 + 3 * i]) for i in range(n)]
    if any(not 1 <= c.h <= 4 or not 1 <= c.v <= 4 for c in comps):
        raise ImageError("bad JPEG sampling factors")
    return _Frame(width, height, comps)


class _Bits:
    def __init__(self, data: bytes):
        self.data = data + b"\0" * 8  # stb feeds zero bits past the end of the segment
        self.pos = 0

    def peek16(self) -> int:
        p = self.pos
        return (int.from_bytes(self.data[p >> 3 : (p >> 3) + 3], "big") >> (8 - (p & 7))) & 0xFFFF

    def take(self, n: int) -> int:
        p = self.pos
        self.pos = p + n
        return (int.from_bytes(self.data[p >> 3 : (p >> 3) + 4], "big") >> (32 - (p & 7) - n)) & ((1 << n) - 1)


def _entropy_intervals(data: bytes, pos: int) -> tuple[list[bytes], int]:
    """The scan's entropy-coded data split at restart markers, unstuffed; and where it ends."""
    intervals, start = [], pos
    while True:
        pos = data.index(b"\xff", pos)
        nxt = data[pos + 1]
        if nxt == 0x00 or nxt == 0xFF:
            pos += 1 if nxt == 0xFF else 2
            continue
        intervals.append(data[start:pos].replace(b"\xff\x00", b"\xff"))
        if 0xD0 <= nxt <= 0xD7:
            pos += 2
            start = pos
            continue
        return intervals, pos


def _read_scan(data, pos, body, frame: _Frame, quant, huffman, restart_interval) -> int:
    n = body[0]
    by_id = {c.id: c for c in frame.components}
    scan = []
    for i in range(n):
        comp = by_id[body[1 + 2 * i]]
        tables = body[2 + 2 * i]
        scan.append((comp, huffman[(0, tables >> 4)], huffman[(1, tables & 15)], quant[comp.tq]))
    if body[1 + 2 * n] != 0 or body[2 + 2 * n] != 63:
        raise UnsupportedJPEG("JPEG scan with spectral selection")
    intervals, end = _entropy_intervals(data, pos)
    if n == 1:
        comp = scan[0][0]
        cols, rows = -(-comp.x // 8), -(-comp.y // 8)
        units = [[(0, by, bx)] for by in range(rows) for bx in range(cols)]
    else:
        units = [[(i, my * c.v + y, mx * c.h + x) for i, (c, *_rest) in enumerate(scan)
                  for y in range(c.v) for x in range(c.h)]
                 for my in range(frame.mcus_y) for mx in range(frame.mcus_x)]
    per_interval = restart_interval or len(units)
    for k in range(0, len(units), per_interval):
        if k // per_interval >= len(intervals):
            raise ImageError("JPEG scan data ends early")
        bits = _Bits(intervals[k // per_interval])
        for comp, *_ in scan:
            comp.dc_pred = 0
        for unit in units[k : k + per_interval]:
            for i, by, bx in unit:
                comp, dc, ac, q = scan[i]
                _decode_block(bits, comp, dc, ac, q, comp.coef[by, bx])
    return end


def _decode_block(bits: _Bits, comp: _Component, dc_table, ac_table, q: np.ndarray, out: np.ndarray) -> None:
    block = [0] * 64
    s = _huff(bits, dc_table)
    diff = _extend(bits.take(s), s) if s else 0
    comp.dc_pred += diff
    block[0] = comp.dc_pred * int(q[0])
    k = 1
    while k < 64:
        rs = _huff(bits, ac_table)
        s, r = rs & 15, rs >> 4
        if s == 0:
            if rs != 0xF0:
                break
            k += 16
            continue
        k += r
        zig = DEZIGZAG[k]
        k += 1
        block[zig] = _extend(bits.take(s), s) * int(q[zig])
    out[:] = np.asarray(block, dtype=np.int64).astype(np.int16)  # stb stores (short): 16-bit wrap


def _huff(bits: _Bits, table) -> int:
    window = bits.peek16()
    length = table[1][window]
    if length == 0:
        raise ImageError("corrupt JPEG: bad Huffman code")
    bits.pos += length
    return table[0][window]


def _extend(value: int, n: int) -> int:
    return value if value >= 1 << (n - 1) else value - (1 << n) + 1


def _f2f(x: float) -> int:
    """stbi__f2f: (int)(x * 4096 + 0.5), the float product then a double sum."""
    return int(float(np.float32(x) * np.float32(4096)) + 0.5)


_C = {name: _f2f(v) for name, v in dict(
    c0541=0.5411961, c1847=-1.847759065, c0765=0.765366865, c1175=1.175875602, c0298=0.298631336,
    c2053=2.053119869, c3072=3.072711026, c1501=1.501321110, c0899=-0.899976223, c2562=-2.562915447,
    c1961=-1.961570560, c0390=-0.390180644).items()}


def _idct_1d(s):
    """STBI__IDCT_1D on arrays: returns (x0, x1, x2, x3, t0, t1, t2, t3)."""
    c = _C
    p1 = (s[2] + s[6]) * c["c0541"]
    t2 = p1 + s[6] * c["c1847"]
    t3 = p1 + s[2] * c["c0765"]
    t0 = (s[0] + s[4]) * 4096
    t1 = (s[0] - s[4]) * 4096
    x0, x3, x1, x2 = t0 + t3, t0 - t3, t1 + t2, t1 - t2
    t0, t1, t2, t3 = s[7], s[5], s[3], s[1]
    p3, p4, p1, p2 = t0 + t2, t1 + t3, t0 + t3, t1 + t2
    p5 = (p3 + p4) * c["c1175"]
    t0, t1, t2, t3 = t0 * c["c0298"], t1 * c["c2053"], t2 * c["c3072"], t3 * c["c1501"]
    p1 = p5 + p1 * c["c0899"]
    p2 = p5 + p2 * c["c2562"]
    p3 = p3 * c["c1961"]
    p4 = p4 * c["c0390"]
    return x0, x1, x2, x3, t0 + p1 + p3, t1 + p2 + p4, t2 + p2 + p3, t3 + p1 + p4


def _idct_outputs(parts, bias: int, shift: int):
    x0, x1, x2, x3, t0, t1, t2, t3 = parts
    x0, x1, x2, x3 = x0 + bias, x1 + bias, x2 + bias, x3 + bias
    return [(x0 + t3) >> shift, (x1 + t2) >> shift, (x2 + t1) >> shift, (x3 + t0) >> shift,
            (x3 - t0) >> shift, (x2 - t1) >> shift, (x1 - t2) >> shift, (x0 - t3) >> shift]


def _idct_plane(comp: _Component) -> np.ndarray:
    """stbi__idct_block over every block: the component's samples [rows*8, cols*8] (uint8).
    (stb's all-zero-column shortcut gives the same values as the full pass.)"""
    rows, cols = comp.coef.shape[:2]
    d = comp.coef.reshape(-1, 8, 8).astype(np.int64)  # [block, v, u]
    cols_out = _idct_outputs(_idct_1d([d[:, k, :] for k in range(8)]), 512, 10)  # 8 x [block, u]
    v = np.stack(cols_out, axis=1)  # [block, y, u]
    rows_out = _idct_outputs(_idct_1d([v[:, :, k] for k in range(8)]), 65536 + (128 << 17), 17)
    pixels = np.clip(np.stack(rows_out, axis=2), 0, 255).astype(np.uint8)  # [block, y, x]
    return pixels.reshape(rows, cols, 8, 8).transpose(0, 2, 1, 3).reshape(rows * 8, cols * 8)


def _row_sources(frame: _Frame, comp: _Component) -> tuple[np.ndarray, np.ndarray]:
    """Per output row, stb's (near, far) component rows: its ystep walk in load_jpeg_image."""
    vs = frame.v_max // comp.v
    ystep, line0, line1, ypos = vs >> 1, 0, 0, 0
    near, far = [], []
    for _ in range(frame.height):
        bottom = ystep >= (vs >> 1)
        near.append(line1 if bottom else line0)
        far.append(line0 if bottom else line1)
        ystep += 1
        if ystep >= vs:
            ystep, line0, ypos = 0, line1, ypos + 1
            if ypos < comp.y:
                line1 += 1
    return np.asarray(near), np.asarray(far)


def _upsample(frame: _Frame, comp: _Component, plane: np.ndarray) -> np.ndarray:
    """The component at full resolution [height, width] (int64), with stb's resample kernels."""
    hs, vs = frame.h_max // comp.h, frame.v_max // comp.v
    w = -(-frame.width // hs)
    near_rows, far_rows = _row_sources(frame, comp)
    near = plane[near_rows, :w].astype(np.int64)
    far = plane[far_rows, :w].astype(np.int64)
    if hs == 1 and vs == 1:
        out = near
    elif hs == 1 and vs == 2:
        out = (3 * near + far + 2) >> 2
    elif hs == 2 and vs == 1:
        out = _upsample_h2(near)
    elif hs == 2 and vs == 2:
        out = _upsample_hv2(3 * near + far)
    else:
        out = np.repeat(near, hs, axis=1)  # stb's generic resampler: nearest
    return out[:, : frame.width]


def _upsample_h2(x: np.ndarray) -> np.ndarray:
    n, w = x.shape
    out = np.empty((n, 2 * w), dtype=np.int64)
    if w == 1:
        out[:] = x
        return out
    out[:, 0] = x[:, 0]
    out[:, 1] = (x[:, 0] * 3 + x[:, 1] + 2) >> 2
    mid = 3 * x[:, 1:-1] + 2
    out[:, 2:-2:2] = (mid + x[:, :-2]) >> 2
    out[:, 3:-2:2] = (mid + x[:, 2:]) >> 2
    out[:, -2] = (x[:, -2] * 3 + x[:, -1] + 2) >> 2
    out[:, -1] = x[:, -1]
    return out


def _upsample_hv2(t: np.ndarray) -> np.ndarray:
    """stbi__resample_row_hv_2 given t = 3 * near + far per column."""
    n, w = t.shape
    out = np.empty((n, 2 * w), dtype=np.int64)
    if w == 1:
        out[:] = (t + 2) >> 2
        return out
    out[:, 0] = (t[:, 0] + 2) >> 2
    out[:, 1:-1:2] = (3 * t[:, :-1] + t[:, 1:] + 8) >> 4
    out[:, 2:-1:2] = (3 * t[:, 1:] + t[:, :-1] + 8) >> 4
    out[:, -1] = (t[:, -1] + 2) >> 2
    return out


def _fixed(x: float) -> int:
    """stbi__float2fixed: ((int)(x * 4096.0f + 0.5f)) << 8, in float32."""
    return int(np.float32(x) * np.float32(4096) + np.float32(0.5)) << 8


def _to_rgb(frame: _Frame, comps: list[np.ndarray]) -> np.ndarray:
    if len(comps) == 1:
        return np.repeat(comps[0].astype(np.uint8)[:, :, None], 3, axis=2)
    ids = tuple(c.id for c in frame.components)
    if ids == RGB_COMPONENT_IDS or (frame.adobe_transform == 0 and not frame.jfif):
        return np.stack(comps, axis=2).astype(np.uint8)
    y, cb, cr = comps
    y_fixed = (y << 20) + (1 << 19)
    cb, cr = cb - 128, cr - 128
    r = (y_fixed + cr * _fixed(1.40200)) >> 20
    # stb keeps only the high 16 bits of the Cb term of green (to equal its SIMD version).
    g = (y_fixed + cr * -_fixed(0.71414) + ((cb * -_fixed(0.34414)) & ~0xFFFF)) >> 20
    b = (y_fixed + cb * _fixed(1.77200)) >> 20
    return np.clip(np.stack([r, g, b], axis=2), 0, 255).astype(np.uint8)
