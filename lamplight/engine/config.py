"""Engine settings (the CLI's -c, -np, -b, -ub, --queue-size, --context-shift...)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EngineConfig:
    n_ctx: int = 4096  # total KV context, split evenly across slots
    n_parallel: int = 4  # slots
    n_batch: int = 2048  # logical batch (accepted as in llama-server; the step budget is n_ubatch)
    n_ubatch: int = 512  # tokens per forward step: decode tokens first, then prompt chunks
    queue_size: int = 64  # requests waiting for a slot before new ones get 503
    block_size: int = 16  # tokens per KV block
    context_shift: bool = False
    slot_prompt_similarity: float = 0.1
    device: str = "cpu"
    compile: bool = False  # decode-only steps through torch.compile (lamplight.kernels.compiled)

    @property
    def n_ctx_slot(self) -> int:
        return self.n_ctx // self.n_parallel

    def validate(self) -> None:
        if self.n_parallel < 1:
            raise ValueError("--parallel must be at least 1")
        if self.n_ctx_slot < 8:
            raise ValueError(f"--ctx-size {self.n_ctx} leaves fewer than 8 tokens per slot for {self.n_parallel} slots")
        if self.n_ubatch < self.n_parallel:
            raise ValueError("--ubatch-size must be at least --parallel (one decode token per slot per step)")
        if self.queue_size < 0:
            raise ValueError("--queue-size must be >= 0")
