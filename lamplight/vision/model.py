"""A loaded mmproj: its projector type's preprocessing, tower, projector and prompt layout.

`load_vision_model(path, text_n_embd=..., tokenize=...)` checks everything at load (type, keys,
tensors, output width against the text model, the wrapper tokens in its vocabulary). Then per
image: `plan(decoded)` (preprocessing and the layout: how many positions, no encoder run) and
`encode(plan)` (the embedding rows). Each encoder input is encoded on its own, so an image's rows
never depend on what else is encoded with it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from ..gguf.file import GGUFError, GGUFFile
from .config import VisionConfig, read_vision_config
from .decode import DecodedImage
from .encoder import VisionTower
from .layout import (EmbeddingRows, Gemma3Layout, Idefics3Layout, ImageRows, PlainLayout, Segment, Tokenize,
                     count_positions)
from .preprocess import Preprocessed, preprocess_gemma3, preprocess_idefics3, preprocess_llava
from .projectors import Gemma3Projector, Idefics3Projector, LlavaMlpProjector
from .weights import WeightReader


@dataclass(frozen=True)
class ProjectorKind:
    """What differs between projector types. A new type (qwen2vl, an audio projector) is one entry."""

    preprocess: Callable[[np.ndarray, VisionConfig], Preprocessed]
    projector: Callable[[WeightReader, VisionConfig], object]
    layout: Callable[[Tokenize], object]
    blocks_run: Callable[[VisionConfig], int] = lambda config: config.n_layer


PROJECTOR_KINDS: dict[str, ProjectorKind] = {
    "idefics3": ProjectorKind(preprocess_idefics3, Idefics3Projector, Idefics3Layout),
    "gemma3": ProjectorKind(preprocess_gemma3, Gemma3Projector, Gemma3Layout),
    # LLaVA's "second-to-last layer": the last block is in the file but never run.
    "mlp": ProjectorKind(preprocess_llava, LlavaMlpProjector, PlainLayout, lambda config: config.n_layer - 1),
}


@dataclass(frozen=True)
class ImagePlan:
    """An image preprocessed and laid out, before encoding: enough to count its positions."""

    content_hash: str  # of the decoded image (DecodedImage.content_hash)
    inputs: Preprocessed
    segments: tuple[Segment, ...]  # TextSegment and ImageRows

    @property
    def n_positions(self) -> int:
        return count_positions(self.segments)


@dataclass(frozen=True)
class EncodedImage:
    """An image as prompt segments: TextSegment and EmbeddingRows, in order."""

    content_hash: str
    segments: tuple[Segment, ...]

    @property
    def n_positions(self) -> int:
        return count_positions(self.segments)


class VisionModel:
    def __init__(self, gguf: GGUFFile, tokenize: Tokenize | None = None):
        self.path = gguf.path
        self.config = read_vision_config(gguf)
        kind = PROJECTOR_KINDS.get(self.config.projector_type)
        if kind is None:
            raise GGUFError(f"{gguf.path}: projector type {self.config.projector_type!r} is not supported "
                            f"(supported: {', '.join(sorted(PROJECTOR_KINDS))})")
        if self.config.has_feature_layer:
            raise GGUFError(f"{gguf.path}: clip.vision.feature_layer (features from several tower layers) "
                            "is not supported")
        self.kind = kind
        blocks = kind.blocks_run(self.config)
        if not 0 < blocks <= self.config.n_layer:
            raise GGUFError(f"{gguf.path}: clip.vision.block_count {self.config.n_layer} leaves no block to run")
        reader = WeightReader(gguf)
        self.tower = VisionTower(reader, self.config, blocks)
        self.projector = kind.projector(reader, self.config)
        self.weight_bytes = reader.loaded_bytes  # float32, as loaded
        self.layout = None if tokenize is None else kind.layout(tokenize)

    @property
    def out_width(self) -> int:
        """The width of the rows it produces: must be the text model's n_embd."""
        return self.projector.out_width

    def check_text_width(self, text_n_embd: int) -> None:
        if self.out_width != text_n_embd:
            raise GGUFError(f"{self.path}: mismatch between text model (n_embd = {text_n_embd}) and mmproj "
                            f"(output width {self.out_width})")

    def plan(self, image: DecodedImage) -> ImagePlan:
        if self.layout is None:
            raise ValueError("the vision model was loaded without the text model's tokenizer: no layout")
        inputs = self.kind.preprocess(image.pixels, self.config)
        rows = [self.projector.rows_per_tile] * len(inputs.tiles)
        return ImagePlan(image.content_hash, inputs, tuple(self.layout.segments(rows, inputs.grid)))

    @torch.inference_mode()
    def embed(self, pixels: np.ndarray) -> torch.Tensor:
        """One encoder input [S, S, 3] -> its rows [n, out_width]."""
        return self.projector(self.tower(pixels)).contiguous()

    def encode(self, plan: ImagePlan) -> EncodedImage:
        segments = tuple(EmbeddingRows(self.embed(plan.inputs.tiles[seg.tile]), seg.non_causal)
                         if isinstance(seg, ImageRows) else seg for seg in plan.segments)
        return EncodedImage(plan.content_hash, segments)


def load_vision_model(path: str | os.PathLike, *, text_n_embd: int | None = None,
                      tokenize: Tokenize | None = None) -> VisionModel:
    """The projector at `path`, checked against the text model (its n_embd and, through
    `tokenize`, the tokens its layout needs)."""
    model = VisionModel(GGUFFile(path), tokenize)
    if text_n_embd is not None:
        model.check_text_width(text_n_embd)
    return model
