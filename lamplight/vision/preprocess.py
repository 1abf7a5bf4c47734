"""From a decoded image to the float images the encoder sees, per projector type, as llama.cpp's
libmtmd does it (clip.cpp `clip_image_preprocess`): resize with its own kernels (resize.py), pad,
tile, normalise. Each result is float32 [S, S, 3] (HWC), bit-identical to llama.cpp's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .config import VisionConfig
from .resize import F32, fit_with_padding, resize

BLACK = (0, 0, 0)
# LLaVA's pad colour in llama.cpp: the CLIP mean, in 0..255 and rounded.
LLAVA_PAD_COLOUR = (122, 116, 104)


@dataclass(frozen=True)
class Preprocessed:
    """The encoder inputs of one image, in prompt order (media chunk j = tiles[j])."""

    tiles: tuple[np.ndarray, ...]  # float32 [S, S, 3] each
    grid: tuple[int, int] | None = None  # (cols, rows) of the tiles before the overview (idefics3)


def normalize(image: np.ndarray, config: VisionConfig) -> np.ndarray:
    """uint8 -> (v / 255 - mean) / std per channel, all float32 as llama.cpp computes it."""
    return (image.astype(F32) / F32(255) - config.image_mean) / config.image_std


def preprocess_padded_square(image: np.ndarray, config: VisionConfig, kernel: str,
                             pad_colour: tuple[int, int, int]) -> Preprocessed:
    """One S x S tile: the image fitted into the square, keeping its aspect ratio (gemma3, mlp)."""
    size = config.image_size
    return Preprocessed((normalize(fit_with_padding(image, size, size, kernel, pad_colour), config),))


def preprocess_gemma3(image: np.ndarray, config: VisionConfig) -> Preprocessed:
    return preprocess_padded_square(image, config, "bilinear", BLACK)


def preprocess_llava(image: np.ndarray, config: VisionConfig) -> Preprocessed:
    return preprocess_padded_square(image, config, "bicubic", LLAVA_PAD_COLOUR)


def preprocess_idefics3(image: np.ndarray, config: VisionConfig) -> Preprocessed:
    """Tiles of a padded "refined" image (row-major), then the whole image stretched (overview)."""
    size = config.image_size
    h, w = image.shape[:2]
    refined_w, refined_h = idefics3_refined_size(w, h, size, config.preproc_image_size or 0)
    refined = fit_with_padding(image, refined_w, refined_h, "bicubic", BLACK)
    cols, rows = refined_w // size, refined_h // size
    tiles = [refined[r * size : (r + 1) * size, c * size : (c + 1) * size] for r in range(rows) for c in range(cols)]
    tiles.append(resize(image, size, size, "bilinear"))
    return Preprocessed(tuple(normalize(t, config) for t in tiles), grid=(cols, rows))


def idefics3_refined_size(w: int, h: int, tile: int, longest_edge: int) -> tuple[int, int]:
    """The tiled image's size: the longer side scaled to `longest_edge` (up or down), both sides
    rounded up to whole tiles; in float32, as llama.cpp (43 * (96 / 43) is 96.00001 there, one
    tile more than exact arithmetic gives). Without a longest edge: sides rounded to whole tiles."""
    if longest_edge <= 0:
        return tuple(max(tile, _round_half_away(F32(side) / F32(tile)) * tile) for side in (w, h))
    scale = min(F32(longest_edge) / F32(w), F32(longest_edge) / F32(h))
    return tuple(int(math.ceil((F32(side) * scale) / F32(tile))) * tile for side in (w, h))


def _round_half_away(x: np.float32) -> int:
    return int(math.floor(abs(float(x)) + 0.5)) * (1 if x >= 0 else -1)
