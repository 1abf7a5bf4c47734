"""The native backend's step path on numpy (what a native engine runs, without torch): its state
is numpy's, `step` reads the chunks' rows as numpy and gives numpy logits bit for bit those of the
tensor path (`run_batch` of a PyTorch ForwardBatch, a PyTorch pool), and a context shift on numpy
stores what the PyTorch path's re-rotation (models.layers.shift_kv) stores, to the byte."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from tiny_gguf import write_tiny_arch, write_tiny_gemma3, write_tiny_llama

from lamplight.gguf.file import GGUFFile
from lamplight.models import define_model
from lamplight.models.batch import SequenceChunk, build_forward_batch
from lamplight.models.layers import Rotary, shift_kv
from lamplight.native import runtime
from lamplight.native.runner import NativeRunner
from lamplight.state import KV_TYPES
from lamplight.state.torch_pools import TorchKVPool, torch_state

# Rope layouts: adjacent pairs (llama), YaRN (mistral3), halves with partial rotary (phi3), two
# ropes (olmo2, gemma3: sliding and global layers).
MODELS = ["llama", "mistral3", "phi3", "olmo2", "gemma3"]


@pytest.fixture(scope="module", params=MODELS)
def native(request, tmp_path_factory) -> NativeRunner:
    if runtime.library() is None:
        pytest.skip(f"no native library here: {runtime.unavailable_reason()}")
    path = tmp_path_factory.mktemp("step") / f"{request.param}.gguf"
    if request.param == "llama":
        write_tiny_llama(path, qtype=Q.Q4_0, n_embd=128, n_ctx=512)  # head size 32: the quantized KV types too
    elif request.param == "gemma3":
        write_tiny_gemma3(path)
    else:
        write_tiny_arch(path, request.param)
    return NativeRunner(define_model(GGUFFile(path)), runtime.library())


def _ids(n: int, k: int = 0) -> list[int]:
    return [(7 * i + 3 * k + 11) % 240 + 5 for i in range(n)]


def _holds(runner: NativeRunner, kv: str) -> bool:
    """Whether a pool of this model can store K/V as `kv` (a quantized type needs head sizes of 32s)."""
    layout = runner.state_spec.kv
    dims = {d for layer in range(layout.num_layers) for d in layout.shape(layer)[1:]}
    return not hasattr(KV_TYPES[kv], "block_bytes") or all(d % 32 == 0 for d in dims)


# Three steps over four sequences: two prompt chunks (every row's logits for the first), one decode
# row, then decode rows of both beside a new prompt and a cached continuation.
STEPS = [
    [SequenceChunk(_ids(21), 0, range(21), all_logits=True), SequenceChunk(_ids(9, 1), 0, range(32, 41))],
    [SequenceChunk(_ids(22)[21:], 21, range(22))],
    [SequenceChunk(_ids(23)[22:], 22, range(23)), SequenceChunk([17], 9, [*range(32, 41), 41]),
     SequenceChunk(_ids(30, 2), 0, range(64, 94)), SequenceChunk(_ids(5, 3), 0, range(96, 101), need_logits=False)],
]


@pytest.mark.parametrize("kv", ["f32", "f16", "bf16", "q8_0"])
def test_the_numpy_step_gives_the_tensor_paths_logits(native, kv):
    """step() on the runner's numpy state, and run_batch() of the PyTorch batch on a PyTorch pool
    (the path before numpy steps): the same logits, bit for bit, a decode row and a step of
    several sequences alike; run() is step()'s array as a tensor."""
    if not _holds(native, kv):
        pytest.skip(f"{kv}: head sizes not a multiple of 32")
    ours, theirs = native.new_state(128, kv), torch_state(native.state_spec, 128, kv)
    assert isinstance(ours.kv.k[0], np.ndarray) and isinstance(theirs.kv, TorchKVPool)
    for chunks in STEPS:
        logits = native.step(chunks, ours)
        assert isinstance(logits, np.ndarray) and logits.dtype == np.float32
        assert torch.equal(torch.from_numpy(logits), native.run_batch(build_forward_batch(chunks), theirs))
    for stored, tensor in zip(ours.kv.k + ours.kv.v, theirs.kv.k + theirs.kv.v):
        assert np.array_equal(stored.view(np.uint8), tensor.view(torch.uint8).numpy())  # the same K/V bytes
    first, second = native.new_state(128, kv), native.new_state(128, kv)
    for chunks in STEPS:
        assert torch.equal(native.run(chunks, first), torch.from_numpy(native.step(chunks, second)))


@pytest.mark.parametrize("kv", ["f32", "f16", "bf16", "q8_0"])
@pytest.mark.parametrize("delta", [-17, 5])
def test_the_numpy_context_shift_stores_the_pytorch_paths_bytes(native, kv, delta):
    """NativeRunner.shift_kv (lp_kv_rows and numpy rotations) against the PyTorch re-rotation on
    the same pool (Rotary modules on a tensor view): every stored byte equal."""
    if not _holds(native, kv):
        pytest.skip(f"{kv}: head sizes not a multiple of 32")
    state = native.new_state(128, kv)
    native.step([SequenceChunk(_ids(60), 0, range(60))], state)
    expected = copy.deepcopy(state.kv)
    src, dst = list(range(21, 60)), list(range(4, 43)) if delta < 0 else list(range(70, 109))
    keys, values = state.kv.k[0][:, src], state.kv.v[0][:, src]
    native.shift_kv(state, src, dst, delta)
    spec = native.spec
    rotaries = [Rotary.from_spec(rope) for rope in spec.ropes]
    owners = [layer.attn for layer in spec.layers if layer.attn is not None and layer.attn.owns_kv]
    shift_kv(TorchKVPool.view_of(expected), [None if a.rope is None else rotaries[a.rope] for a in owners],
             torch.tensor(src), torch.tensor(dst), delta)
    for ours, theirs in zip(state.kv.k + state.kv.v, expected.k + expected.v):
        assert np.array_equal(ours, theirs)
    assert not np.array_equal(state.kv.k[0][:, dst], keys) and np.array_equal(state.kv.v[0][:, dst], values)
