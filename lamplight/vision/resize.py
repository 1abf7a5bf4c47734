"""llama.cpp's own image resize kernels (tools/mtmd/clip.cpp), reproduced bit for bit in numpy.

They are not PIL's, torchvision's or OpenCV's: no antialiasing (a 2x2 or 4x4 neighbourhood is
sampled however much the image shrinks), a corner-aligned bilinear grid, a bicubic grid anchored at
the top-left corner, and llama.cpp's rounding. Every step below keeps the C code's float32 or
float64 type and operation order, because the projector sees the exact uint8 values and the
reference float images must match bit for bit. Images are uint8 arrays [height, width, 3].
"""

from __future__ import annotations

import numpy as np

F32 = np.float32


def resize_bilinear(image: np.ndarray, width: int, height: int) -> np.ndarray:
    """Corner-aligned bilinear: output pixel x samples source x * (w - 1) / (tw - 1); truncated."""
    h, w = image.shape[:2]
    x0, x1, fx = _bilinear_axis(w, width)
    y0, y1, fy = _bilinear_axis(h, height)
    # Only the sampled pixels become float32 (a large source is never copied whole).
    pick = lambda ys, xs: image[ys][:, xs].astype(F32)  # noqa: E731
    top = _lerp(pick(y0, x0), pick(y0, x1), fx[None, :, None])
    bottom = _lerp(pick(y1, x0), pick(y1, x1), fx[None, :, None])
    value = _lerp(top, bottom, fy[:, None, None])
    return value.astype(np.uint8)  # C's static_cast<uint8_t>: truncation (values are in 0..255)


def _bilinear_axis(size: int, target: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ratio = F32(size - 1) / F32(target - 1) if target > 1 else F32(0)
    pos = np.arange(target, dtype=F32) * ratio
    low = np.floor(pos).astype(np.int64)
    return low, np.minimum(low + 1, size - 1), pos - low.astype(F32)


def _lerp(a: np.ndarray, b: np.ndarray, t: np.ndarray) -> np.ndarray:
    return a + (b - a) * t


def resize_bicubic(image: np.ndarray, width: int, height: int) -> np.ndarray:
    """llama.cpp's bicubic: rows first (4 source columns per output column), then the 4 row
    results over y, both with the same cubic; rounded half away from zero, clamped to 0..255."""
    h, w = image.shape[:2]
    xs, dx = _bicubic_axis(w, width)  # xs: [tw, 4] source columns x-1..x+2, clamped
    ys, dy = _bicubic_axis(h, height)
    # The row pass depends only on (source row, output column): computed once per source row
    # (only the sampled columns become float32).
    across = _cubic(*(image[:, xs[:, k]].astype(F32) for k in range(4)), dx[None, :, None])  # [h, tw, 3]
    value = _cubic(*(across[ys[:, k]] for k in range(4)), dy[:, None, None])  # [th, tw, 3]
    return np.clip(_round_half_away(value), 0, 255).astype(np.uint8)


def _bicubic_axis(size: int, target: int) -> tuple[np.ndarray, np.ndarray]:
    step = F32(size) / F32(target)
    pos = step * np.arange(target, dtype=F32)  # float32 product, as `tx * j` in C
    base = pos.astype(np.int64)  # truncation, as `(int)(tx * j)`
    frac = pos - base.astype(F32)
    taps = np.clip(base[:, None] + np.arange(-1, 3)[None, :], 0, size - 1)
    return taps, frac


def _cubic(p0, p1, p2, p3, t):
    """The cubic through p0..p3 at t in [0, 1) from p1, as clip.cpp writes it: the coefficients in
    double (C's `-1.0 / 3 * d0` promotes), rounded to float32, then evaluated in float32."""
    d0 = (p0 - p1).astype(np.float64)
    d2 = (p2 - p1).astype(np.float64)
    d3 = (p3 - p1).astype(np.float64)
    a1 = (-1.0 / 3 * d0 + d2 - 1.0 / 6 * d3).astype(F32)
    a2 = (1.0 / 2 * d0 + 1.0 / 2 * d2).astype(F32)
    a3 = (-1.0 / 6 * d0 - 1.0 / 2 * d2 + 1.0 / 6 * d3).astype(F32)
    t = t.astype(F32)
    return p1 + a1 * t + (a2 * t) * t + ((a3 * t) * t) * t


def _round_half_away(x: np.ndarray) -> np.ndarray:
    """std::round (half away from zero) in float32, without the x + 0.5 rounding trap."""
    whole = np.trunc(x)
    return whole + np.sign(x) * (np.abs(x - whole) >= F32(0.5))


KERNELS = {"bilinear": resize_bilinear, "bicubic": resize_bicubic}


def resize(image: np.ndarray, width: int, height: int, kernel: str) -> np.ndarray:
    """`image` at width x height with `kernel`; an image already of that size is copied unchanged."""
    if image.shape[1] == width and image.shape[0] == height:
        return image.copy()
    return KERNELS[kernel](image, width, height)


def fit_with_padding(image: np.ndarray, width: int, height: int, kernel: str,
                     pad_colour: tuple[int, int, int]) -> np.ndarray:
    """Resize keeping the aspect ratio to fit width x height, centred on a pad-coloured canvas."""
    h, w = image.shape[:2]
    if w == width and h == height:
        return image.copy()
    scale = min(F32(width) / F32(w), F32(height) / F32(h))
    new_w = min(int(np.ceil(F32(w) * scale)), width)
    new_h = min(int(np.ceil(F32(h) * scale)), height)
    canvas = np.empty((height, width, 3), dtype=np.uint8)
    canvas[:] = np.asarray(pad_colour, dtype=np.uint8)
    left, top = (width - new_w) // 2, (height - new_h) // 2
    canvas[top : top + new_h, left : left + new_w] = resize(image, new_w, new_h, kernel)
    return canvas
