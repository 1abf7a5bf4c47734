"""Random-weight BERT encoders of real shapes: `bge-reranker-base` (a cross-encoder with the
`cls.*` classification head, pooling rank) and `bert-base` (the same body without the head,
pooling cls), written as llama.cpp's converter writes them (arch `bert`; the key and tensor set
of shared/reference/embeddings' bert-rerank.gguf), so that lamplight and llama-server load the
same file.

The vocabulary is a small WordPiece one (WORDPIECE_TOKENS, the reference tiny reranker's 205
tokens; `--tokenizer-from` copies another `bert` GGUF's) instead of bge-reranker-base's real
250k-token XLM-R SentencePiece, which lamplight does not tokenize. The compute of a step does not
depend on the vocabulary size (the embedding is a row lookup); only the token counts of a text
do (this vocabulary cuts unknown words into letters), and both servers share the file.

Values: linear weights N(0, MATRIX_STD^2) (the decoder writer's spread; llama-quantize's types
for --type), LayerNorm weights 1 + N(0, NORM_STD^2), biases N(0, BIAS_STD^2): post-norm layers
keep every LayerNorm input of order 1.
"""

from __future__ import annotations

import os
import string
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
from gguf import GGUFWriter, PoolingType
from gguf import GGMLQuantizationType as Q

from .random_model import (BIAS_STD, FILE_TYPES, MATRIX_STD, NORM_STD, PlannedTensor, WrittenModel, add_arch_keys,
                           add_tokenizer_keys, check_file_type, random_matrix, replace_shape, tensor_types,
                           write_planned_gguf)

POOLING_TYPES = {"mean": PoolingType.MEAN, "cls": PoolingType.CLS, "rank": PoolingType.RANK}


@dataclass(frozen=True)
class EncoderShape:
    n_embd: int
    n_layer: int
    n_head: int
    n_ff: int
    n_ctx: int  # position rows (context_length)
    n_token_types: int
    eps: float
    pooling: str  # a POOLING_TYPES name
    rank_head: bool  # the cls.* classifier (one output: the relevance score)


# bge-reranker-base (XLMRobertaForSequenceClassification): 514 positions of which the converter
# keeps 512 (it drops XLM-R's pad offset), type_vocab_size 1, layer_norm_eps 1e-5.
# bert-base-uncased: 512 positions, 2 token types, eps 1e-12; pooled by [CLS] as BGE's base models.
ENCODER_SHAPES: dict[str, EncoderShape] = {
    "bge-reranker-base": EncoderShape(n_embd=768, n_layer=12, n_head=12, n_ff=3072, n_ctx=512, n_token_types=1,
                                      eps=1e-5, pooling="rank", rank_head=True),
    "bert-base": EncoderShape(n_embd=768, n_layer=12, n_head=12, n_ff=3072, n_ctx=512, n_token_types=2,
                              eps=1e-12, pooling="cls", rank_head=False),
}

# The reference tiny reranker's WordPiece vocabulary as the converter writes it: control tokens
# verbatim, word-initial pieces with U+2581, continuation pieces without "##".
_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
_WORDS = ("the an is of and to in on at for with by from as it this that be are was cat dog sat mat bear bears "
          "panda pandas giant species endemic china paris capital france city machine learning field study "
          "artificial intelligence data model models text query what who how where hello world test meaning "
          "life believe park live lives mountains deep representations physical system there already tag user "
          "symbols un re play super pneumono cali").split()
_CONTINUATIONS = "ing ed es er ly able ably ness believ fragil istic ultra micro scopic learn ic al".split()
_ALNUM = string.ascii_lowercase + string.digits
WORDPIECE_TOKENS: tuple[str, ...] = tuple(
    _SPECIALS + ["\u2581" + c for c in _ALNUM + string.punctuation + "中文東"] + list(_ALNUM)
    + ["\u2581" + w for w in _WORDS] + _CONTINUATIONS)
_SPECIAL_IDS = {"bos": 2, "eos": 3, "unknown": 1, "seperator": 3, "padding": 0, "cls": 2, "mask": 4}  # sic
CONTROL, NORMAL = 3, 1  # tokenizer.ggml.token_type values


def encoder_shape_for(name: str, layers: int | None = None, overrides: Sequence[str] = ()) -> EncoderShape:
    if name not in ENCODER_SHAPES:
        raise ValueError(f"unknown encoder shape {name!r} (choose from {', '.join(ENCODER_SHAPES)})")
    shape = replace_shape(ENCODER_SHAPES[name], layers, overrides)
    for field in ("n_embd", "n_layer", "n_head", "n_ff", "n_ctx", "n_token_types"):
        if getattr(shape, field) < 1:
            raise ValueError(f"shape: {field} must be at least 1, got {getattr(shape, field)}")
    if shape.n_embd % shape.n_head:
        raise ValueError(f"shape: n_embd {shape.n_embd} is not a multiple of n_head {shape.n_head}")
    if shape.pooling not in POOLING_TYPES:
        raise ValueError(f"shape: pooling {shape.pooling!r} is not one of {', '.join(POOLING_TYPES)}")
    if (shape.pooling == "rank") != shape.rank_head:
        raise ValueError("shape: pooling rank and the rank head go together")
    return shape


def planned_encoder_tensors(s: EncoderShape, n_vocab: int) -> list[PlannedTensor]:
    """Every tensor, in the converter's order, numpy shapes (a linear weight is (out, in))."""
    e = s.n_embd
    plan = [("token_embd.weight", (n_vocab, e), "matrix"), ("token_types.weight", (s.n_token_types, e), "matrix"),
            ("position_embd.weight", (s.n_ctx, e), "matrix"), *_layer_norm("token_embd_norm", e)]
    for i in range(s.n_layer):
        p = f"blk.{i}."
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            plan += _linear(p + name, e, e)
        plan += _layer_norm(p + "attn_output_norm", e)
        plan += _linear(p + "ffn_up", s.n_ff, e) + _linear(p + "ffn_down", e, s.n_ff)
        plan += _layer_norm(p + "layer_output_norm", e)
    if s.rank_head:  # bge-reranker's classifier: dense + tanh, then one output
        plan += _linear("cls", e, e) + _linear("cls.output", 1, e)
    return [PlannedTensor(name, shape, kind) for name, shape, kind in plan]


def _linear(name: str, n_out: int, n_in: int) -> list[tuple[str, tuple[int, ...], str]]:
    return [(f"{name}.weight", (n_out, n_in), "matrix"), (f"{name}.bias", (n_out,), "bias")]


def _layer_norm(name: str, n: int) -> list[tuple[str, tuple[int, ...], str]]:
    return [(f"{name}.weight", (n,), "norm"), (f"{name}.bias", (n,), "bias")]


def encoder_arch_keys(s: EncoderShape) -> dict[str, object]:
    """The `bert.*` numbers (attention.causal, pooling_type and the labels are written beside them)."""
    return {"context_length": s.n_ctx, "embedding_length": s.n_embd, "block_count": s.n_layer,
            "feed_forward_length": s.n_ff, "attention.head_count": s.n_head,
            "attention.layer_norm_epsilon": float(s.eps)}


def _add_tokenizer(w: GGUFWriter, s: EncoderShape, source_metadata: dict | None) -> None:
    if source_metadata is not None:
        add_tokenizer_keys(w, {k: v for k, v in source_metadata.items() if k != "tokenizer.ggml.token_type_count"})
    else:
        w.add_tokenizer_model("bert")
        w.add_tokenizer_pre("bert-bge")
        w.add_token_list(list(WORDPIECE_TOKENS))
        w.add_token_types([CONTROL if t in _SPECIALS else NORMAL for t in WORDPIECE_TOKENS])
        for name, token in _SPECIAL_IDS.items():
            w.add_uint32(f"tokenizer.ggml.{name}_token_id", token)
        w.add_add_bos_token(True)
        w.add_add_eos_token(True)
        w.add_add_sep_token(False)
    w.add_token_type_count(s.n_token_types)  # the rows of token_types.weight llama.cpp checks


def _wordpiece_source(tokenizer_from: str | os.PathLike | None, progress) -> tuple[dict | None, int]:
    """The tokenizer.* metadata to copy (None: the built-in vocabulary) and the vocabulary size."""
    if tokenizer_from is None:
        return None, len(WORDPIECE_TOKENS)
    from lamplight.gguf.file import GGUFFile
    from lamplight.sources import resolve_model
    from lamplight.tokenizer import Tokenizer

    source = GGUFFile(resolve_model(tokenizer_from, progress=progress))
    model = source.metadata.get("tokenizer.ggml.model")
    if model != "bert":
        raise ValueError(f"--tokenizer-from {tokenizer_from}: an encoder needs a WordPiece vocabulary "
                         f"(tokenizer.ggml.model 'bert'), that file's is {model!r}")
    return source.metadata, Tokenizer.from_gguf(source).vocab_size


def write_random_encoder(shape_name: str, path: str | os.PathLike, file_type: str, *, seed: int = 0,
                         layers: int | None = None, overrides: Sequence[str] = (),
                         tokenizer_from: str | os.PathLike | None = None,
                         progress: Callable[[str], None] | None = None) -> WrittenModel:
    """Write a random-weight BERT of ENCODER_SHAPES[shape_name] to `path` (see the module's doc)."""
    check_file_type(file_type)
    shape = encoder_shape_for(shape_name, layers, overrides)
    source_metadata, n_vocab = _wordpiece_source(tokenizer_from, progress)
    plan = planned_encoder_tensors(shape, n_vocab)
    types = tensor_types([(t.name, t.shape) for t in plan], file_type)

    def add_keys(w: GGUFWriter) -> None:
        w.add_name(f"random {shape_name}")
        w.add_file_type(FILE_TYPES[file_type].ftype)
        w.add_quantization_version(2)
        add_arch_keys(w, "bert", encoder_arch_keys(shape))
        w.add_causal_attention(False)
        w.add_pooling_type(POOLING_TYPES[shape.pooling])
        if shape.rank_head:
            w.add_classifier_output_labels(["LABEL_0"])  # bge-reranker's id2label
        _add_tokenizer(w, shape, source_metadata)

    def tensor_data(rng: np.random.Generator, t: PlannedTensor, qtype: Q) -> np.ndarray:
        if t.kind == "matrix":
            return random_matrix(rng, qtype, *t.shape, MATRIX_STD)
        center = 1.0 if t.kind == "norm" else 0.0
        spread = NORM_STD if t.kind == "norm" else BIAS_STD
        return (center + spread * rng.standard_normal(t.shape)).astype(np.float32)

    return write_planned_gguf(path, "bert", plan, types, add_keys, tensor_data, seed=seed, progress=progress)
