"""Images in requests, as llama-server takes them: where their bytes come from, and the prompt
they make.

- Sources: base64 (`multimodal_data`), `data:` URIs, `file://` URLs inside --media-path (resolved,
  never outside it), http(s) URLs only with --media-allow-urls (fetched with httpx, at most
  MAX_MEDIA_BYTES in URL_TIMEOUT_S, as llama-server), and raw base64 in an `image_url`.
- The media marker (LLAMA_MEDIA_MARKER, default `<__media__>`) splits a prompt's text; each piece is
  tokenized on its own and each marker becomes its image's segments (lamplight.vision: decode,
  plan, encode), BOS at the very start (llama.cpp's mtmd_tokenize).
- The result is an engine prompt: token ids with placeholder ids at image positions
  (lamplight.engine.types.placeholder_ids, keyed by the image's content: the prefix cache hits for
  the same image and misses for another) and the image rows as MediaSpans.

Images are decoded and encoded here, in the request's worker thread (before the engine sees the
request), so running streams never wait for an encoder; the last RECENT_IMAGES encodings are kept
by content, so an image sent again is not encoded again. Every bad input is a 400 naming it.
"""

from __future__ import annotations

import base64
import binascii
import collections
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence
from urllib.parse import unquote, urlparse

import torch

from lamplight.engine.types import MediaSpan, placeholder_ids
from lamplight.vision import DEFAULT_MAX_PIXELS, EmbeddingRows, ImageError, TextSegment, assemble_prompt, decode_image

from .errors import ApiError, invalid_request

DEFAULT_MARKER = "<__media__>"
MAX_MEDIA_BYTES = 10 * 2**20  # an image fetched from a URL or read from --media-path (llama-server's 10 MB)
URL_TIMEOUT_S = 10.0
RECENT_IMAGES = 16  # encoded images kept for reuse (MediaInput._recent)
# llama-server's messages for these failures (the tests compare them), followed by ours.
TOKENIZE_FAILED = "Failed to tokenize prompt"
LOAD_FAILED = "Failed to load image or audio file"


def media_marker() -> str:
    """The marker that stands for an image in prompt text: LLAMA_MEDIA_MARKER, else `<__media__>`
    (llama-server draws a random one per start unless the variable is set; /props publishes it)."""
    return os.environ.get("LLAMA_MEDIA_MARKER") or DEFAULT_MARKER


class MediaPrompt(list):
    """An engine prompt with images: its token ids (placeholders at image positions) and, in
    `media`, the image rows (lamplight.engine.types.MediaSpan) the engine splices in."""

    def __init__(self, token_ids: Sequence[int], media: tuple[MediaSpan, ...]):
        super().__init__(token_ids)
        self.media = media


@dataclass(frozen=True)
class MediaOptions:
    """Where images may come from (the serve flags)."""

    media_path: str | None = None  # --media-path: file:// URLs inside it
    allow_urls: bool = False  # --media-allow-urls: http(s) URLs
    max_pixels: int = DEFAULT_MAX_PIXELS
    threads: int = 0  # PyTorch threads of the encoder (-t); 0: the calling thread's count


class MediaInput:
    """The server's image input: a vision model (lamplight.vision.VisionModel, loaded with the
    text model's tokenizer) and the options of where images may come from."""

    def __init__(self, vision: Any, tokenizer: Any, options: MediaOptions = MediaOptions()):
        self.vision = vision
        self.tokenizer = tokenizer
        self.options = options
        self.marker = media_marker()
        # The last images encoded, by content: an image sent again (a conversation's next turn)
        # skips the encoder. Shared by the request threads.
        self._recent: collections.OrderedDict[str, Any] = collections.OrderedDict()
        self._lock = threading.Lock()

    # -- bytes ---------------------------------------------------------------------------------

    def url_bytes(self, url: str, where: str) -> bytes:
        """An `image_url` part's bytes: a data: URI, a file:// URL under --media-path, or an
        http(s) URL when --media-allow-urls is on."""
        if not isinstance(url, str) or not url:
            raise invalid_request(f"{where}: the image URL must be a non-empty string")
        scheme = url.split(":", 1)[0].lower() if ":" in url else ""
        if scheme == "data":
            return data_uri_bytes(url, where)
        if scheme == "file":
            return self._file_bytes(url, where)
        if scheme in ("http", "https"):
            if not self.options.allow_urls:
                raise invalid_request(f"{where}: image URLs are off on this server (start it with --media-allow-urls); "
                                      "send the image as a data: URI")
            return fetch_url(url, where)
        if re.fullmatch(r"[A-Za-z0-9+/=\s]+", url[:4096]):
            return base64_bytes(url, where)  # raw base64, as llama-server takes it
        raise invalid_request(f"{where}: unsupported image URL scheme {scheme or url[:20]!r} "
                              "(data:, file:// under --media-path, or http(s) with --media-allow-urls)")

    def _file_bytes(self, url: str, where: str) -> bytes:
        root = self.options.media_path
        if not root:
            raise invalid_request(f"{where}: file:// URLs are off on this server (start it with --media-path DIR)")
        parsed = urlparse(url)
        if parsed.netloc not in ("", "localhost"):
            raise invalid_request(f"{where}: a file:// URL must not name a host (got {parsed.netloc!r})")
        path = Path(unquote(parsed.path)).resolve()
        base = Path(root).resolve()
        if not path.is_relative_to(base):
            raise invalid_request(f"{where}: {path} is outside --media-path ({base})")
        try:
            if path.stat().st_size > MAX_MEDIA_BYTES:
                raise invalid_request(f"{where}: the file is larger than {MAX_MEDIA_BYTES} bytes")
            return path.read_bytes()
        except OSError as exc:
            raise invalid_request(f"{where}: cannot read {path.relative_to(base)} under --media-path "
                                  f"({exc.strerror or exc})") from None

    # -- the prompt ----------------------------------------------------------------------------

    def prompt(self, text: str, images: Sequence[bytes], where: str = "prompt") -> MediaPrompt:
        """`text` with one image per media marker, as the engine's prompt."""
        if not images and self.marker not in text:  # text alone: tokenized as without a projector
            return MediaPrompt(self.tokenizer.encode(text, add_special=True, parse_special=True), ())
        pieces = text.split(self.marker)
        if len(pieces) - 1 != len(images):
            raise invalid_request(f"{TOKENIZE_FAILED}: {where} has {len(pieces) - 1} media marker(s) "
                                  f"({self.marker!r}) and {len(images)} image(s); they must match")
        encoded = [self._encode(data, f"{where}: image {i}") for i, data in enumerate(images)]
        tokenize = self.tokenizer.encode
        texts = [tokenize(piece, add_special=False, parse_special=True) for piece in pieces]
        bos = self.tokenizer.bos_id if self.tokenizer.add_bos else None
        segments = assemble_prompt(texts, [image.segments for image in encoded], bos)
        if segments and not isinstance(segments[-1], TextSegment):
            # llama-server aborts here (no text token left to decode after the rows): refused instead.
            raise invalid_request(f"{where} ends with an image: put some text after the last media marker "
                                  "(the model answers from the token after the image)")
        return engine_prompt(segments, encoded)

    def _encode(self, data: bytes, where: str):
        try:
            image = decode_image(data, self.options.max_pixels)
        except ImageError as exc:
            raise invalid_request(f"{LOAD_FAILED}: {where}: {exc}") from None
        with self._lock:
            encoded = self._recent.get(image.content_hash)
            if encoded is not None:
                self._recent.move_to_end(image.content_hash)
                return encoded
        encoded = self._encode_plan(self.vision.plan(image))  # the same rows whatever encoded it before
        with self._lock:
            self._recent[image.content_hash] = encoded
            while len(self._recent) > RECENT_IMAGES:
                self._recent.popitem(last=False)
        return encoded


    def _encode_plan(self, plan: Any) -> Any:
        """The encoder on the -t threads. With the native runner the process keeps PyTorch at one
        thread (launcher.dedicate_threads_to_native: its ops beside the native pool); OpenMP's and
        MKL's thread counts are the calling thread's own, so this request thread runs the
        encoder's large matmuls on all of them (SigLIP-B/16 at 512 px: 2.0 s instead of 3.3 s on
        2 cores) and the engine's thread keeps its one."""
        base = torch.get_num_threads()
        threads = self.options.threads or base
        if threads == base:
            return self.vision.encode(plan)
        torch.set_num_threads(threads)
        try:
            return self.vision.encode(plan)
        finally:
            torch.set_num_threads(base)


def engine_prompt(segments: Sequence[Any], images: Sequence[Any]) -> MediaPrompt:
    """Token ids and MediaSpans of a prompt of TextSegment and EmbeddingRows (assemble_prompt's,
    from the EncodedImages `images`). Image i's j-th run of rows gets placeholders keyed by
    (its content hash, j)."""
    keys = iter([f"{image.content_hash}#{j}" for image in images
                 for j, _ in enumerate(s for s in image.segments if isinstance(s, EmbeddingRows))])
    token_ids: list[int] = []
    spans: list[MediaSpan] = []
    for seg in segments:
        if isinstance(seg, TextSegment):
            token_ids += seg.token_ids
            continue
        key = next(keys)
        spans.append(MediaSpan(len(token_ids), seg.embeddings, seg.non_causal, key))
        token_ids += placeholder_ids(key, seg.n_positions)
    return MediaPrompt(token_ids, tuple(spans))


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
