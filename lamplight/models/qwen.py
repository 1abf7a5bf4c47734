"""The Qwen family: `qwen2` (Q/K/V biases), `qwen3` (per-head Q/K RMSNorm, head size from
attention.key_length) and `qwen3moe` (qwen3 attention, softmax-routed experts, top-k weights
renormalised). All NEOX rope; an output bias where the file has one."""

from __future__ import annotations

from ..gguf.file import GGUFFile
from .config import ModelConfig
from .options import DecoderOptions, MoEOptions, read_rope


def qwen2_options(gguf: GGUFFile, config: ModelConfig) -> DecoderOptions:
    return DecoderOptions(neox_rope=True, rope_scaling=read_rope(gguf, config))


def qwen3moe_options(gguf: GGUFFile, config: ModelConfig) -> DecoderOptions:
    moe = MoEOptions(n_used=int(gguf.require_arch_value("expert_used_count")), gating="softmax", normalize=True)
    return DecoderOptions(neox_rope=True, rope_scaling=read_rope(gguf, config), moe=moe)
