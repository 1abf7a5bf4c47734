"""One decode row on the native forward, on buffers of its own and without PyTorch.

Token 0 at position 0 through a NativeRunner's model, its K/V written to a pool of one token of
the runner's default cache type, its recurrent layers (hybrid models) starting from zero state;
every call computes the same row. What the one-row prefetch timing (lamplight.native.prefetch)
runs while a model loads, before anything needs torch.
"""

from __future__ import annotations

import numpy as np

from ..gguf.quant import dequantize_rows
from ..state import KV_TYPES
from . import abi
from .linear import address
from .runner import NativeRunner, kv_description, set_row_slots, states_description


class OneTokenStep:
    def __init__(self, runner: NativeRunner):
        self.runner = runner
        spec, state = runner.spec, runner.spec.state_spec
        self.pool = _one_token_pool(state.kv, runner.default_cache_type)
        self.states = _zero_states(state.recurrent) if state.recurrent else None
        self.row = np.zeros(1, dtype=np.int64)  # token 0, position 0, KV slot 0, logit row 0
        self.embedding = dequantize_rows(spec.token_embd, self.row)
        ple = spec.per_layer_inputs
        self.per_layer_rows = dequantize_rows(ple.token_embd, self.row) if ple is not None else None
        self.lora_scales = runner.step_lora_scales()
        self.logits = np.empty((1, spec.config.vocab_size), dtype=np.float32)
        self.batch = self._describe_batch()

    def __call__(self) -> np.ndarray:
        """The row's logits [1, vocab] (the same buffer each call)."""
        self.runner.call_forward(self.runner.lib.lp_forward_states, self.batch, self.pool, self.states,
                                 address(self.logits))
        return self.logits

    def _describe_batch(self) -> abi.Batch:
        row, scales = address(self.row), self.lora_scales
        return abi.Batch(n_rows=1, n_logits=1, n_key_slots=1, n_lora_scales=0 if scales is None else scales.size,
                         embeddings=address(self.embedding), positions=row, write_slots=row, key_offsets=row,
                         key_slots=row, logit_rows=row, lora_scales=address(scales), key_ends=None, given_rows=None,
                         per_layer_rows=address(self.per_layer_rows))


def _one_token_pool(layout, cache_type: str) -> abi.KV:
    """A KV pool of one token for a model of this KVLayout, of cache type `cache_type`."""
    kind = KV_TYPES[cache_type]
    shapes = [layout.shape(layer) for layer in range(layout.num_layers)]
    k = [np.zeros((n_kv, 1, kind.row_width(dk)), dtype=kind.storage) for n_kv, dk, _ in shapes]
    v = [np.zeros((n_kv, 1, kind.row_width(dv)), dtype=kind.storage) for n_kv, _, dv in shapes]
    return kv_description(kind.native_id, kind.native_id, 1, k, v)


def _zero_states(layouts) -> abi.States:
    """One zero recurrent state slot per layer of these RecurrentLayouts, read by row 0."""
    history = [np.zeros((1, *lay.history), dtype=np.float32) for lay in layouts]
    matrix = [np.zeros((1, *lay.matrix), dtype=np.float32) if lay.matrix else None for lay in layouts]
    desc = states_description(1, history, matrix)
    set_row_slots(desc, np.zeros(1, dtype=np.int64))
    return desc
