"""The Qwen 3.5 hybrids: `qwen35` and `qwen35moe` (Qwen 3.5 / 3.6 as converted by llama.cpp).

Layers interleave Gated DeltaNet (linear attention, lamplight.models.recurrent) with gated full
attention: layer il attends iff (il + 1) % full_attention_interval == 0, unless the file lists
its recurrent layers (attention.recurrent_layers, which llama.cpp also accepts). Attention: Q
rows interleave each head's query and its sigmoid output gate, per-head Q/K RMSNorm, IMRoPE,
which for text tokens is NEOX rope on the first rope.dimension_count dims. The FFN input norm is
stored as post_attention_norm. qwen35moe: softmax-routed experts (top-k renormalised) plus a
shared expert scaled by sigmoid(ffn_gate_inp_shexp . x). MTP (NextN) draft layers are not run.
"""

from __future__ import annotations

from ..gguf.file import GGUFError, GGUFFile
from .config import ModelConfig
from .options import DecoderOptions, MoEOptions, SSMOptions, read_rope


def read_ssm(gguf: GGUFFile) -> SSMOptions:
    """The ssm.* keys Gated DeltaNet and Mamba2 layers read."""
    return SSMOptions(
        conv_kernel=int(gguf.require_arch_value("ssm.conv_kernel")),
        state_size=int(gguf.require_arch_value("ssm.state_size")),
        group_count=int(gguf.require_arch_value("ssm.group_count")),
        time_step_rank=int(gguf.require_arch_value("ssm.time_step_rank")),
        inner_size=int(gguf.require_arch_value("ssm.inner_size")),
    )


def _layer_kinds(gguf: GGUFFile, n_layers: int) -> tuple[str, ...]:
    explicit = gguf.arch_value("attention.recurrent_layers")
    if explicit is not None:
        flags = [bool(x) for x in explicit]
        if len(flags) != n_layers:
            raise GGUFError(f"{gguf.path}: attention.recurrent_layers has {len(flags)} entries for {n_layers} layers")
        return tuple("deltanet" if f else "attention" for f in flags)
    interval = int(gguf.require_arch_value("full_attention_interval"))
    if interval < 1:
        raise GGUFError(f"{gguf.path}: full_attention_interval {interval}")
    return tuple("attention" if (il + 1) % interval == 0 else "deltanet" for il in range(n_layers))


def qwen35_options(gguf: GGUFFile, config: ModelConfig) -> DecoderOptions:
    return DecoderOptions(
        neox_rope=True,
        rope_scaling=read_rope(gguf, config),
        ffn_norm_tensor="post_attention_norm.weight",
        layer_kinds=_layer_kinds(gguf, config.n_layers),
        ssm=read_ssm(gguf),
        attn_output_gate=True,
    )


def qwen35moe_options(gguf: GGUFFile, config: ModelConfig) -> DecoderOptions:
    moe = MoEOptions(n_used=int(gguf.require_arch_value("expert_used_count")), gating="softmax", normalize=True)
    base = qwen35_options(gguf, config)
    return DecoderOptions(**{**base.__dict__, "moe": moe})
