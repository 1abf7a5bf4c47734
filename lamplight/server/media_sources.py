"""Where a request's image bytes come from, and the marker that stands for an image in prompt
text: what the server reads of images without the vision encoder, so a text-only server never
imports lamplight.vision or torch (lamplight.server.media turns the bytes into prompt rows).

- base64 (`multimodal_data`), `data:` URIs and raw base64 in an `image_url`;
- `file://` URLs inside --media-path (resolved, never outside it);
- http(s) URLs only with --media-allow-urls (fetched with httpx, at most MAX_MEDIA_BYTES in
  URL_TIMEOUT_S, as llama-server).

Every bad input is a 400 naming it.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from .errors import ApiError, invalid_request

DEFAULT_MARKER = "<__media__>"
MAX_MEDIA_BYTES = 10 * 2**20  # an image fetched from a URL or read from --media-path (llama-server's 10 MB)
URL_TIMEOUT_S = 10.0


def media_marker() -> str:
    """The marker that stands for an image in prompt text: LLAMA_MEDIA_MARKER, else `<__media__>`
    (llama-server draws a random one per start unless the variable is set; /props publishes it)."""
    return os.environ.get("LLAMA_MEDIA_MARKER") or DEFAULT_MARKER


def url_bytes(url: str, where: str, media_path: str | None, allow_urls: bool) -> bytes:
    """An `image_url` part's bytes: a data: URI, a file:// URL under `media_path` (--media-path),
    or an http(s) URL when `allow_urls` (--media-allow-urls)."""
    if not isinstance(url, str) or not url:
        raise invalid_request(f"{where}: the image URL must be a non-empty string")
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "data":
        return data_uri_bytes(url, where)
    if scheme == "file":
        return file_url_bytes(url, where, media_path)
    if scheme in ("http", "https"):
        if not allow_urls:
            raise invalid_request(f"{where}: image URLs are off on this server (start it with --media-allow-urls); "
                                  "send the image as a data: URI")
        return fetch_url(url, where)
    if re.fullmatch(r"[A-Za-z0-9+/=\s]+", url[:4096]):
        return base64_bytes(url, where)  # raw base64, as llama-server takes it
    raise invalid_request(f"{where}: unsupported image URL scheme {scheme or url[:20]!r} "
                          "(data:, file:// under --media-path, or http(s) with --media-allow-urls)")


def file_url_bytes(url: str, where: str, media_path: str | None) -> bytes:
    """A file:// URL's bytes, from a file inside `media_path` (--media-path) only."""
    if not media_path:
        raise invalid_request(f"{where}: file:// URLs are off on this server (start it with --media-path DIR)")
    parsed = urlparse(url)
    if parsed.netloc not in ("", "localhost"):
        raise invalid_request(f"{where}: a file:// URL must not name a host (got {parsed.netloc!r})")
    path = Path(unquote(parsed.path)).resolve()
    base = Path(media_path).resolve()
    if not path.is_relative_to(base):
        raise invalid_request(f"{where}: {path} is outside --media-path ({base})")
    try:
        if path.stat().st_size > MAX_MEDIA_BYTES:
            raise invalid_request(f"{where}: the file is larger than {MAX_MEDIA_BYTES} bytes")
        return path.read_bytes()
    except OSError as exc:
        raise invalid_request(f"{where}: cannot read {path.relative_to(base)} under --media-path "
                              f"({exc.strerror or exc})") from None


def data_uri_bytes(url: str, where: str) -> bytes:
    """The bytes of a `data:[type][;base64],DATA` URI (base64, as every image in a chat request)."""
    head, sep, payload = url.partition(",")
    if not sep or not head.lower().endswith(";base64"):
        raise invalid_request(f"{where}: a data: URI must be base64 (data:image/png;base64,...)")
    return base64_bytes(payload, where)


def base64_bytes(text: Any, where: str) -> bytes:
    if not isinstance(text, str):
        raise invalid_request(f"{where}: an image must be a base64 string")
    try:
        return base64.b64decode(re.sub(r"\s+", "", text), validate=True)
    except (binascii.Error, ValueError):
        raise invalid_request(f"{where}: the image is not valid base64") from None


def fetch_url(url: str, where: str) -> bytes:
    """An image from an http(s) URL, at most MAX_MEDIA_BYTES (read as it streams in)."""
    import httpx

    deadline = time.monotonic() + URL_TIMEOUT_S
    try:
        with httpx.stream("GET", url, timeout=URL_TIMEOUT_S, follow_redirects=True) as response:
            if response.status_code != 200:
                raise invalid_request(f"{where}: fetching the image URL answered HTTP {response.status_code}")
            data = bytearray()
            for chunk in response.iter_bytes():
                data += chunk
                if len(data) > MAX_MEDIA_BYTES:
                    raise invalid_request(f"{where}: the image at the URL is larger than {MAX_MEDIA_BYTES} bytes")
                if time.monotonic() > deadline:
                    raise invalid_request(f"{where}: fetching the image URL took more than {URL_TIMEOUT_S:g} s")
            return bytes(data)
    except ApiError:
        raise
    except httpx.HTTPError as exc:
        raise invalid_request(f"{where}: cannot fetch the image URL ({type(exc).__name__}: {exc})") from None
