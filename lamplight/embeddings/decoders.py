"""Decoders used as embedders, computed by lamplight's decoder (lamplight.models.decoder):
the supported architectures as they are (Qwen3-Embedding and Qwen3-Reranker are `qwen3` files,
SmolLM2 is `llama`), and `gemma-embedding` (EmbeddingGemma: gemma3 blocks attending both ways,
sliding layers to a symmetric window).

The hidden states are the last layer's after `output_norm`. Inputs are the chunks of one step,
each attending to its own tokens only (causal, or every token for gemma-embedding), so an
input's states do not depend on what else is in the step: the prompt groups are per input, and
single-token inputs come first, where the kernels treat decode rows (lamplight.models.batch).

Backends: reference, pytorch, native (the C++ forward returning hidden states instead of logits;
every row is computed alone there) and fast (native where this machine has it, else pytorch).
gemma-embedding computes on PyTorch whatever the backend: its sliding layers see a window on
both sides of each token, which the native attention (one-sided windows) does not compute.

`ServedRunner`: a generating model's runner lent to the embedder of the same file, so that the
weights are in memory once; the embedder's steps then run where the runner's own steps run
(the engine's thread, between its steps), never beside them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Sequence, TypeVar

import torch

from ..gguf.file import GGUFFile
from ..gguf.quant import dequantize
from ..kernels.linear import BATCH_INVARIANT_ROWS, DenseKernel
from ..loader import build_runner
from ..models import define_model, gemma3
from ..models.batch import AttentionGroup, SequenceChunk, build_forward_batch
from ..models.config import read_common_config
from ..models.layers import QuantLinear
from ..models.options import sliding_pattern
from ..models.spec import DecoderSpec, read_decoder_spec
from ..runner.base import ModelRunner

BIDIRECTIONAL_ARCHITECTURES = ("gemma-embedding",)
GEMMA_EMBEDDING_PERIOD = 6  # llama.cpp's swa period when the file has no sliding_window_pattern
BACKENDS = ("reference", "pytorch", "native", "fast")
SHAREABLE_BACKENDS = ("native", "pytorch", "compiled")

T = TypeVar("T")


@dataclass(frozen=True)
class ServedRunner:
    """A runner that serves the same model file, and `call(fn)`: runs fn where the runner's steps
    run (Engine.call_on_engine) and returns its result."""

    runner: ModelRunner
    call: Callable[[Callable[[], T]], T]


def why_not_shared(runner: ModelRunner) -> str | None:
    """Why an embedder cannot compute on this served runner (None: it can). The reference
    kernels are padded for batch invariance first (that would change the served model's), and
    a PyTorch model with LoRA adapters computes with the scales of the engine's last step."""
    if runner.backend not in SHAREABLE_BACKENDS:
        return f"the {runner.backend} backend's kernels are changed for embeddings"
    if runner.backend != "native" and runner.lora_scales is not None:
        return "its LoRA adapters' scales change from step to step"
    return None


def gemma_embedding_spec(gguf: GGUFFile) -> DecoderSpec:
    """gemma3's blocks with the file's sliding pattern (llama.cpp reads it for gemma-embedding)
    and its rope base for the sliding layers."""
    config = read_common_config(gguf)
    opts = gemma3.options(gguf, config)
    opts = replace(
        opts,
        sliding_layers=sliding_pattern(gguf, config.n_layers, default_period=GEMMA_EMBEDDING_PERIOD),
        sliding_rope_base=float(gguf.arch_value("rope.freq_base_swa", gemma3.LOCAL_ROPE_BASE)),
    )
    return read_decoder_spec(gguf, config, opts)


class DecoderBody:
    """`hidden_states(inputs)`: every input's final hidden states [n, n_embd]; `backend`: what
    computes them (one of BACKENDS), or `served`: a served runner of the same file to compute on."""

    def __init__(self, gguf: GGUFFile, backend: str = "reference", served: ServedRunner | None = None):
        self.causal = gguf.architecture not in BIDIRECTIONAL_ARCHITECTURES
        self.shared = served is not None and self.causal and why_not_shared(served.runner) is None
        if self.shared:
            self.runner, self._call = served.runner, served.call
        else:
            spec = define_model(gguf) if self.causal else gemma_embedding_spec(gguf)
            self.runner, self._call = build_runner(spec, _backend_for(backend, self.causal)), _call_here
            if self.runner.backend == "reference":
                _pad_reference_rows(self.runner.model)
        self.spec = spec = self.runner.spec
        self.backend = self.runner.backend
        self.kernels = self.runner.describe() + (", the served model's weights" if self.shared else "")
        config = spec.config
        self.n_embd = config.n_embd
        self.vocab_size = config.vocab_size
        self.n_ctx_train = config.n_ctx_train
        windows = {layer.attn.window for layer in spec.layers if layer.attn is not None} - {None}
        self.windows = sorted(windows)

    def hidden_states(self, inputs: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        return self._call(lambda: self._compute(inputs))

    @torch.inference_mode()
    def _compute(self, inputs: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        # Single-token inputs first: they are the step's decode rows, whatever else is there.
        order = sorted(range(len(inputs)), key=lambda i: len(inputs[i]) != 1)
        chunks, first = [], 0
        for i in order:
            n = len(inputs[i])
            chunks.append(SequenceChunk(list(inputs[i]), 0, range(first, first + n), need_logits=False))
            first += n
        state = self.runner.new_state(first)
        batch = build_forward_batch(chunks)
        if self.backend == "native":
            hidden = self.runner.hidden_states(batch, state)
        else:
            hidden = self._torch_hidden(batch, state, chunks)
        parts = hidden.split([len(c.token_ids) for c in chunks])
        out: list[torch.Tensor] = [None] * len(inputs)  # type: ignore[list-item]
        for i, part in zip(order, parts):
            out[i] = part
        return out

    def _torch_hidden(self, batch, state, chunks: list[SequenceChunk]) -> torch.Tensor:
        model = self.runner.model
        if not self.causal:
            batch._groups = bidirectional_groups(chunks, self.windows)
        if model.row_split is not None:
            model.row_split.decode_rows = batch.leading_decode_tokens
        return model.output_norm(model.run_layers(batch, state))


def _call_here(fn: Callable[[], T]) -> T:
    return fn()


def _backend_for(backend: str, causal: bool) -> str:
    """The runner backend for an embedder's `backend`: gemma-embedding's both-ways sliding
    windows are PyTorch's alone (the native attention's windows are one-sided)."""
    if backend not in BACKENDS:
        raise ValueError(f"embedding backend {backend!r} is not one of {', '.join(BACKENDS)}")
    if not causal and backend in ("native", "fast"):
        return "pytorch"
    return backend


def _pad_reference_rows(model: torch.nn.Module) -> None:
    """The reference kernels with rows padded as the engine's batch-invariant ones are, so that
    a row's sums do not depend on how many rows share the step."""
    for module in model.modules():
        if isinstance(module, QuantLinear):
            module.kernel = DenseKernel(torch.from_numpy(dequantize(module.info)), torch.float32, BATCH_INVARIANT_ROWS)


def bidirectional_groups(chunks: Sequence[SequenceChunk], windows: Sequence[int]) -> list[AttentionGroup]:
    """One attention group per input, every query seeing every key of its input; for each
    sliding window w, keys within w // 2 positions either side (llama.cpp's symmetric SWA)."""
    groups, first = [], 0
    for chunk in chunks:
        n = len(chunk.token_ids)
        pos = torch.arange(n)
        mask = torch.ones(1, 1, n, n, dtype=torch.bool)
        group = AttentionGroup(
            query_rows=torch.arange(first, first + n)[None],
            query_valid=torch.ones(1, n, dtype=torch.bool),
            kv_index=torch.as_tensor(list(chunk.kv_slots), dtype=torch.long)[None],
            mask=mask,
            query_pos=pos[None],
            key_pos=pos[None],
        )
        distance = (pos[:, None] - pos[None, :]).abs()
        for window in windows:
            # Filled in ahead: the group's own window_mask would be the causal one-sided window.
            group._window_masks[window] = mask & (distance <= window // 2)[None, None]
        groups.append(group)
        first += n
    return groups
