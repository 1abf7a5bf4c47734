"""The runner interface: the one thing that computes a model.

A runner is built once from a model definition (lamplight.models.spec.DecoderSpec) for one
backend (`lamplight.loader.build_runner` is the one place the backend is chosen), and is all an
engine calls: `step(chunks, state)` computes one step (every chunk's tokens, K/V written into
`state`) and returns the logits of the rows that need them as a float32 numpy array, what the
sampler takes. Whoever calls it owns the state (`new_state`) and says which state indices each
chunk reads and writes. `run` is the same step with the logits as a PyTorch tensor (tests and
library users compare and score with them).

Backends: "reference" (PyTorch, dequantized float32: what the fidelity tests check), "pytorch"
(PyTorch's packed 4-bit and bf16 kernels), "compiled" (pytorch with decode steps through
torch.compile), "native" (the C++ forward of lamplight.native, on numpy state: a native engine
never imports torch).

This module imports without torch.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Sequence

from ..models.config import ModelConfig
from ..models.lora import LoraScales
from ..models.spec import DecoderSpec
from ..state import StateSpec

if TYPE_CHECKING:
    import numpy as np
    import torch

    from ..models.batch import ForwardBatch
    from ..models.chunks import SequenceChunk
    from ..state import ModelState


class ModelRunner(ABC):
    backend: str = ""
    # The KV cache type a server stores for this backend unless told (-ctk/-ctv).
    default_cache_type: str = "f32"
    # Whether the backend computes on threads of its own (PyTorch's then need only one).
    owns_threads: bool = False
    # Whether each row of a multi-token chunk is computed exactly as a decode row (one-token
    # chunk) at its position: then a speculative draft is verified as one chunk (its keys read
    # once) instead of one chunk per drafted token.
    chunk_rows_are_decode_rows: bool = False

    def __init__(self, spec: DecoderSpec):
        self.spec = spec
        self.lora_scales: LoraScales | None = None  # the adapters' scales for the next step

    @property
    def config(self) -> ModelConfig:
        return self.spec.config

    @property
    def state_spec(self) -> StateSpec:
        return self.spec.state_spec

    @abstractmethod
    def new_state(self, num_tokens: int, k_dtype=None, v_dtype=None, device: str = "cpu",
                  n_sequences: int = 1) -> ModelState:
        """Storage for `num_tokens` token positions of K/V shared by all sequences, and (models
        with recurrent layers) `n_sequences` recurrent state slots (SequenceChunk.state_slot).
        K is stored as `k_dtype` (a KV type, its name or a float dtype: lamplight.state.kv_type;
        None: f32), V as `v_dtype` (None: as K)."""

    @abstractmethod
    def step(self, chunks: Sequence[SequenceChunk], state: ModelState) -> np.ndarray:
        """One step over `chunks` (in row order): logits [rows needing them, vocab] as a float32
        numpy array (the engine's step)."""

    def run(self, chunks: Sequence[SequenceChunk], state: ModelState) -> torch.Tensor:
        """`step`'s logits as a PyTorch tensor."""
        from ..models.batch import build_forward_batch

        return self.run_batch(build_forward_batch(chunks, device=state.device), state)

    @abstractmethod
    def run_batch(self, batch: ForwardBatch, state: ModelState) -> torch.Tensor:
        """`run` for a batch already built (tests build mixed batches by hand)."""

    @abstractmethod
    def shift_kv(self, state: ModelState, src: Sequence[int], dst: Sequence[int], delta: int) -> None:
        """Move cached K/V entries from indices `src` to `dst` (sequences of ints or int64
        arrays), their positions moved by `delta` (context shift: keys are re-rotated, nothing is
        recomputed)."""

    @abstractmethod
    def describe(self) -> str:
        """What computes the model, for the start-up log and /props (e.g. 'pytorch reference')."""

    @abstractmethod
    def attach_loras(self, adapters: list) -> LoraScales:
        """Apply these LoRA adapters (lamplight.models.lora) from now on; returns their per-step
        scales (all 0 until set)."""

    @abstractmethod
    def weight_bytes(self) -> int:
        """Bytes of the weights this backend reads."""

    def scratch_bytes(self) -> int | None:
        """Bytes of working buffers the steps have grown so far (None: not tracked)."""
        return None

    def warm_up(self, state: ModelState) -> None:
        """Prepare before serving (compile graphs) on free indices of `state`."""
