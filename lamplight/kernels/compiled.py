"""A compiled decode step: torch.compile (inductor) of the model's forward for decode-only steps.

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

from ..engine.kv_cache import BlockTable, KVCache
from ..models.base import CausalLM
from ..models.batch import DECODE_KEY_ALIGN, ForwardBatch, SequenceChunk, build_forward_batch, count_leading_decode

# Decode steps run at start-up so that every graph is compiled before requests arrive:
# (sequences, context length). A batch of one gets its own graph (PyTorch specializes sizes 0
# and 1); the others make the batch size and the key length dynamic.
WARM_UP_SHAPES = ((1, 3 * DECODE_KEY_ALIGN), (2, 3 * DECODE_KEY_ALIGN))

# Every row of a decode-only step is a decode row: a constant (not the batch size), so the
# compiled graph never specializes on it.
ALL_ROWS = 1 << 30


class CompiledDecode:
    def __init__(self, model: CausalLM):
        model.use_torch_kernels("--compile compiles the PyTorch path")
        self.model = model
        # Without this a context length equal to some model size (64 = a head's width) would be
        # compiled as that constant, and every other length would compile again.
        torch.fx.experimental._config.use_duck_shape = False
        self._compute = torch.compile(model.compute, dynamic=True)
        # Adapter scales change per request; with adapters loaded every step runs eagerly.
        self._has_lora = any(getattr(m, "loras", None) for m in model.modules())

    def run(self, chunks: Sequence[SequenceChunk], kv: KVCache) -> torch.Tensor:
        """Logits for a step's chunks, as `model(build_forward_batch(chunks), kv)` would return."""
        n_decode = count_leading_decode(chunks)
        if self._has_lora or n_decode == 0:
            return self.model(build_forward_batch(chunks, device=kv.device), kv)
        logits = self(build_forward_batch(chunks[:n_decode], device=kv.device), kv)
        if n_decode == len(chunks):
            return logits
        rest = self.model(build_forward_batch(chunks[n_decode:], device=kv.device), kv)
        return torch.cat((logits, rest))

    def handles(self, batch: ForwardBatch) -> bool:
        groups = batch.groups
        return (
            len(groups) == 1
            and groups[0].is_decode
            and groups[0].leading_rows
            and batch.embedding_overrides is None
            and not self._has_lora
        )

    def __call__(self, batch: ForwardBatch, kv: KVCache) -> torch.Tensor:
        if not self.handles(batch):
            return self.model(batch, kv)
        if self.model.row_split is not None:
            self.model.row_split.decode_rows = ALL_ROWS
        return self._compute(batch, kv)

    @torch.no_grad()
    def warm_up(self, kv: KVCache) -> None:
        """Compile now, on scratch blocks of `kv` (released afterwards). Call it in the autograd
        mode the steps will run in (the engine's: no grad, not inference mode): the graphs are
        guarded on it, and a mismatch would compile again while serving."""
        for n_seqs, context in WARM_UP_SHAPES:
            tables = [BlockTable(kv) for _ in range(n_seqs)]
            try:
                for table in tables:
                    table.fill_to(context)
                chunks = [SequenceChunk([0], context - 1, t.slots()) for t in tables]
                self(build_forward_batch(chunks, device=kv.device), kv)
            finally:
                for table in tables:
                    table.release()
