"""The hyperparameters every architecture shares, read from a GGUF file's keys."""

from __future__ import annotations

from dataclasses import dataclass

from ..gguf.file import GGUFError, GGUFFile
from ..state import KVLayout, StateSpec


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    n_layers: int
    n_embd: int
    n_heads: int
    n_kv_heads: int
    head_dim_k: int
    head_dim_v: int
    n_ff: int
    vocab_size: int
    n_ctx_train: int
    rms_eps: float

    @property
    def kv_layout(self) -> KVLayout:
        return KVLayout(self.n_layers, self.n_kv_heads, self.head_dim_k, self.head_dim_v)

    @property
    def state_spec(self) -> StateSpec:
        """The per-sequence state the model keeps: every layer attends, so every layer has K/V."""
        return StateSpec(self.kv_layout)


def read_common_config(gguf: GGUFFile) -> ModelConfig:
    n_embd = int(gguf.require_arch_value("embedding_length"))
    n_heads = int(gguf.require_arch_value("attention.head_count"))
    n_kv_heads = gguf.arch_value("attention.head_count_kv", n_heads)
    if not isinstance(n_kv_heads, int):
        raise GGUFError(f"{gguf.path}: per-layer head counts are not supported")
    head_dim_k = int(gguf.arch_value("attention.key_length", n_embd // n_heads))
    head_dim_v = int(gguf.arch_value("attention.value_length", n_embd // n_heads))
    tokens = gguf.metadata.get("tokenizer.ggml.tokens")
    vocab = gguf.arch_value("vocab_size") or (len(tokens) if tokens is not None else None)
    if vocab is None:
        vocab = gguf.tensors["token_embd.weight"].shape[0]
    return ModelConfig(
        architecture=gguf.architecture,
        n_layers=int(gguf.require_arch_value("block_count")),
        n_embd=n_embd,
        n_heads=n_heads,
        n_kv_heads=int(n_kv_heads),
        head_dim_k=head_dim_k,
        head_dim_v=head_dim_v,
        n_ff=int(gguf.require_arch_value("feed_forward_length")),
        vocab_size=int(vocab),
        n_ctx_train=int(gguf.arch_value("context_length", 4096)),
        rms_eps=float(gguf.arch_value("attention.layer_norm_rms_epsilon", 1e-5)),
    )
