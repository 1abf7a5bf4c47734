"""Image bytes -> RGB uint8 pixels, as llama.cpp's server decodes them (stb_image, 3 channels).

stb_image's rules, which PIL's `convert("RGB")` follows for the formats below except where noted:
alpha is dropped without compositing (a fully transparent pixel keeps its stored colour),
grayscale becomes R = G = B, palettes are expanded, 16-bit samples keep their high byte, EXIF
orientation is ignored. JPEG is decoded by stb's own decoder (jpeg.py) for baseline files, which
is what makes the float images equal llama.cpp's; PIL (libjpeg) differs from it by up to 2 levels
on 12% of a photo's pixels, and is used only for the JPEG variants jpeg.py does not read
(progressive, arithmetic-coded, 12-bit, CMYK).

Only formats stb_image reads are accepted: llama.cpp answers others (WebP, TIFF...) with an error.
Declared dimensions are checked against a pixel limit before any pixel is decoded.
"""

from __future__ import annotations

import hashlib
import io
import warnings
from dataclasses import dataclass

import numpy as np

from .errors import ImageError, ImageTooLargeError

# 50 megapixels: a large phone photo. The decoded image takes 3 bytes per pixel (150 MB here).
DEFAULT_MAX_PIXELS = 50_000_000

# PIL's names of the formats stb_image reads (PNM is "PPM" in PIL; MPO is a multi-picture JPEG).
STB_FORMATS = frozenset({"PNG", "JPEG", "MPO", "BMP", "GIF", "TGA", "PSD", "PPM"})


@dataclass(frozen=True)
class DecodedImage:
    pixels: np.ndarray  # uint8 [height, width, 3], RGB
    content_hash: str  # sha256 of the decoded pixels and size: what a prefix cache keys on

    @property
    def width(self) -> int:
        return self.pixels.shape[1]

    @property
    def height(self) -> int:
        return self.pixels.shape[0]

    @classmethod
    def from_pixels(cls, pixels: np.ndarray) -> "DecodedImage":
        pixels = np.ascontiguousarray(pixels, dtype=np.uint8)
        if pixels.ndim != 3 or pixels.shape[2] != 3 or 0 in pixels.shape:
            raise ImageError(f"an image must be [height, width, 3] uint8 pixels, got shape {pixels.shape}")
        digest = hashlib.sha256(f"rgb8 {pixels.shape[1]}x{pixels.shape[0]}\n".encode())
        digest.update(pixels.data)
        return cls(pixels, digest.hexdigest())


def decode_image(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS) -> DecodedImage:
    """Decode `data` like llama.cpp; ImageError if it is not a readable image, ImageTooLargeError
    if its declared size exceeds `max_pixels` (checked from the header, before decoding)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
    except Image.DecompressionBombError as exc:  # PIL's own, far larger limit (checked in open)
        raise ImageTooLargeError(f"image refused: its declared size exceeds the limit of {max_pixels} pixels "
                                 f"({exc})") from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        raise ImageError(f"the data is not an image lamplight can read ({len(data)} bytes: {exc})") from None
    with image:
        if image.format not in STB_FORMATS:
            raise ImageError(f"image format {image.format} is not supported "
                             f"(supported, as llama.cpp's stb_image: {', '.join(sorted(STB_FORMATS))})")
        width, height = image.size
        if width <= 0 or height <= 0:
            raise ImageError(f"image has an empty size {width}x{height}")
        if width * height > max_pixels:
            raise ImageTooLargeError(f"image of {width}x{height} = {width * height} pixels exceeds the limit of "
                                     f"{max_pixels} pixels")
        try:
            pixels = _pixels(image, data)
        except (OSError, ValueError, SyntaxError, EOFError) as exc:
            raise ImageError(f"the {image.format} image could not be decoded: {exc}") from None
    return DecodedImage.from_pixels(pixels)


def _pixels(image, data: bytes) -> np.ndarray:
    if image.format in ("JPEG", "MPO"):
        from .jpeg import UnsupportedJPEG, decode_baseline_jpeg

        try:
            return decode_baseline_jpeg(data)
        except UnsupportedJPEG:
            pass  # progressive, arithmetic, 12-bit or CMYK: libjpeg's result (within 2 levels)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. PIL's palette-transparency notice
        image.load()
    if image.mode.startswith("I;16") or image.mode == "I":
        # 16-bit grayscale: stb keeps the high byte (PIL's convert would clip at 255 instead).
        high = (np.asarray(image, dtype=np.uint32) >> 8).astype(np.uint8)
        return np.repeat(high[:, :, None], 3, axis=2)
    return np.asarray(image.convert("RGB"))
