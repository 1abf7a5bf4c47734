"""The hyperparameters every architecture shares, read from a GGUF file's keys."""

from __future__ import annotations

from dataclasses import dataclass

from ..gguf.file import GGUFError, GGUFFile
from ..state.layout import KVLayout


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
    # Where the file gives per-layer arrays (hybrids, gemma4): the values per layer (0 KV heads
    # marks a recurrent layer in lfm2 / granitehybrid); empty: every layer has the scalar above,
    # which is otherwise the largest entry.
    layer_kv_heads: tuple[int, ...] = ()
    layer_n_ff: tuple[int, ...] = ()

    @property
    def kv_layout(self) -> KVLayout:
        """The K/V of a stack whose every layer attends alike (DecoderSpec.state_spec has the
        general one: only the attention layers that keep their own K/V)."""
        return KVLayout(self.n_layers, self.n_kv_heads, self.head_dim_k, self.head_dim_v)

    def kv_heads(self, layer: int) -> int:
        return self.layer_kv_heads[layer] if self.layer_kv_heads else self.n_kv_heads


def read_common_config(gguf: GGUFFile) -> ModelConfig:
    n_embd = int(gguf.require_arch_value("embedding_length"))
    n_heads = int(gguf.require_arch_value("attention.head_count"))
    n_layers = int(gguf.require_arch_value("block_count"))
    layer_kv_heads = _per_layer(gguf, "attention.head_count_kv", n_layers, n_heads)
    layer_n_ff = _per_layer(gguf, "feed_forward_length", n_layers, None)
    head_dim_k = int(gguf.arch_value("attention.key_length", n_embd // n_heads))
    head_dim_v = int(gguf.arch_value("attention.value_length", n_embd // n_heads))
    tokens = gguf.metadata.get("tokenizer.ggml.tokens")
    vocab = gguf.arch_value("vocab_size") or (len(tokens) if tokens is not None else None)
    if vocab is None:
        vocab = gguf.tensors["token_embd.weight"].shape[0]
    return ModelConfig(
        architecture=gguf.architecture,
        n_layers=n_layers,
        n_embd=n_embd,
        n_heads=n_heads,
        n_kv_heads=max(layer_kv_heads),
        head_dim_k=head_dim_k,
        head_dim_v=head_dim_v,
        n_ff=max(layer_n_ff),
        vocab_size=int(vocab),
        n_ctx_train=int(gguf.arch_value("context_length", 4096)),
        rms_eps=float(gguf.arch_value("attention.layer_norm_rms_epsilon", 1e-5)),
        layer_kv_heads=layer_kv_heads if len(set(layer_kv_heads)) > 1 else (),
        layer_n_ff=layer_n_ff if len(set(layer_n_ff)) > 1 else (),
    )


def _per_layer(gguf: GGUFFile, key: str, n_layers: int, default: int | None) -> tuple[int, ...]:
    """A key that is one integer for all layers or an array of one per layer, as a tuple per layer."""
    value = gguf.arch_value(key, default) if default is not None else gguf.require_arch_value(key)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (int(value),) * n_layers
    values = tuple(int(v) for v in value)
    if len(values) != n_layers:
        raise GGUFError(f"{gguf.path}: {gguf.architecture}.{key} has {len(values)} entries for {n_layers} layers")
    return values
