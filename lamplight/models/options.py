"""What an architecture does beyond its tensors: `DecoderOptions`, filled by each architecture's
module from its GGUF keys, and the key readers those modules share.

What a layer *has* is read from its tensors (lamplight.models.spec: biases, fused Q/K/V or
gate/up, Q/K norms per head or over the projection, norms before or after each branch, sinks, a
router); what the tensors cannot tell (rope layout, activation, scales, softcaps, which layers
slide) is written here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..gguf.file import GGUFError, GGUFFile
from .config import ModelConfig
from .rope_scaling import RopeScaling, read_rope_scaling


@dataclass(frozen=True)
class MoEOptions:
    n_used: int
    gating: str = "softmax"  # or "softmax_selected" (see lamplight.models.moe)
    normalize: bool = True
    activation: str = "silu"  # a name of lamplight.models.activations.ACTIVATIONS


@dataclass(frozen=True)
class SSMOptions:
    """The recurrent layers' hyperparameters (llama.cpp's ssm.* / shortconv.* keys); which of them
    a mixer reads depends on its kind (lamplight.models.spec)."""

    conv_kernel: int  # K: the causal convolution's taps (its state keeps K - 1 inputs)
    state_size: int = 0  # Gated DeltaNet: head size d of q/k/v; Mamba2: N, the SSM state per channel
    group_count: int = 0  # Gated DeltaNet: q/k heads; Mamba2: B/C groups
    time_step_rank: int = 0  # Gated DeltaNet: v heads; Mamba2: SSM heads
    inner_size: int = 0  # Gated DeltaNet: v heads x d; Mamba2: D


@dataclass(frozen=True)
class QueryTemperature:
    """llama 4 / Mistral 3 attention temperature: q *= 1 + scale * ln(floor((pos + offset) / length) + 1)."""

    scale: float
    length: int
    offset: float = 0.0

    def factors(self, positions):
        """Per row query factors, float32, for a torch tensor of positions (tensor methods
        only: the options import without torch)."""
        steps = ((positions.double() + self.offset) / self.length).floor()
        return ((steps + 1.0).log() * self.scale + 1.0).float()


@dataclass(frozen=True)
class DecoderOptions:
    neox_rope: bool = True
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    scaled_rope_on_sliding: bool = True  # False: sliding layers rotate with the plain rope (OLMo 3, Gemma 3)
    sliding_rope_base: float | None = None  # the sliding layers' own rope base (Gemma 3); None: the file's
    activation: str = "silu"  # the dense FFN's gate/up combination (lamplight.models.activations)
    embd_scale: float = 1.0
    residual_scale: float = 1.0  # branch outputs times this before the residual add (granite)
    logit_scale: float = 1.0  # logits divided by this (granite)
    final_softcap: float | None = None
    attn_softcap: float | None = None
    attn_scale: float | None = None  # None: 1 / sqrt(head_dim)
    sliding_layers: tuple[bool, ...] = ()  # per layer; empty: none
    window: int = 0
    ffn_norm_tensor: str = "ffn_norm.weight"  # gpt-oss calls its FFN input norm post_attention_norm
    query_temperature: QueryTemperature | None = None
    moe: MoEOptions | None = None
    # Hybrid stacks: per layer "attention" or a recurrent mixer ("deltanet", "shortconv",
    # "mamba2"); empty: every layer attends.
    layer_kinds: tuple[str, ...] = ()
    ssm: SSMOptions | None = None
    attn_output_gate: bool = False  # Q rows interleave a sigmoid output gate per head (qwen35)
    no_rope_layers: tuple[bool, ...] = ()  # per layer: attention without rotation (smollm3's NoPE); empty: none
    sliding_head_dims: tuple[int, int] | None = None  # sliding layers' own (head_dim_k, head_dim_v) (gemma4)
    sliding_rope_dims: int | None = None  # sliding layers' own rotated dims, without rope_freqs (gemma4)
    shared_kv_layers: int = 0  # the last n layers attend over an earlier layer's K/V (gemma4)
    value_norm: bool = False  # V normalised (RMS, no weight) before caching (gemma4)
    attn_v_optional: bool = False  # a layer without attn_v uses its raw K projection as V (gemma4)
    output_norm_tensor: str = "output_norm.weight"  # lfm2: token_embd_norm.weight


# The mixers a layer of a hybrid stack can have (DecoderOptions.layer_kinds).
RECURRENT_KINDS = ("deltanet", "shortconv", "mamba2")


def layer_kind(opts: DecoderOptions, layer: int) -> str:
    return opts.layer_kinds[layer] if opts.layer_kinds else "attention"


def sliding_pattern(gguf: GGUFFile, n_layers: int, period: int | None = None, default_period: int | None = None,
                    default_window: int = 0) -> tuple[bool, ...]:
    """Which layers use the sliding window, as llama.cpp decides: a fixed `period` for the
    architectures whose loader hard-codes one (gemma2, gemma3, gpt-oss), else the file's
    attention.sliding_window_pattern (a bool per layer, or a period), else `default_period`.
    A period n makes layer il sliding when il % n < n - 1. None without a window."""
    if not gguf.arch_value("attention.sliding_window", default_window):
        return ()
    pattern = period if period is not None else gguf.arch_value("attention.sliding_window_pattern", default_period)
    if pattern is None:
        return ()
    if isinstance(pattern, (int, float)) and not isinstance(pattern, bool):
        n = int(pattern)
        return tuple(il % n < n - 1 for il in range(n_layers))
    values = [bool(x) for x in pattern]
    if len(values) != n_layers:
        raise GGUFError(f"{gguf.path}: attention.sliding_window_pattern has {len(values)} entries for {n_layers} layers")
    return tuple(values)


def read_rope(gguf: GGUFFile, config: ModelConfig, **kwargs) -> RopeScaling:
    return read_rope_scaling(gguf, config.n_ctx_train, **kwargs)


def scale_key(gguf: GGUFFile, key: str, default: float = 1.0) -> float:
    """A float hyperparameter where 0 (llama.cpp's 'unset') means the default."""
    value = float(gguf.arch_value(key, 0.0) or 0.0)
    return value if value != 0.0 else default
