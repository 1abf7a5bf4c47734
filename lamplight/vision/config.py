"""The hyperparameters of an mmproj GGUF (`general.architecture = "clip"`), read and checked.

Keys are the ones llama.cpp's converters write (`clip.*`, see tools/mtmd/clip-impl.h). Every
value the encoder or the preprocessing uses is read here once; a missing or unusable one is a
GGUFError naming the key and the file.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..gguf.file import GGUFError, GGUFFile

# What a legacy file without clip.projector_type is (llama.cpp's default: LLaVA's mlp).
DEFAULT_PROJECTOR_TYPE = "mlp"


@dataclass(frozen=True)
class VisionConfig:
    projector_type: str
    image_size: int  # S: the square the encoder sees
    patch_size: int  # p
    n_embd: int  # E: the tower's width
    n_ff: int
    n_head: int
    n_layer: int  # blocks in the file (llama.cpp may run fewer: see ProjectorType.blocks_run)
    eps: float  # LayerNorm epsilon (also the RMS norm's in gemma3's projector)
    image_mean: np.ndarray  # float32 [3]
    image_std: np.ndarray  # float32 [3]
    activation: str  # "gelu_tanh", "silu" or "quick_gelu"
    scale_factor: int | None  # clip.vision.projector.scale_factor (pixel shuffle / pooling)
    preproc_image_size: int | None  # idefics3's longest edge of the tiling resize
    has_feature_layer: bool  # clip.vision.feature_layer present (LLaVA variants: not supported)

    @property
    def patches_per_side(self) -> int:
        return self.image_size // self.patch_size

    @property
    def n_patches(self) -> int:
        return self.patches_per_side**2


def read_vision_config(gguf: GGUFFile) -> VisionConfig:
    meta = gguf.metadata
    arch = meta.get("general.architecture")
    if arch != "clip":
        raise GGUFError(f"{gguf.path}: not a multimodal projector (general.architecture is {arch!r}, expected 'clip')")
    if not meta.get("clip.has_vision_encoder", False):
        raise GGUFError(f"{gguf.path}: the projector has no vision encoder (clip.has_vision_encoder is not true); "
                        "audio projectors are not supported")

    def need(key: str):
        value = meta.get(key)
        if value is None:
            raise GGUFError(f"{gguf.path}: metadata key {key} is missing")
        return value

    def positive_int(key: str, value=None) -> int:
        value = need(key) if value is None else value
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
            raise GGUFError(f"{gguf.path}: {key} = {value!r} must be a positive integer")
        return int(value)

    image_size = positive_int("clip.vision.image_size")
    patch_size = positive_int("clip.vision.patch_size")
    if image_size % patch_size:
        raise GGUFError(f"{gguf.path}: clip.vision.image_size {image_size} is not a multiple of "
                        f"clip.vision.patch_size {patch_size}")
    n_embd = positive_int("clip.vision.embedding_length")
    n_head = positive_int("clip.vision.attention.head_count")
    if n_embd % n_head:
        raise GGUFError(f"{gguf.path}: clip.vision.embedding_length {n_embd} is not a multiple of "
                        f"clip.vision.attention.head_count {n_head}")
    optional = lambda key: None if meta.get(key) is None else positive_int(key, meta[key])  # noqa: E731
    return VisionConfig(
        projector_type=str(meta.get("clip.projector_type", DEFAULT_PROJECTOR_TYPE)),
        image_size=image_size,
        patch_size=patch_size,
        n_embd=n_embd,
        n_ff=positive_int("clip.vision.feed_forward_length"),
        n_head=n_head,
        n_layer=positive_int("clip.vision.block_count"),
        eps=float(need("clip.vision.attention.layer_norm_epsilon")),
        image_mean=_three_floats(gguf, "clip.vision.image_mean"),
        image_std=_three_floats(gguf, "clip.vision.image_std"),
        activation=_activation(meta),
        scale_factor=optional("clip.vision.projector.scale_factor"),
        preproc_image_size=optional("clip.vision.preproc_image_size"),
        has_feature_layer=meta.get("clip.vision.feature_layer") is not None,
    )


def _three_floats(gguf: GGUFFile, key: str) -> np.ndarray:
    value = gguf.metadata.get(key)
    if value is None:
        raise GGUFError(f"{gguf.path}: metadata key {key} is missing")
    values = np.asarray(value, dtype=np.float32)  # llama.cpp reads them as float32
    if values.shape != (3,) or not np.all(np.isfinite(values)):
        raise GGUFError(f"{gguf.path}: {key} must be 3 finite numbers (one per RGB channel), got {value!r}")
    if key.endswith("std") and np.any(values == 0):
        raise GGUFError(f"{gguf.path}: {key} has a zero entry")
    return values


def _activation(meta: dict) -> str:
    if meta.get("clip.use_gelu"):
        return "gelu_tanh"
    if meta.get("clip.use_silu"):
        return "silu"
    return "quick_gelu"
