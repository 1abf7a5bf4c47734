"""Facts about the loaded model for /v1/models and /props, computed as llama.cpp reports them."""

from __future__ import annotations

import math
from typing import Any

from gguf import LlamaFileType

# llama_vocab_type values.
_VOCAB_TYPES = {"llama": 1, "gpt2": 2, "bert": 3, "t5": 4, "rwkv": 5, "plamo2": 6}
_K_QUANT_SIZES = {"S": "Small", "M": "Medium", "L": "Large"}


def ftype_name(value: int | None) -> str:
    """llama_model_ftype_name() of a general.file_type: "Q4_1", "Q4_K - Medium", "F16", "all F32"..."""
    if value is None:
        return "unknown"
    try:
        name = LlamaFileType(int(value)).name
    except ValueError:
        return "unknown"
    if name == "ALL_F32":
        return "all F32"
    name = name.removeprefix("MOSTLY_")
    head, _, size = name.rpartition("_")
    if head.endswith("_K") and size in _K_QUANT_SIZES:
        return f"{head} - {_K_QUANT_SIZES[size]}"
    return name


def vocab_type(metadata: dict) -> int:
    return _VOCAB_TYPES.get(metadata.get("tokenizer.ggml.model", ""), 0)


def n_params(gguf: Any) -> int:
    return sum(math.prod(t.shape) for t in gguf.tensors.values())


def tensor_bytes(gguf: Any) -> int:
    return sum(int(t.data.nbytes) for t in gguf.tensors.values())


def token_text(tokenizer: Any, token_id: int | None) -> str:
    if token_id is None:
        return ""
    return tokenizer.token_bytes(token_id).decode("utf-8", "replace")


def model_meta(model: Any, n_ctx: int) -> dict:
    gguf, config = model.gguf, model.spec.config
    return {
        "vocab_type": vocab_type(gguf.metadata),
        "n_vocab": model.tokenizer.vocab_size,
        "n_ctx": n_ctx,
        "n_ctx_train": config.n_ctx_train,
        "n_embd": config.n_embd,
        "n_params": n_params(gguf),
        "size": tensor_bytes(gguf),
        "ftype": ftype_name(model.file_type),
    }


def embedder_meta(embedder: Any) -> dict:
    """/v1/models `meta` of a model that only embeds (an encoder)."""
    return {"vocab_type": 0, "n_vocab": embedder.vocab_size, "n_ctx_train": embedder.n_ctx,
            "n_embd": embedder.n_embd, "n_params": 0, "size": embedder.path.stat().st_size,
            "pooling": embedder.pooling.value}
