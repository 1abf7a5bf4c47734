"""The "compiled" backend: the pytorch backend with decode-only steps through torch.compile (inductor).

At one or a few sequences a decode step is mostly small ops (norms, RoPE, residual adds, the
attention's reshapes) and the Python between them; inductor fuses them into a few generated C++
loops and calls the packed matmuls directly. Prompt chunks run eagerly: a step that carries
both runs its decode tokens through the compiled graph and its prompt chunks in a second,
eager forward, so a decode token is computed the same way whatever shares its step (batch
invariance, as on the eager path). With LoRA adapters loaded every step runs eagerly (their
scales change per request).

Compiling takes up to about four minutes on a 2-core CPU (once per process; inductor caches
its work on disk, so later starts take one to two and a half), which is why it is opt-in
(`lamplight serve --compile`).
Shapes are compiled dynamic, so any batch size and context length reuse one compiled graph.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..models.batch import DECODE_KEY_ALIGN, ForwardBatch, SequenceChunk, build_forward_batch, count_leading_decode
from ..models.spec import DecoderSpec
from ..state import ModelState
from .torch_runner import TorchRunner

# Decode steps run at start-up so that every graph is compiled before requests arrive:
# (sequences, context length). A batch of one gets its own graph (PyTorch specializes sizes 0
# and 1); the others make the batch size and the key length dynamic.
WARM_UP_SHAPES = ((1, 3 * DECODE_KEY_ALIGN), (2, 3 * DECODE_KEY_ALIGN))

# Every row of a decode-only step is a decode row: a constant (not the batch size), so the
# compiled graph never specializes on it.
ALL_ROWS = 1 << 30


class CompiledRunner(TorchRunner):
    backend = "compiled"

    def __init__(self, spec: DecoderSpec, device: str = "cpu"):
        super().__init__(spec, fast=True, device=device)
        self.backend = "compiled"
        # Without this a context length equal to some model size (64 = a head's width) would be
        # compiled as that constant, and every other length would compile again.
        torch.fx.experimental._config.use_duck_shape = False
        self._compute = torch.compile(self.model.compute, dynamic=True)

    @property
    def _eager_only(self) -> bool:
        # Adapter scales change per request; with adapters loaded every step runs eagerly.
        return self.lora_scales is not None

    def run(self, chunks: Sequence[SequenceChunk], state: ModelState) -> torch.Tensor:
        """The decode rows through the compiled graph, the prompt chunks in a second, eager
        forward: a decode token is computed the same way whatever shares its step."""
        n_decode = count_leading_decode(chunks)
        if self._eager_only or n_decode == 0:
            return super().run(chunks, state)
        logits = self.run_batch(build_forward_batch(chunks[:n_decode], device=state.device), state)
        if n_decode == len(chunks):
            return logits
        return torch.cat((logits, super().run(chunks[n_decode:], state)))

    def handles(self, batch: ForwardBatch) -> bool:
        groups = batch.groups
        return (
            len(groups) == 1
            and groups[0].is_decode
            and groups[0].leading_rows
            and batch.embedding_overrides is None
            and not self._eager_only
        )

    def run_batch(self, batch: ForwardBatch, state: ModelState) -> torch.Tensor:
        if not self.handles(batch):
            return super().run_batch(batch, state)
        self.model.row_split.decode_rows = ALL_ROWS
        return self._compute(batch, state)

    def describe(self) -> str:
        return "pytorch fast, compiled decode steps"

    @torch.no_grad()
    def warm_up(self, state: ModelState) -> None:
        """Compile now, before any sequence holds state: the warm-up steps write scratch K/V at
        the first indices. Call it in the autograd mode the steps will run in (the engine's: no
        grad, not inference mode): the graphs are guarded on it, and a mismatch would compile
        again while serving."""
        size = state.kv.num_tokens
        for n_seqs, context in WARM_UP_SHAPES:
            chunks = [SequenceChunk([0], context - 1, [(s * context + p) % size for p in range(context)])
                      for s in range(n_seqs)]
            self.run_batch(build_forward_batch(chunks, device=state.device), state)
