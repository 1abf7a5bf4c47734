"""The PyTorch backends: the decoder's modules on the reference kernels, or on the fast ones,
on PyTorch state (lamplight.state.torch_pools) on their device."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ..models.batch import ForwardBatch, SequenceChunk
from ..models.decoder import Decoder
from ..models.layers import shift_kv
from ..models.lora import LoraScales, check_adapters
from ..models.lora_hooks import attach_loras
from ..models.spec import DecoderSpec
from ..sampling.arrays import as_logits
from ..state import ModelState
from ..state.torch_pools import torch_state
from .base import ModelRunner
from .fast_path import use_fast_path


class TorchRunner(ModelRunner):
    """`fast=False`: "reference", dequantized float32 (the fidelity tests' path). `fast=True`:
    "pytorch", packed 4-bit and int8/bf16 kernels (lamplight.runner.fast_path); `why_not_native`
    says why the native forward does not serve instead."""

    def __init__(self, spec: DecoderSpec, fast: bool = False, device: str = "cpu", why_not_native: str | None = None):
        super().__init__(spec)
        self.backend = "pytorch" if fast else "reference"
        self.why_not_native = why_not_native
        self.model = Decoder(spec).eval().requires_grad_(False)
        if fast:
            use_fast_path(self.model, device)
        if device != "cpu":
            self.model.token_embd  # materialised here so that .to() moves it
            self.model.to(device)

    def new_state(self, num_tokens: int, k_dtype=None, v_dtype=None, device: torch.device | str = "cpu",
                  n_sequences: int = 1) -> ModelState:
        return torch_state(self.state_spec, num_tokens, k_dtype, v_dtype, device, n_sequences)

    def step(self, chunks: Sequence[SequenceChunk], state: ModelState) -> np.ndarray:
        """`run` without autograd (as CompiledRunner.warm_up compiles its graphs), its logits
        brought to the CPU as numpy."""
        with torch.no_grad():
            return as_logits(self.run(chunks, state))

    def run_batch(self, batch: ForwardBatch, state: ModelState) -> torch.Tensor:
        if self.model.row_split is not None:
            self.model.row_split.decode_rows = batch.leading_decode_tokens
        return self.model.compute(batch, state)

    def shift_kv(self, state: ModelState, src: Sequence[int], dst: Sequence[int], delta: int) -> None:
        index = lambda slots: torch.as_tensor(slots, dtype=torch.long, device=state.device)  # noqa: E731
        shift_kv(state.kv, self.model.layer_ropes(), index(src), index(dst), delta)

    def attach_loras(self, adapters: list) -> LoraScales:
        check_adapters(self.spec, adapters)
        self.lora_scales = attach_loras(self.model, adapters)
        return self.lora_scales

    def describe(self) -> str:
        if self.backend == "reference":
            return "pytorch reference"
        return f"pytorch fast ({self.why_not_native})" if self.why_not_native else "pytorch fast"

    def weight_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.model.state_dict().values())
