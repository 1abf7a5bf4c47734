"""Images in requests, as llama-server takes them: the prompt they make (their bytes come from
lamplight.server.media_sources).

- The media marker (LLAMA_MEDIA_MARKER, default `<__media__>`) splits a prompt's text; each piece is
  tokenized on its own and each marker becomes its image's segments (lamplight.vision: decode,
  plan, encode), BOS at the very start (llama.cpp's mtmd_tokenize).
- The result is an engine prompt: token ids with placeholder ids at image positions
  (lamplight.engine.types.placeholder_ids, keyed by the image's content: the prefix cache hits for
  the same image and misses for another) and the image rows as MediaSpans.

Images are decoded and encoded here, in the request's worker thread (before the engine sees the
request), so running streams never wait for an encoder; the last RECENT_IMAGES encodings are kept
by content, so an image sent again is not encoded again. Every bad input is a 400 naming it.

This module imports the vision encoder and torch: the server imports it only to load an mmproj
(launcher.load_media).
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from lamplight.engine.types import MediaSpan, placeholder_ids
from lamplight.vision import DEFAULT_MAX_PIXELS, EmbeddingRows, ImageError, TextSegment, assemble_prompt, decode_image

from .errors import invalid_request
from .media_sources import media_marker, url_bytes

RECENT_IMAGES = 16  # encoded images kept for reuse (MediaInput._recent)
# llama-server's messages for these failures (the tests compare them), followed by ours.
TOKENIZE_FAILED = "Failed to tokenize prompt"
LOAD_FAILED = "Failed to load image or audio file"


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

    def url_bytes(self, url: str, where: str) -> bytes:
        """An `image_url` part's bytes, from where this server's options let images come."""
        return url_bytes(url, where, self.options.media_path, self.options.allow_urls)

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
