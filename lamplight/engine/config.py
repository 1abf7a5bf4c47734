"""Engine settings (the CLI's -c, -np, -b, -ub, --queue-size, --context-shift...)."""

from __future__ import annotations

from dataclasses import dataclass, field

from lamplight.serve_flags import MAX_DEFAULT_CTX, default_of
from lamplight.speculative import SpecConfig
from lamplight.state.kv_types import KV_TYPES, KVType

from .checkpoints import DEFAULT_INTERVAL, DEFAULT_PER_SLOT

# `-ctk/-ctv` values (llama-server's names) this engine stores the KV cache in.
CACHE_TYPES: dict[str, KVType] = KV_TYPES


@dataclass
class EngineConfig:
    """The defaults of the settings a serve flag sets are the flag's (lamplight.serve_flags)."""

    n_ctx: int = MAX_DEFAULT_CTX  # total KV context: the pool's tokens
    n_parallel: int = default_of("engine.n_parallel")  # slots
    # One pool shared by the slots (llama-server's --kv-unified): a sequence may hold up to n_ctx
    # tokens while there is room, idle slots' cached tokens give way, and a running sequence
    # that finds no room is preempted (lamplight.engine.kv_room). Off: n_ctx split evenly.
    kv_unified: bool = False
    # The host-memory prompt cache (--cache-ram, lamplight.engine.prompt_cache): MiB, 0 off, -1 no limit.
    cache_ram_mib: int = 0
    # logical batch (accepted as in llama-server; the step budget is n_ubatch)
    n_batch: int = default_of("engine.n_batch")
    n_ubatch: int = default_of("engine.n_ubatch")  # tokens per forward step: decode tokens first, then prompt chunks
    queue_size: int = default_of("engine.queue_size")  # requests waiting for a slot before new ones get 503
    block_size: int = 16  # tokens per KV block
    context_shift: bool = default_of("engine.context_shift")
    slot_prompt_similarity: float = 0.1
    device: str = "cpu"
    # KV cache storage. float32 by default (llama-server's default is f16): on CPUs without
    # native half-precision math, converting the gathered keys back costs more than the memory.
    cache_type_k: str = "f32"
    cache_type_v: str = "f32"
    # Models with recurrent layers (lamplight.engine.checkpoints): snapshots of each slot's state
    # kept for follow-up turns (--ctx-checkpoints), every `checkpoint_interval` tokens.
    ctx_checkpoints: int = DEFAULT_PER_SLOT
    checkpoint_interval: int = DEFAULT_INTERVAL
    # Speculative decoding (--spec-type ...; lamplight.speculative): the kinds and their sizes.
    speculative: SpecConfig = field(default_factory=SpecConfig)

    @property
    def cache_dtypes(self) -> tuple[KVType, KVType]:
        return CACHE_TYPES[self.cache_type_k], CACHE_TYPES[self.cache_type_v]

    @property
    def n_ctx_slot(self) -> int:
        """The most tokens one sequence holds."""
        return self.n_ctx if self.kv_unified else self.n_ctx // self.n_parallel

    def validate(self) -> None:
        if self.n_parallel < 1:
            raise ValueError("--parallel must be at least 1")
        if self.n_ctx_slot < 8:
            raise ValueError(f"--ctx-size {self.n_ctx} leaves fewer than 8 tokens per slot for {self.n_parallel} slots")
        if self.n_ubatch < self.n_parallel:
            raise ValueError("--ubatch-size must be at least --parallel (one decode token per slot per step)")
        for flag, value in (("--cache-type-k", self.cache_type_k), ("--cache-type-v", self.cache_type_v)):
            if value not in CACHE_TYPES:
                raise ValueError(f"{flag} {value!r} is not supported: use one of {', '.join(CACHE_TYPES)}")
        if self.ctx_checkpoints < 0:
            raise ValueError(f"--ctx-checkpoints must be >= 0 (0: no checkpoints), not {self.ctx_checkpoints}")
        if self.checkpoint_interval < 1:
            raise ValueError(f"--ctx-checkpoint-interval must be >= 1, not {self.checkpoint_interval}")
        if self.queue_size < 0:
            raise ValueError("--queue-size must be >= 0")
