"""What every architecture provides to the engine, and how a GGUF file becomes a model."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..engine.kv_cache import KVCache, KVLayout
from ..gguf.file import GGUFError, GGUFFile
from ..gguf.quant import dequantize
from .batch import ForwardBatch
from .layers import QuantLinear

log = logging.getLogger("lamplight")


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


class CausalLM(nn.Module):
    """Base of all architectures: `forward(batch, kv)` returns logits for `batch.logit_rows`."""

    config: ModelConfig

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config

    def load_decoder(self, w: "WeightSource", block_cls) -> None:
        """Embeddings, the layers (`block_cls(w, i, eps)`), the final norm and the output head."""
        from .layers import RMSNorm

        cfg = self.config
        self.token_embd_info = w.info("token_embd.weight")  # raw blocks; float32 only when needed
        self.blocks = nn.ModuleList(block_cls(w, i, cfg.rms_eps) for i in range(cfg.n_layers))
        self.output_norm = RMSNorm(w.dense("output_norm.weight"), cfg.rms_eps)
        self.output = w.linear("output.weight") if w.has("output.weight") else None

    native = None  # a lamplight.native.NativeModel computing every step, when the native kernels serve

    @property
    def token_embd(self) -> torch.Tensor:
        """The float32 embedding table, dequantized on first use (the native path reads the raw
        rows instead: for a large vocabulary this table is the biggest float32 copy there is)."""
        table = self._buffers.get("_token_embd")
        if table is None:
            table = dequantize(self.token_embd_info)
            self.register_buffer("_token_embd", table, persistent=False)
        return table

    def use_torch_kernels(self, reason: str) -> None:
        """Leave the native forward for PyTorch's fast kernels (LoRA adapters and torch.compile
        need the PyTorch modules)."""
        if self.native is not None:
            from ..kernels.fast_path import use_fast_path

            log.info("using PyTorch's kernels: %s", reason)
            self.native = None
            use_fast_path(self)

    row_split = None  # set by the fast path: its kernels treat decode rows apart from prompt rows

    def embed(self, batch: ForwardBatch) -> torch.Tensor:
        h = self.token_embd[batch.token_ids]
        if batch.embedding_overrides is not None:
            rows, values = batch.embedding_overrides
            h[rows] = values.to(h.dtype)
        return h

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """Logits from final hidden states: the output weight, or the tied embedding."""
        if self.output is not None:
            return self.output(h)
        if self.tied_head_kernel is not None:
            return self.tied_head_kernel(h)
        return F.linear(h, self.token_embd)

    tied_head_kernel = None  # set by the fast path (e.g. a bf16 copy of the embedding)

    def forward(self, batch: ForwardBatch, kv: KVCache) -> torch.Tensor:
        if self.native is not None:
            return self.native(batch, kv)
        if self.row_split is not None:
            self.row_split.decode_rows = batch.leading_decode_tokens
        return self.compute(batch, kv)

    def compute(self, batch: ForwardBatch, kv: KVCache) -> torch.Tensor:  # pragma: no cover - abstract
        """The architecture's forward pass: logits for `batch.logit_rows`."""
        raise NotImplementedError

    def rope_for_layer(self, layer: int):
        """The Rotary module that layer `layer` applies to its keys."""
        raise NotImplementedError

    @torch.inference_mode()
    def shift_kv(self, kv: KVCache, src: torch.Tensor, dst: torch.Tensor, delta: int) -> None:
        """Move cached K/V entries from pool indices `src` to `dst`, re-rotating keys by `delta`
        positions (context shift), so nothing has to be recomputed."""
        for layer in range(self.config.n_layers):
            k, v = kv.read(layer, src)
            kv.write(layer, dst, self.rope_for_layer(layer).rotate_by(k.float(), delta), v)


class WeightSource:
    """Takes tensors out of a GGUF file by name, with clear errors for missing ones."""

    def __init__(self, gguf: GGUFFile):
        self.gguf = gguf

    def has(self, name: str) -> bool:
        return name in self.gguf.tensors

    def linear(self, name: str) -> QuantLinear:
        return QuantLinear(self.info(name))

    def dense(self, name: str) -> torch.Tensor:
        return dequantize(self.info(name))

    def optional_dense(self, name: str) -> torch.Tensor | None:
        """A norm, bias or other small tensor that only some files (or architectures) have."""
        return self.dense(name) if self.has(name) else None

    def info(self, name: str):
        info = self.gguf.tensors.get(name)
        if info is None:
            raise GGUFError(f"{self.gguf.path}: tensor {name} is missing")
        return info


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
