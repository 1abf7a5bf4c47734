"""The errors of the vision package.

Bad image input is an ImageError (a ValueError: the API answers it with a 400 naming the problem).
A projector file that cannot be used is a lamplight.gguf.file.GGUFError (also a ValueError),
raised at load, naming the key, tensor or width that is wrong.
"""

from __future__ import annotations


class ImageError(ValueError):
    """Bytes that cannot be used as an image: not an image, a format we do not read, corrupt."""


class ImageTooLargeError(ImageError):
    """An image whose declared dimensions exceed the limit: refused before any pixel is decoded
    (a decompression bomb declares huge dimensions in a few bytes)."""
