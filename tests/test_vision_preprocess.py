"""Image decoding and preprocessing (lamplight.vision) against llama.cpp's decoded bitmaps and
float images (../shared/reference/vision: decoded/, embd/ pixels_<j>), which must be bit-exact."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
from conftest import reference_path

from lamplight.gguf.file import GGUFFile
from lamplight.vision import ImageError, ImageTooLargeError, decode_image
from lamplight.vision.config import read_vision_config
from lamplight.vision.jpeg import decode_baseline_jpeg
from lamplight.vision.model import PROJECTOR_KINDS
from lamplight.vision.preprocess import idefics3_refined_size

VISION = reference_path("vision")
IMAGES = [p.name for p in sorted((VISION / "images").iterdir())]
TYPES = sorted(PROJECTOR_KINDS)


def reference_decoded(name: str) -> np.ndarray:
    return np.load(VISION / "decoded" / f"{name.rsplit('.', 1)[0]}.npy")


def reference_pixels(projector_type: str, name: str) -> list[np.ndarray]:
    z = np.load(VISION / "embd" / f"{projector_type}__{name.rsplit('.', 1)[0]}.npz")
    return [z[f"pixels_{j}"] for j in range(sum(k.startswith("pixels_") for k in z.files))]


def config_of(projector_type: str):
    return read_vision_config(GGUFFile(VISION / "mmproj" / f"mmproj-{projector_type}.gguf"))


@pytest.mark.parametrize("name", IMAGES)
def test_decode_equals_llama_cpp(name):
    """PNG (RGB, RGBA without compositing, grayscale) and JPEG (stb's own decoder) bit for bit."""
    decoded = decode_image((VISION / "images" / name).read_bytes())
    np.testing.assert_array_equal(decoded.pixels, reference_decoded(name))


@pytest.mark.parametrize("projector_type", TYPES)
@pytest.mark.parametrize("name", IMAGES)
def test_preprocess_bit_exact(projector_type, name):
    """From the image file through our decoder: every float image equals llama.cpp's exactly."""
    config = config_of(projector_type)
    image = decode_image((VISION / "images" / name).read_bytes())
    got = PROJECTOR_KINDS[projector_type].preprocess(image.pixels, config).tiles
    want = reference_pixels(projector_type, name)
    assert len(got) == len(want)
    for j, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == np.float32 and g.shape == w.shape, j
        assert np.array_equal(g, w), f"tile {j}: max diff {np.abs(g - w).max()}"


def test_refined_size_in_float32():
    """README 3.4: 43 * (96 / 43) is 96.00001 in float32, which makes 4 tiles of 32, not 3."""
    assert idefics3_refined_size(43, 20, 32, 96) == (128, 64)
    assert idefics3_refined_size(200, 50, 32, 64) == (64, 32)
    assert idefics3_refined_size(100, 50, 32, 0) == (96, 64)  # no longest edge: rounded to tiles


# -- JPEG variants: no llama.cpp record beyond photo_120x90.jpg, so against libjpeg (PIL), which
# differs from stb by a few levels of IDCT / upsampling rounding; a structural mistake (block order,
# sampling, restart handling) gives differences of tens of levels.

def _jpeg(width: int, height: int, **save) -> tuple[bytes, np.ndarray]:
    from PIL import Image

    y, x = np.mgrid[0:height, 0:width]
    noise = np.random.default_rng(width * height).integers(-20, 20, (height, width, 3))
    base = np.stack([x * 255 // max(width - 1, 1), y * 255 // max(height - 1, 1), (x + y) * 3 % 256], -1)
    pixels = np.clip(base + noise, 0, 255).astype(np.uint8)
    mode = save.pop("mode", "RGB")
    buf = io.BytesIO()
    Image.fromarray(pixels).convert(mode).save(buf, "JPEG", **save)
    data = buf.getvalue()
    return data, np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


@pytest.mark.parametrize("save", [
    dict(subsampling=0), dict(subsampling=2), dict(subsampling=1), dict(mode="L"),
    dict(restart_marker_blocks=3), dict(quality=100, subsampling=0),
], ids=["444", "420", "422", "gray", "restarts", "q100"])
def test_jpeg_variants_close_to_libjpeg(save):
    data, libjpeg = _jpeg(53, 37, **dict(save))
    ours = decode_baseline_jpeg(data).astype(int)
    if save.get("subsampling") == 1:
        # stb's horizontal 2x upsampler weights the last sample pair the other way round
        # (stbi__resample_row_h_2: div4(input[w-2]*3 + input[w-1] + 2)): not libjpeg's last column.
        ours, libjpeg = ours[:, :-1], libjpeg[:, :-1]
    assert np.abs(ours - libjpeg).max() <= 4


def test_progressive_jpeg_falls_back_to_libjpeg():
    data, libjpeg = _jpeg(40, 30, progressive=True)
    np.testing.assert_array_equal(decode_image(data).pixels, libjpeg)


# -- other decoding rules (README 3.1) --------------------------------------------------------

def _png(width: int, height: int, bit_depth: int, colour_type: int, raw_rows: bytes) -> bytes:
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, bit_depth, colour_type, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw_rows)) + chunk(b"IEND", b"")


@pytest.mark.parametrize("colour_type,channels", [(0, 1), (2, 3), (6, 4)], ids=["gray16", "rgb16", "rgba16"])
def test_16_bit_png_keeps_the_high_byte(colour_type, channels):
    values = np.random.default_rng(channels).integers(0, 65536, (5, 7, channels), dtype=np.uint16)
    rows = b"".join(b"\0" + values[r].astype(">u2").tobytes() for r in range(5))
    decoded = decode_image(_png(7, 5, 16, colour_type, rows)).pixels
    high = (values >> 8).astype(np.uint8)
    want = np.repeat(high, 3, axis=2) if channels == 1 else high[:, :, :3]
    np.testing.assert_array_equal(decoded, want)


def test_decompression_bomb_refused_before_decoding():
    # 100000 x 100000 declared in a few hundred bytes: refused from the header, naming the limit.
    bomb = _png(100_000, 100_000, 8, 2, b"\0" * 1000)
    with pytest.raises(ImageTooLargeError, match="exceeds the limit of 50000000 pixels"):
        decode_image(bomb)
    with pytest.raises(ImageTooLargeError, match="limit of 100 pixels"):
        decode_image(_png(11, 10, 8, 0, b"\0" * 120), max_pixels=100)


@pytest.mark.parametrize("data", [b"this is not an image", b"", b"\xff\xd8\xff\xe0garbage",
                                  _png(4, 4, 8, 2, b"")[:-20]], ids=["text", "empty", "bad-jpeg", "truncated-png"])
def test_bad_bytes_are_an_image_error(data):
    with pytest.raises(ImageError):
        decode_image(data)


def test_format_stb_cannot_read_is_refused():
    from PIL import Image, features

    if not features.check("webp"):
        pytest.skip("this Pillow has no WebP encoder")
    buf = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buf, "WEBP")
    with pytest.raises(ImageError, match="format WEBP is not supported"):
        decode_image(buf.getvalue())


def test_content_hash_follows_the_pixels():
    from PIL import Image

    name = "square_64.png"
    png = (VISION / "images" / name).read_bytes()
    pixels = reference_decoded(name)
    recompressed = io.BytesIO()
    Image.fromarray(pixels).save(recompressed, "PNG", compress_level=1)
    assert recompressed.getvalue() != png
    assert decode_image(recompressed.getvalue()).content_hash == decode_image(png).content_hash
    flipped = io.BytesIO()
    Image.fromarray(pixels[:, ::-1]).save(flipped, "PNG")
    assert decode_image(flipped.getvalue()).content_hash != decode_image(png).content_hash
