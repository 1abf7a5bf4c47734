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

import logging
import re
from pathlib import Path
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

# How a broken kernel in inductor's on-disk cache shows: inductor builds each kernel straight
# into its cache path and, next time, loads whatever is there; a compile killed midway (Ctrl-C
# during the minutes of a first start, a full disk) leaves a truncated file that fails every
# later start ("file too short", "cannot read file data", ...).
_UNLOADABLE = re.compile(r"ImportError: (/\S+\.so): ")


def broken_cached_kernel(exc: BaseException) -> Path | None:
    """The kernel file in inductor's cache that a compile error says cannot be loaded (None:
    another error, or a file outside that cache, such as a system library)."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    cache = Path(cache_dir()).resolve()
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        for match in _UNLOADABLE.finditer(str(exc)):
            path = Path(match.group(1)).resolve()
            if path.is_relative_to(cache):
                return path
        exc = exc.__cause__ or exc.__context__
    return None


MAX_BROKEN_KERNELS = 64  # more than one start's graphs hold

log = logging.getLogger(__name__)


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
        again while serving. Truncated kernels left in inductor's cache by an earlier compile
        are removed and compiled again (each error names one)."""
        removed: set[Path] = set()
        while True:
            try:
                return self._warm_up_steps(state)
            except Exception as exc:
                broken = broken_cached_kernel(exc)
                if broken is None or broken in removed or len(removed) >= MAX_BROKEN_KERNELS:
                    raise
                log.warning("inductor's cache holds a truncated kernel (%s): removed, compiling it again", broken)
                broken.unlink(missing_ok=True)
                removed.add(broken)
                self._recompile()

    def _recompile(self) -> None:
        """Forget every compiled graph and loaded kernel (in memory), so the next step compiles again."""
        import torch._inductor.utils as inductor_utils

        torch._dynamo.reset()
        inductor_utils.clear_caches()
        self._compute = torch.compile(self.model.compute, dynamic=True)

    def _warm_up_steps(self, state: ModelState) -> None:
        size = state.kv.num_tokens
        for n_seqs, context in WARM_UP_SHAPES:
            chunks = [SequenceChunk([0], context - 1, [(s * context + p) % size for p in range(context)])
                      for s in range(n_seqs)]
            self.run_batch(build_forward_batch(chunks, device=state.device), state)
