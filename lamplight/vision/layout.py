"""How an image sits in the prompt: text tokens around its embedding rows, per projector type, and
the prompt of text pieces and images (llama.cpp's mtmd_tokenize).

A prompt is a list of segments: TextSegment (token ids) and image rows, either ImageRows (a plan:
how many rows, before encoding) or EmbeddingRows (the projector's output). Each token and each
image row takes one position, in order. Adjacent text segments are merged, so a layout reads like
llama.cpp's chunk list (chunks.jsonl in the reference data).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence, Union

import torch

from ..gguf.file import GGUFError

# Text -> token ids, as llama.cpp tokenizes prompt text around media: parse_special on, no BOS.
Tokenize = Callable[[str], list[int]]


@dataclass(frozen=True)
class TextSegment:
    token_ids: tuple[int, ...]

    @property
    def n_positions(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True)
class ImageRows:
    """Rows of encoder input `tile` (media chunk j of the image), not computed yet."""

    tile: int
    n_rows: int
    non_causal: bool  # rows attend to each other both ways (gemma3); text stays causal

    @property
    def n_positions(self) -> int:
        return self.n_rows


@dataclass(frozen=True)
class EmbeddingRows:
    embeddings: torch.Tensor  # float32 [n_rows, n_embd_text]: replaces token embeddings as they are
    non_causal: bool

    @property
    def n_positions(self) -> int:
        return self.embeddings.shape[0]


Segment = Union[TextSegment, ImageRows, EmbeddingRows]


def single_token(tokenize: Tokenize, text: str, projector_type: str) -> int:
    """The one token `text` is in the text model's vocabulary: llama.cpp looks these up when it
    loads the projector (and fails every image request when one is absent); here it fails at load."""
    ids = tokenize(text)
    if len(ids) != 1:
        raise GGUFError(f"the text model's vocabulary has no token {text!r}, which the {projector_type} projector "
                        f"needs around image embeddings (it tokenizes as {ids})")
    return ids[0]


class PlainLayout:
    """Image rows only, no tokens around them (LLaVA's mlp)."""

    def __init__(self, tokenize: Tokenize, non_causal: bool = False):
        self.non_causal = non_causal

    def segments(self, rows_per_tile: Sequence[int], grid: tuple[int, int] | None) -> list[Segment]:
        return [ImageRows(j, n, self.non_causal) for j, n in enumerate(rows_per_tile)]


class Gemma3Layout:
    """`<start_of_image>`, the rows (bidirectional attention among themselves), `<end_of_image>`."""

    def __init__(self, tokenize: Tokenize):
        self.start = single_token(tokenize, "<start_of_image>", "gemma3")
        self.end = single_token(tokenize, "<end_of_image>", "gemma3")

    def segments(self, rows_per_tile: Sequence[int], grid: tuple[int, int] | None) -> list[Segment]:
        (n_rows,) = rows_per_tile
        return [TextSegment((self.start,)), ImageRows(0, n_rows, True), TextSegment((self.end,))]


class Idefics3Layout:
    """Per tile `<fake_token_around_image><row_R_col_C>` + rows, "\\n" between tile rows, then
    "\\n\\n" (one token) `<fake_token_around_image><global-img>` + the overview's rows +
    `<fake_token_around_image>`. llama.cpp's single "\\n\\n" stands for HF's last row "\\n" and
    the overview's leading "\\n"."""

    def __init__(self, tokenize: Tokenize):
        self.tokenize = tokenize
        look = lambda text: single_token(tokenize, text, "idefics3")  # noqa: E731
        self.fake, self.global_img = look("<fake_token_around_image>"), look("<global-img>")
        self.newline, self.double_newline = look("\n"), look("\n\n")

    def tile_prefix(self, row: int, col: int) -> tuple[int, ...]:
        # Tokenized as text, as llama.cpp does (beyond SmolVLM's 6 x 6 row tokens it is plain text).
        return tuple(self.tokenize(f"<fake_token_around_image><row_{row}_col_{col}>"))

    def segments(self, rows_per_tile: Sequence[int], grid: tuple[int, int] | None) -> list[Segment]:
        cols, rows = grid
        out: list[Segment] = []
        for r in range(rows):
            if r:
                out.append(TextSegment((self.newline,)))
            for c in range(cols):
                tile = r * cols + c
                out += [TextSegment(self.tile_prefix(r + 1, c + 1)), ImageRows(tile, rows_per_tile[tile], False)]
        overview = cols * rows
        out += [TextSegment((self.double_newline, self.fake, self.global_img)),
                ImageRows(overview, rows_per_tile[overview], False), TextSegment((self.fake,))]
        return out


def merge_text(segments: Sequence[Segment]) -> list[Segment]:
    """Adjacent text segments joined, empty ones dropped."""
    out: list[Segment] = []
    for seg in segments:
        if isinstance(seg, TextSegment):
            if not seg.token_ids:
                continue
            if out and isinstance(out[-1], TextSegment):
                out[-1] = TextSegment(out[-1].token_ids + seg.token_ids)
                continue
        out.append(seg)
    return out


def assemble_prompt(texts: Sequence[Sequence[int]], images: Sequence[Sequence[Segment]],
                    bos_id: int | None) -> list[Segment]:
    """The prompt `texts[0] image[0] texts[1] ... texts[n]` (the text pieces between media markers,
    each tokenized on its own), with BOS (when the vocabulary adds one) at the very start: at the
    head of the first text, or as its own segment when the prompt starts with an image."""
    if len(texts) != len(images) + 1:
        raise ValueError(f"{len(images)} image(s) need {len(images) + 1} text pieces around them, got {len(texts)}")
    segments: list[Segment] = [TextSegment(() if bos_id is None else (bos_id,))]
    for text, image in zip(texts, images):
        segments += [TextSegment(tuple(text)), *image]
    segments.append(TextSegment(tuple(texts[-1])))
    return merge_text(segments)


def count_positions(segments: Sequence[Segment]) -> int:
    return sum(seg.n_positions for seg in segments)


def flatten_for_batch(segments: Sequence[Segment], placeholder_id: int) -> tuple[list[int], list[int], torch.Tensor | None]:
    """Token ids of the whole prompt (image rows as `placeholder_id`), the rows that image rows
    fill, and their embeddings stacked: what ForwardBatch.embedding_overrides takes."""
    token_ids: list[int] = []
    rows: list[int] = []
    values: list[torch.Tensor] = []
    for seg in segments:
        if isinstance(seg, TextSegment):
            token_ids += seg.token_ids
        elif isinstance(seg, EmbeddingRows):
            rows += range(len(token_ids), len(token_ids) + seg.n_positions)
            token_ids += [placeholder_id] * seg.n_positions
            values.append(seg.embeddings)
        else:
            raise ValueError("the prompt still has image rows that were not encoded")
    return token_ids, rows, torch.cat(values) if values else None
