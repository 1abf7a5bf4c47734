"""Random-weight GGUF files of real model shapes, so that speed is measured at the sizes people run.

`lamplight bench write-model SHAPE OUT.gguf --type Q4_K_M|Q4_0|Q8_0|F16 [--seed N] [--layers N]`
writes a model of a named shape (SHAPES: Llama 3.2 1B / 3B, the Qwen 3.5 0.8B / 2B hybrids) with
the default model's tokenizer (SmolLM2's 49152 tokens, tokenizer.* metadata and chat template).

- Weights are written directly as random quantized blocks, tensor by tensor (memory bounded by
  the largest tensor): random bytes for the quantized values, block scales chosen so that the
  dequantized weights have a trained model's spread (std MATRIX_STD, zero mean) and norms near 1.
- Which tensor gets which type follows llama-quantize (llama.cpp's src/llama-quant.cpp):
  `tensor_types` is a port of its rule for the four file types written here.
- The output rows of tokens that are not whole printable ASCII (and of control tokens) are
  shrunk by HEAD_SHRINK, so greedy decoding emits only ASCII (llama-server's /completion
  answers 500 on broken UTF-8) and never stops on EOS. With tied embeddings those rows are the
  input embeddings too.
- Same arguments, same seed: a byte-identical file (each tensor's generator is seeded from the
  seed and the tensor's name, so cutting layers leaves the remaining tensors unchanged).

Qwen 3.5 (`qwen35`) follows shared/reference/archs2/README.md's key and tensor list.

The encoders (random_encoder.py: a bge-reranker-base-shaped BERT) and the vision projector
(random_mmproj.py: a SigLIP-B/16 tower) are written with the pieces here (`random_matrix`,
`tensor_types`, `write_planned_gguf`); the command line is cli.py's `write-model`.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUFWriter
from gguf import GGMLQuantizationType as Q

MATRIX_STD = 0.02  # a trained transformer's weight spread
NORM_STD = 0.05  # norm weights: 1 + N(0, NORM_STD)
BIAS_STD = 0.02  # biases (the encoders and the vision tower have them): N(0, BIAS_STD)
HEAD_SHRINK = 1 / 16  # output rows of tokens greedy decoding must not pick
CHUNK_VALUES = 1 << 22  # weights generated at a time (bounds the temporaries)


# -- shapes ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ModelShape:
    """The sizes a real checkpoint's GGUF declares. Fields after `llama3_rope` are qwen35's."""

    arch: str  # "llama" or "qwen35"
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_ctx: int
    rope_theta: float
    rms_eps: float
    tied: bool = True
    # Llama 3's rope scaling as its config ships it: (factor, low_freq_factor, high_freq_factor,
    # original_max_position_embeddings); the converter turns it into rope_freqs.weight.
    llama3_rope: tuple[float, float, float, int] | None = None
    n_rot: int = 0  # partial rotary: rope on the first n_rot dims of a head
    rope_sections: tuple[int, ...] = ()
    full_attention_interval: int = 0
    ssm_conv_kernel: int = 0
    ssm_state_size: int = 0  # head dim of the delta rule's q, k and v
    ssm_group_count: int = 0  # q/k heads
    ssm_time_step_rank: int = 0  # v heads

    @property
    def qkv_channels(self) -> int:
        """Gated DeltaNet's attn_qkv rows: q and k of ssm_group_count heads, v of ssm_time_step_rank."""
        return (2 * self.ssm_group_count + self.ssm_time_step_rank) * self.ssm_state_size

    @property
    def ssm_inner_size(self) -> int:
        return self.ssm_time_step_rank * self.ssm_state_size

    def is_recurrent(self, layer: int) -> bool:
        """qwen35: a Gated DeltaNet layer unless (layer + 1) is a multiple of the interval."""
        return self.arch == "qwen35" and (layer + 1) % self.full_attention_interval != 0


LLAMA_3_2_ROPE = (32.0, 1.0, 4.0, 8192)  # Llama 3.2's rope_scaling (rope_type llama3)

# Qwen 3.5 small dense models as published (model cards of Qwen/Qwen3.5-0.8B and -2B): 24 layers
# of 6 x (3 Gated DeltaNet + 1 gated attention), attention 8 q / 2 kv heads of 256, rope on 64
# dims (mrope sections 11/11/10), theta 1e7; DeltaNet 16 v heads and 16 q/k heads of 128, conv 4;
# tied embeddings.
_QWEN35_COMMON = dict(arch="qwen35", n_layer=24, n_head=8, n_head_kv=2, head_dim=256, n_ctx=262144,
                      rope_theta=10_000_000.0, rms_eps=1e-6, n_rot=64, rope_sections=(11, 11, 10, 0),
                      full_attention_interval=4, ssm_conv_kernel=4, ssm_state_size=128, ssm_group_count=16,
                      ssm_time_step_rank=16)

SHAPES: dict[str, ModelShape] = {
    "llama-3.2-1b": ModelShape("llama", n_embd=2048, n_layer=16, n_head=32, n_head_kv=8, head_dim=64, n_ff=8192,
                               n_ctx=131072, rope_theta=500000.0, rms_eps=1e-5, llama3_rope=LLAMA_3_2_ROPE),
    "llama-3.2-3b": ModelShape("llama", n_embd=3072, n_layer=28, n_head=24, n_head_kv=8, head_dim=128, n_ff=8192,
                               n_ctx=131072, rope_theta=500000.0, rms_eps=1e-5, llama3_rope=LLAMA_3_2_ROPE),
    "qwen3.5-0.8b": ModelShape(n_embd=1024, n_ff=3584, **_QWEN35_COMMON),
    "qwen3.5-2b": ModelShape(n_embd=2048, n_ff=6144, **_QWEN35_COMMON),
}


def shape_for(name: str, layers: int | None = None, overrides: Sequence[str] = ()) -> ModelShape:
    """SHAPES[name] with `layers` layers and `overrides` ("field=value", e.g. "n_embd=256";
    tuples as "11,11,10,0", booleans as 0/1) applied, checked."""
    if name not in SHAPES:
        raise ValueError(f"unknown shape {name!r} (choose from {', '.join(SHAPES)})")
    shape = replace_shape(SHAPES[name], layers, overrides)
    _check_shape(shape)
    return shape


def replace_shape(shape, layers: int | None, overrides: Sequence[str]):
    """A shape dataclass (decoder, encoder or vision tower) with `n_layer` = `layers` and each
    "FIELD=VALUE" of `overrides` applied, the value parsed as the field's current type."""
    changes = dict(_parse_override(shape, text) for text in overrides)
    if layers is not None:
        changes["n_layer"] = layers
    return dataclasses.replace(shape, **changes)


def _parse_override(shape, text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    fields = [f.name for f in dataclasses.fields(shape) if f.name != "arch"]
    if not sep or key not in fields:
        raise ValueError(f"--shape-override {text!r}: expected FIELD=VALUE with FIELD one of {', '.join(fields)}")
    default = getattr(shape, key)
    try:
        if key == "llama3_rope":
            return key, None if value.lower() in ("none", "") else _parse_llama3_rope(value)
        if isinstance(default, bool):
            if value.lower() not in ("0", "1", "true", "false"):
                raise ValueError("expected 0 or 1")
            return key, value.lower() in ("1", "true")
        if isinstance(default, tuple):
            return key, tuple(int(part) for part in value.split(","))
        return key, type(default)(value)
    except ValueError as exc:
        raise ValueError(f"--shape-override {text!r}: {exc}") from None


def _parse_llama3_rope(value: str) -> tuple[float, float, float, int]:
    parts = value.split(",")
    if len(parts) != 4:
        raise ValueError("expected factor,low_freq_factor,high_freq_factor,original_context")
    return float(parts[0]), float(parts[1]), float(parts[2]), int(parts[3])


def _check_shape(s: ModelShape) -> None:
    positive = ["n_embd", "n_layer", "n_head", "n_head_kv", "head_dim", "n_ff", "n_ctx"]
    if s.arch == "qwen35":
        positive += ["n_rot", "full_attention_interval", "ssm_conv_kernel", "ssm_state_size", "ssm_group_count",
                     "ssm_time_step_rank"]
    for name in positive:
        if getattr(s, name) < 1:
            raise ValueError(f"shape: {name} must be at least 1, got {getattr(s, name)}")
    if s.n_head % s.n_head_kv:
        raise ValueError(f"shape: n_head {s.n_head} is not a multiple of n_head_kv {s.n_head_kv}")
    if s.head_dim % 2:
        raise ValueError(f"shape: head_dim {s.head_dim} must be even (rope pairs)")
    if s.arch == "qwen35":
        if s.ssm_time_step_rank % s.ssm_group_count:
            raise ValueError(f"shape: ssm_time_step_rank {s.ssm_time_step_rank} is not a multiple of "
                             f"ssm_group_count {s.ssm_group_count}")
        if len(s.rope_sections) != 4 or 2 * sum(s.rope_sections) != s.n_rot or s.n_rot > s.head_dim:
            raise ValueError(f"shape: rope_sections {s.rope_sections} must be 4 numbers summing to n_rot/2 "
                             f"(n_rot {s.n_rot} <= head_dim {s.head_dim})")


# -- what the file holds --------------------------------------------------------------------------

@dataclass(frozen=True)
class PlannedTensor:
    name: str
    shape: tuple[int, ...]  # numpy order: a linear weight is (out_features, in_features)
    kind: str  # what values it gets: matrix, norm, rope_freqs, ssm_a, dt_bias, conv (other writers add theirs)
    head: bool = False  # the matrix the output head reads (its rows get the ASCII gains)


def planned_tensors(s: ModelShape, n_vocab: int) -> list[PlannedTensor]:
    """Every tensor of the file, in file order, with the names and shapes llama.cpp loads."""
    plan = [PlannedTensor("token_embd.weight", (n_vocab, s.n_embd), "matrix", head=s.tied)]
    if s.llama3_rope is not None:
        plan.append(PlannedTensor("rope_freqs.weight", (s.head_dim // 2,), "rope_freqs"))
    for i in range(s.n_layer):
        plan += _layer_tensors(s, i)
    plan.append(PlannedTensor("output_norm.weight", (s.n_embd,), "norm"))
    if not s.tied:
        plan.append(PlannedTensor("output.weight", (n_vocab, s.n_embd), "matrix", head=True))
    return plan


def _layer_tensors(s: ModelShape, i: int) -> list[PlannedTensor]:
    p, e = f"blk.{i}.", s.n_embd
    if s.is_recurrent(i):
        mixer = [("attn_qkv.weight", (s.qkv_channels, e), "matrix"),
                 ("attn_gate.weight", (s.ssm_inner_size, e), "matrix"),
                 ("ssm_conv1d.weight", (s.qkv_channels, s.ssm_conv_kernel), "conv"),
                 ("ssm_dt.bias", (s.ssm_time_step_rank,), "dt_bias"),
                 ("ssm_a", (s.ssm_time_step_rank,), "ssm_a"),
                 ("ssm_beta.weight", (s.ssm_time_step_rank, e), "matrix"),
                 ("ssm_alpha.weight", (s.ssm_time_step_rank, e), "matrix"),
                 ("ssm_norm.weight", (s.ssm_state_size,), "norm"),
                 ("ssm_out.weight", (e, s.ssm_inner_size), "matrix")]
    else:
        gated = 2 if s.arch == "qwen35" else 1  # qwen35's attn_q holds each head's output gate too
        mixer = [("attn_q.weight", (gated * s.n_head * s.head_dim, e), "matrix"),
                 ("attn_k.weight", (s.n_head_kv * s.head_dim, e), "matrix"),
                 ("attn_v.weight", (s.n_head_kv * s.head_dim, e), "matrix"),
                 ("attn_output.weight", (e, s.n_head * s.head_dim), "matrix")]
        if s.arch == "qwen35":
            mixer += [("attn_q_norm.weight", (s.head_dim,), "norm"), ("attn_k_norm.weight", (s.head_dim,), "norm")]
    ffn_norm = "post_attention_norm.weight" if s.arch == "qwen35" else "ffn_norm.weight"
    ffn = [(ffn_norm, (e,), "norm"),
           ("ffn_gate.weight", (s.n_ff, e), "matrix"),
           ("ffn_up.weight", (s.n_ff, e), "matrix"),
           ("ffn_down.weight", (e, s.n_ff), "matrix")]
    return [PlannedTensor(p + name, shape, kind) for name, shape, kind in
            [("attn_norm.weight", (e,), "norm"), *mixer, *ffn]]


def arch_keys(s: ModelShape, n_vocab: int) -> dict[str, object]:
    """The `{arch}.*` keys (typed by add_arch_keys: int -> uint32, float -> float32, tuple -> int32[])."""
    keys: dict[str, object] = {
        "context_length": s.n_ctx, "embedding_length": s.n_embd, "block_count": s.n_layer,
        "feed_forward_length": s.n_ff, "attention.head_count": s.n_head, "attention.head_count_kv": s.n_head_kv,
        "attention.layer_norm_rms_epsilon": float(s.rms_eps), "rope.freq_base": float(s.rope_theta),
        "vocab_size": n_vocab,
    }
    if s.arch == "llama":
        keys["rope.dimension_count"] = s.head_dim
        if s.head_dim * s.n_head != s.n_embd:
            keys["attention.key_length"] = keys["attention.value_length"] = s.head_dim
        return keys
    keys.update({
        "attention.key_length": s.head_dim, "attention.value_length": s.head_dim,
        "rope.dimension_count": s.n_rot, "rope.dimension_sections": tuple(s.rope_sections),
        "full_attention_interval": s.full_attention_interval, "ssm.conv_kernel": s.ssm_conv_kernel,
        "ssm.inner_size": s.ssm_inner_size, "ssm.state_size": s.ssm_state_size,
        "ssm.time_step_rank": s.ssm_time_step_rank, "ssm.group_count": s.ssm_group_count,
    })
    return keys


# -- llama-quantize's choice of types -------------------------------------------------------------

@dataclass(frozen=True)
class FileType:
    ftype: int  # general.file_type (llama_ftype)
    default: Q  # llama_ftype_get_default_type


FILE_TYPES: dict[str, FileType] = {
    "Q4_K_M": FileType(15, Q.Q4_K),
    "Q4_0": FileType(2, Q.Q4_0),
    "Q8_0": FileType(7, Q.Q8_0),
    "F16": FileType(1, Q.F16),
}

# tensor_type_fallback: a type whose blocks do not fit a row falls back to one of 32 values.
_FALLBACK = {Q.Q4_K: Q.Q5_0, Q.Q5_K: Q.Q5_1, Q.Q6_K: Q.Q8_0}
_QUANTIZED = {Q.Q4_0, Q.Q5_0, Q.Q8_0, Q.Q4_K, Q.Q6_K}


def tensor_types(tensors: Sequence[tuple[str, tuple[int, ...]]], file_type: str) -> dict[str, Q]:
    """The type llama-quantize gives each tensor (name, numpy shape) of an F16/F32 source file
    for `file_type`: a port of llama_tensor_get_type for these file types (llama.cpp
    src/llama-quant.cpp). Tensors it does not quantize keep F32, the converter's type for them."""
    ft = FILE_TYPES[file_type]
    names = [name for name, _ in tensors]
    state = {"tied": "output.weight" not in names, "n_wv": sum(_is_attn_v_like(n) for n in names),
             "n_layer": _layer_count(names), "i_wv": 0, "i_down": 0}
    shapes = dict(tensors)
    # llama.cpp visits the weights by layer, then by name (weight_name_comparer); the counters
    # for attn_v and ffn_down depend on that order.
    ordered = sorted(names, key=lambda n: (_layer_of(n), n))
    return {name: _tensor_type(name, shapes[name], ft, file_type, state) for name in ordered}


def _tensor_type(name: str, shape: tuple[int, ...], ft: FileType, file_type: str, state: dict) -> Q:
    if not _allows_quantization(name, shape):
        return Q.F32
    if ft.default not in _QUANTIZED:
        return ft.default
    chosen, n_cols = ft.default, shape[-1]
    if name == "output.weight" or (state["tied"] and name == "token_embd.weight"):
        if n_cols % GGML_QUANT_SIZES[chosen][0]:
            chosen = Q.Q8_0
        elif chosen != Q.Q8_0:
            chosen = Q.Q6_K
    elif name == "token_embd.weight":
        pass  # untied input embeddings keep the file type's default here
    elif _is_attn_v_like(name):
        if file_type == "Q4_K_M" and _use_more_bits(state["i_wv"], state["n_wv"]):
            chosen = Q.Q6_K
        state["i_wv"] += 1
    elif "ffn_down" in name:
        if file_type == "Q4_K_M" and _use_more_bits(state["i_down"], state["n_layer"]):
            chosen = Q.Q6_K
        state["i_down"] += 1
    return _fallback(name, n_cols, chosen)


def _allows_quantization(name: str, shape: tuple[int, ...]) -> bool:
    """tensor_allows_quantization, the parts that concern these architectures (BERT's position
    embeddings and token types included)."""
    return (len(shape) >= 2 and name.endswith("weight") and "_norm.weight" not in name
            and "ffn_gate_inp.weight" not in name and "ssm_conv1d" not in name
            and name not in ("position_embd.weight", "token_types.weight"))


def _is_attn_v_like(name: str) -> bool:
    """category_is_attn_v: attn_v, and the fused attn_qkv (qwen35's DeltaNet input) with it."""
    return any(part in name for part in ("attn_qkv.weight", "attn_kv_b.weight", "attn_v.weight"))


def _use_more_bits(i_layer: int, n_layers: int) -> bool:
    """Q4_K_M's Q6_K layers: the first and last eighth, and every third in between."""
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or (i_layer - n_layers // 8) % 3 == 2


def _fallback(name: str, n_cols: int, chosen: Q) -> Q:
    if n_cols % GGML_QUANT_SIZES[chosen][0] == 0:
        return chosen
    if chosen not in _FALLBACK:
        raise ValueError(f"tensor {name}: {n_cols} columns are not a multiple of {chosen.name}'s "
                         f"{GGML_QUANT_SIZES[chosen][0]}-value blocks (llama-quantize has no fallback for it)")
    chosen = _FALLBACK[chosen]
    return chosen if n_cols % GGML_QUANT_SIZES[chosen][0] == 0 else Q.F16


def _layer_of(name: str) -> int:
    """sscanf("blk.%d."): -1 for tensors outside the blocks."""
    parts = name.split(".")
    return int(parts[1]) if parts[0] == "blk" and len(parts) > 2 and parts[1].isdigit() else -1


def _layer_count(names: Sequence[str]) -> int:
    return max((_layer_of(n) for n in names), default=-1) + 1


# -- random blocks ----------------------------------------------------------------------------------

# E[q^2] of a uniformly random quantized value as each format offsets it (q - 8 for Q4_0 ...):
# variance (levels^2 - 1) / 12 plus the half-step mean squared.
def _uniform_mean_square(levels: int) -> float:
    return (levels * levels - 1) / 12 + 0.25


_Q4K_SCALES = np.arange(8, 32)  # 6-bit sub-block scales drawn from these (mins equal them)
_Q6K_SCALES = np.arange(8, 16)  # int8 sub-block scales: these magnitudes, random sign


def random_matrix(rng: np.random.Generator, qtype: Q, rows: int, cols: int, std: float,
                  row_gain: np.ndarray | None = None) -> np.ndarray:
    """A (rows, cols) weight of `qtype` with random values of spread `std` (times row_gain per
    row): float16/float32 values, or uint8 blocks (rows, bytes per row) for quantized types."""
    block_values, block_bytes = GGML_QUANT_SIZES[qtype]
    if qtype in (Q.F16, Q.F32):
        out = np.empty((rows, cols), np.float16 if qtype == Q.F16 else np.float32)
    else:
        out = np.empty((rows, cols // block_values, block_bytes), np.uint8)
    step = max(1, CHUNK_VALUES // cols)
    for start in range(0, rows, step):
        stop = min(rows, start + step)
        gain = std * (row_gain[start:stop] if row_gain is not None else np.ones(stop - start))
        if qtype in (Q.F16, Q.F32):
            out[start:stop] = rng.standard_normal((stop - start, cols), dtype=np.float32) * gain[:, None]
        else:
            out[start:stop] = _random_blocks(rng, qtype, stop - start, cols // block_values, gain)
    return out if qtype in (Q.F16, Q.F32) else out.reshape(rows, -1)


def _random_blocks(rng: np.random.Generator, qtype: Q, rows: int, n_blocks: int, gain: np.ndarray) -> np.ndarray:
    """Random bytes for the quantized values (uniform levels), then each block's scale fields
    set so the block's values have spread `gain` (per row) times a factor in [0.75, 1.25]."""
    blocks = rng.integers(0, 256, (rows, n_blocks, GGML_QUANT_SIZES[qtype][1]), dtype=np.uint8)
    spread = gain[:, None] * rng.uniform(0.75, 1.25, (rows, n_blocks))
    spread /= math.sqrt((0.75 ** 2 + 0.75 * 1.25 + 1.25 ** 2) / 3)  # E[factor^2] = 1
    if qtype in (Q.Q4_0, Q.Q5_0, Q.Q8_0):
        # d * (q - offset): the offset leaves a half-step mean, a random sign of d cancels it.
        levels = {Q.Q4_0: 16, Q.Q5_0: 32, Q.Q8_0: 256}[qtype]
        sign = rng.choice(np.array([-1.0, 1.0]), (rows, n_blocks))
        _put_f16(blocks, 0, sign * spread / math.sqrt(_uniform_mean_square(levels)))
    elif qtype == Q.Q4_K:
        _fill_q4_k(rng, blocks, spread)
    elif qtype == Q.Q6_K:
        _fill_q6_k(rng, blocks, spread)
    else:
        raise ValueError(f"no random block writer for {qtype.name}")
    return blocks


def _fill_q4_k(rng: np.random.Generator, blocks: np.ndarray, spread: np.ndarray) -> None:
    """Q4_K: x = d * sc * q - dmin * m per 32-value sub-block (q 0..15). With m = sc and
    dmin = 7.5 d the values are d * sc * (q - 7.5): zero mean."""
    scales = rng.choice(_Q4K_SCALES, blocks.shape[:2] + (8,)).astype(np.uint8)
    d = spread / math.sqrt(np.mean(_Q4K_SCALES.astype(float) ** 2) * (255 / 12))
    _put_f16(blocks, 0, d)
    _put_f16(blocks, 2, 7.5 * d)
    blocks[..., 4:16] = _pack_q4_k_scales(scales, scales)


def _pack_q4_k_scales(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """The 12 bytes of 6-bit scales and mins that ggml's get_scale_min_k4 reads back."""
    packed = np.empty(sc.shape[:-1] + (12,), np.uint8)
    packed[..., 0:4] = (sc[..., 0:4] & 63) | ((sc[..., 4:8] >> 4) << 6)
    packed[..., 4:8] = (m[..., 0:4] & 63) | ((m[..., 4:8] >> 4) << 6)
    packed[..., 8:12] = (sc[..., 4:8] & 15) | ((m[..., 4:8] & 15) << 4)
    return packed


def _fill_q6_k(rng: np.random.Generator, blocks: np.ndarray, spread: np.ndarray) -> None:
    """Q6_K: ql[128] qh[64] scales int8[16] d; x = d * scale * (q - 32) per 16 values."""
    scales = rng.choice(_Q6K_SCALES, blocks.shape[:2] + (16,)) * rng.choice(np.array([-1, 1]), blocks.shape[:2] + (16,))
    blocks[..., 192:208] = scales.astype(np.int8).view(np.uint8)
    d = spread / math.sqrt(np.mean(_Q6K_SCALES.astype(float) ** 2) * _uniform_mean_square(64))
    _put_f16(blocks, 208, d)


def _put_f16(blocks: np.ndarray, offset: int, values: np.ndarray) -> None:
    blocks[..., offset:offset + 2] = values.astype(np.float16)[..., None].view(np.uint8)


def llama3_rope_factors(head_dim: int, theta: float, factor: float, low: float, high: float,
                        original_ctx: int) -> np.ndarray:
    """rope_freqs.weight as llama.cpp's converter computes it from Llama 3's rope_scaling."""
    freqs = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim)
    wavelen = 2 * math.pi / freqs
    smooth = (original_ctx / wavelen - low) / (high - low)
    mid = 1 / ((1 - smooth) / factor + smooth)
    return np.where(wavelen < original_ctx / high, 1.0,
                    np.where(wavelen > original_ctx / low, factor, mid)).astype(np.float32)


def _small_tensor(rng: np.random.Generator, t: PlannedTensor, s: ModelShape) -> np.ndarray:
    """The F32 tensors: norms near 1, rope factors, and qwen35's recurrent parameters
    (ranges of shared/reference/archs2's generator, which llama.cpp runs finite)."""
    if t.kind == "norm":
        return (1.0 + NORM_STD * rng.standard_normal(t.shape)).astype(np.float32)
    if t.kind == "rope_freqs":
        return llama3_rope_factors(s.head_dim, s.rope_theta, *s.llama3_rope)
    if t.kind == "ssm_a":  # -exp(A_log)
        return (-np.exp(rng.uniform(math.log(0.02), math.log(1.5), t.shape))).astype(np.float32)
    if t.kind == "dt_bias":
        return (-1.0 + 0.5 * rng.standard_normal(t.shape)).astype(np.float32)
    if t.kind == "conv":
        return (rng.standard_normal(t.shape) / math.sqrt(t.shape[-1])).astype(np.float32)
    raise ValueError(f"tensor {t.name}: unknown kind {t.kind}")


# -- the tokenizer ----------------------------------------------------------------------------------

def ascii_row_gains(tokenizer) -> np.ndarray:
    """1 for tokens whose text is whole printable ASCII (tab and newline included), HEAD_SHRINK
    for the rest and for control tokens."""
    gains = np.full(tokenizer.vocab_size, HEAD_SHRINK)
    for token in range(tokenizer.vocab_size):
        text = tokenizer.token_bytes(token)
        if text and not tokenizer.is_control(token) and all(0x20 <= b < 0x7F or b in (9, 10) for b in text):
            gains[token] = 1.0
    return gains


def add_tokenizer_keys(w: GGUFWriter, metadata: dict) -> None:
    """Copy tokenizer.* (vocabulary, merges, special ids, chat template) with the types llama.cpp
    reads them as: ids uint32, flags bool, token types int32[], scores float32[]."""
    for key, value in metadata.items():
        if not key.startswith("tokenizer."):
            continue
        if isinstance(value, np.ndarray):
            value = value.tolist()
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_array(key, list(value))


def add_arch_keys(w: GGUFWriter, arch: str, keys: dict[str, object]) -> None:
    for key, value in keys.items():
        if isinstance(value, tuple):
            w.add_array(f"{arch}.{key}", [int(v) for v in value])  # int32[]
        elif isinstance(value, float):
            w.add_float32(f"{arch}.{key}", value)
        else:
            w.add_uint32(f"{arch}.{key}", int(value))


# -- writing ----------------------------------------------------------------------------------------

@dataclass
class WrittenModel:
    path: Path
    bytes: int
    seconds: float
    types: dict[str, Q]  # tensor name -> type, in file order

    def type_counts(self) -> Counter:
        return Counter(t.name for t in self.types.values())


TensorData = Callable[[np.random.Generator, PlannedTensor, Q], np.ndarray]


def write_planned_gguf(path: str | os.PathLike, arch: str, plan: Sequence[PlannedTensor], types: dict[str, Q],
                       add_keys: Callable[[GGUFWriter], None], tensor_data: TensorData, *, seed: int,
                       progress: Callable[[str], None] | None = None) -> WrittenModel:
    """Write the tensors of `plan` (types from `types`, values from `tensor_data`) after the keys
    `add_keys` adds, tensor by tensor. Each tensor's generator is seeded from the seed and its
    name, so a file is a function of its arguments and cutting layers leaves the rest unchanged."""
    start = time.perf_counter()
    w = GGUFWriter(os.fspath(path), arch)
    add_keys(w)
    for t in plan:
        _add_tensor_info(w, t, types[t.name])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for i, t in enumerate(plan):
        rng = np.random.default_rng([seed, zlib.crc32(t.name.encode())])
        w.write_tensor_data(tensor_data(rng, t, types[t.name]))
        if progress:
            progress(f"[{i + 1}/{len(plan)}] {t.name} {types[t.name].name}")
    w.close()
    written = Path(path)
    return WrittenModel(written, written.stat().st_size, time.perf_counter() - start,
                        {t.name: types[t.name] for t in plan})


def check_file_type(file_type: str, allowed: Sequence[str] = tuple(FILE_TYPES)) -> None:
    if file_type not in allowed:
        raise ValueError(f"unknown --type {file_type!r} (choose from {', '.join(allowed)})")


def write_random_model(shape_name: str, path: str | os.PathLike, file_type: str, *, seed: int = 0,
                       layers: int | None = None, overrides: Sequence[str] = (),
                       tokenizer_from: str | os.PathLike | None = None,
                       progress: Callable[[str], None] | None = None) -> WrittenModel:
    """Write a random-weight GGUF of SHAPES[shape_name] (with `layers` and `overrides`) to
    `path`; the tokenizer is copied from `tokenizer_from` (a GGUF path or alias; default: the
    default model's)."""
    from lamplight.gguf.file import GGUFFile
    from lamplight.sources import resolve_model
    from lamplight.tokenizer import Tokenizer

    check_file_type(file_type)
    shape = shape_for(shape_name, layers, overrides)
    source = GGUFFile(resolve_model(tokenizer_from, progress=progress))
    tokenizer = Tokenizer.from_gguf(source)
    n_vocab = tokenizer.vocab_size
    plan = planned_tensors(shape, n_vocab)
    types = tensor_types([(t.name, t.shape) for t in plan], file_type)
    gains = ascii_row_gains(tokenizer)

    def add_keys(w: GGUFWriter) -> None:
        w.add_name(f"random {shape_name}")
        w.add_file_type(FILE_TYPES[file_type].ftype)
        w.add_quantization_version(2)
        add_arch_keys(w, shape.arch, arch_keys(shape, n_vocab))
        add_tokenizer_keys(w, source.metadata)

    def tensor_data(rng: np.random.Generator, t: PlannedTensor, qtype: Q) -> np.ndarray:
        if t.kind == "matrix":
            return random_matrix(rng, qtype, *t.shape, MATRIX_STD, gains if t.head else None)
        return _small_tensor(rng, t, shape)

    return write_planned_gguf(path, shape.arch, plan, types, add_keys, tensor_data, seed=seed, progress=progress)


def _add_tensor_info(w: GGUFWriter, t: PlannedTensor, qtype: Q) -> None:
    block_values, block_bytes = GGML_QUANT_SIZES[qtype]
    if qtype in (Q.F16, Q.F32):
        dtype = np.dtype(np.float16 if qtype == Q.F16 else np.float32)
        w.add_tensor_info(t.name, t.shape, dtype, int(np.prod(t.shape)) * dtype.itemsize)
        return
    byte_shape = (*t.shape[:-1], t.shape[-1] // block_values * block_bytes)
    w.add_tensor_info(t.name, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)), raw_dtype=qtype)
