"""Quantized KV cache (-ctk/-ctv q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl; lamplight.state.kv_quant, the PyTorch codecs in
lamplight.state.kv_quant_torch): ggml's block formats to the byte, written alike by the PyTorch pool and the native
forward, and a request's tokens are the same alone or beside others and from run to run with the same KV type."""

from __future__ import annotations

import gguf
import httpx
import numpy as np
import pytest
import torch
from model_helpers import runner_for
from test_server_support import model_server
from tiny_gguf import write_tiny_llama

from lamplight.engine.config import EngineConfig
from lamplight.engine.engine import Engine
from lamplight.engine.types import FinalEvent, GenerationRequest
from lamplight.gguf.file import GGUFFile
from lamplight.models.batch import SequenceChunk
from lamplight.native import runtime
from lamplight.sampling import SamplingParams
from lamplight.native import abi
from lamplight.state.kv import KVLayout, KVPool
from lamplight.state.kv_quant import QUANT_TYPES
from lamplight.state.kv_quant_torch import dequantize, quantize
from lamplight.state.kv_types import KV_TYPES
from lamplight.state.torch_pools import TorchKVPool
from lamplight.tokenizer import Tokenizer

GGML = {name: getattr(gguf.GGMLQuantizationType, name.upper()) for name in QUANT_TYPES}
BITS = {"q8_0": 8.5, "q4_0": 4.5, "q4_1": 5.0, "q5_0": 5.5, "q5_1": 6.0, "iq4_nl": 4.5}
IQ4_NL_LEVELS = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113]


def ggml_iq4_nl(rows: np.ndarray) -> np.ndarray:
    """ggml's quantize_row_iq4_nl_ref (the KV cache's iq4_nl writer, ntry -1), line by line in
    float32 scalars; gguf-py has no iq4_nl quantizer. ggml leaves an all-zero block's nibbles unset:
    here, as in kv_quant, they are level 8's."""
    f32 = np.float32

    def nearest(x):  # best_index_int8
        if x <= IQ4_NL_LEVELS[0]:
            return 0
        if x >= IQ4_NL_LEVELS[15]:
            return 15
        lo, hi = 0, 15
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if x < IQ4_NL_LEVELS[mid] else (mid, hi)
        return hi - 1 if x - f32(IQ4_NL_LEVELS[hi - 1]) < f32(IQ4_NL_LEVELS[hi]) - x else hi

    out = []
    for block in rows.astype(np.float32).reshape(-1, 32):
        amax, top = f32(0), f32(0)
        for x in block:
            if abs(x) > amax:
                amax, top = abs(x), x
        levels, d = [8] * 32, f32(0)
        if amax >= f32(1e-15):
            inverse = f32(1) / (top / f32(IQ4_NL_LEVELS[0]))
            sumqx = sumq2 = f32(0)
            for j, x in enumerate(block):
                levels[j] = nearest(inverse * x)
                q, w = f32(IQ4_NL_LEVELS[levels[j]]), x * x
                sumqx, sumq2 = sumqx + w * q * x, sumq2 + w * q * q
            d = sumqx / sumq2 if sumq2 > 0 else f32(0)
        out.append(np.concatenate([np.array([d], np.float16).view(np.uint8),
                                   [levels[j] | levels[j + 16] << 4 for j in range(16)]]).astype(np.uint8))
    return np.stack(out)


def edge_rows() -> torch.Tensor:
    """Random rows and the blocks rounding cares about: zeros, equal magnitudes, exact halves."""
    rows = torch.randn(40, 128, generator=torch.Generator().manual_seed(0)) * 3
    rows[0] = 0.0
    rows[1, :32] = torch.tensor([1.0, -1.0] * 16)
    rows[2, :32] = torch.arange(32, dtype=torch.float32) - 16.5  # many values on a .5 after scaling
    rows[3, :32] = 127.0 * torch.tensor([0.5, 1.5, 2.5, -0.5] * 8) / 127.0
    rows[4] = rows[4] * 1e-6
    return rows


@pytest.mark.parametrize("name", QUANT_TYPES)
def test_blocks_are_ggmls_to_the_byte(name):
    kind = QUANT_TYPES[name]
    rows = edge_rows()
    ours = quantize(kind, rows).numpy()
    ggml_quantize = ggml_iq4_nl if name == "iq4_nl" else lambda x: gguf.quantize(x, GGML[name])
    reference = ggml_quantize(rows.numpy()).reshape(ours.shape)
    assert np.array_equal(ours, reference)
    assert np.array_equal(dequantize(kind, torch.from_numpy(reference), 128).numpy(),
                          gguf.dequantize(reference, GGML[name]).reshape(rows.shape))
    assert kind.row_bytes(128) == ours.shape[-1] and kind.bits == BITS[name]


@pytest.mark.parametrize("name", QUANT_TYPES)
def test_a_stored_row_read_and_written_again_keeps_its_bytes(name):
    """The prompt cache and slot files copy K/V out as floats and back: the same bytes."""
    kind = QUANT_TYPES[name]
    stored = quantize(kind, edge_rows())
    assert torch.equal(quantize(kind, dequantize(kind, stored, 128)), stored)


@pytest.mark.parametrize("name", QUANT_TYPES)
def test_the_pool_stores_quantized_rows(name):
    kind = QUANT_TYPES[name]
    layout = KVLayout(2, 2, 64, 32)
    pool = TorchKVPool(layout, 16, kind)
    assert pool.k[0].dtype == torch.uint8 and pool.k[0].shape == (2, 16, kind.row_bytes(64))
    assert layout.bytes_per_token(kind) == 2 * 2 * (64 + 32) * kind.bits / 8
    k, v = torch.randn(3, 2, 64), torch.randn(3, 2, 32)
    slots = torch.tensor([5, 1, 9])
    pool.write(1, slots, k, v)
    read_k, read_v = pool.read(1, slots)
    assert torch.equal(read_k, dequantize(kind, quantize(kind, k), 64))
    assert torch.equal(read_v, dequantize(kind, quantize(kind, v), 32))
    gathered_k, _ = pool.gather(1, torch.tensor([[9, 5]]))
    assert gathered_k.shape == (2, 1, 2, 64) and torch.equal(gathered_k[:, 0, 0], read_k[2])
    pool.copy_tokens(torch.tensor([9]), torch.tensor([3]))
    assert torch.equal(pool.read(1, torch.tensor([3]))[0], read_k[2:3])
    with pytest.raises(ValueError, match="head size 48 is not a multiple of 32"):
        TorchKVPool(KVLayout(1, 1, 48, 48), 4, kind)
    with pytest.raises(ValueError, match="head size 48 is not a multiple of 32"):
        KVPool(KVLayout(1, 1, 48, 48), 4, kind)


@pytest.mark.parametrize("name", ["f32", "f16", "bf16", *QUANT_TYPES])
def test_the_numpy_pool_keeps_the_torch_pools_bytes(name):
    """The native runner's pool (numpy, no torch) stores each type as the PyTorch pool does, row
    for row (bf16 as its 16 bits), and moves stored rows as it does."""
    kind = KV_TYPES[name]
    layout = KVLayout(2, 2, 64, 32)
    host, tensors = KVPool(layout, 16, kind, v_dtype=kind), TorchKVPool(layout, 16, kind)
    assert [t.shape for t in host.k + host.v] == [tuple(t.shape) for t in tensors.k + tensors.v]
    assert host.nbytes == tensors.nbytes == 16 * layout.bytes_per_token(kind)
    tensors.write(1, torch.tensor([5, 1, 9]), torch.randn(3, 2, 64), torch.randn(3, 2, 32))
    as_storage = lambda t: t.contiguous().view(torch.uint8).numpy().view(kind.storage)  # noqa: E731 (bf16's bits)
    stored_k, stored_v = tensors.read_stored(1, [5, 1, 9])
    host.write_stored(1, np.array([5, 1, 9]), as_storage(stored_k), as_storage(stored_v))
    host.copy_tokens([9], [3])
    tensors.copy_tokens([9], [3])
    for ours, theirs in zip(host.k + host.v, tensors.k + tensors.v):
        assert np.array_equal(ours.view(np.uint8), theirs.view(torch.uint8).numpy())
    view = TorchKVPool.view_of(host)  # the slot files' way in: the same memory as tensors
    assert all(torch.equal(a, b) for a, b in zip(view.k + view.v, tensors.k + tensors.v))
    view.write(0, torch.tensor([2]), torch.ones(1, 2, 64), torch.ones(1, 2, 32))
    assert host.k[0][:, 2].any() and host.v[0][:, 2].any()


def test_the_kv_types_native_ids_are_the_forwards():
    assert {name: kind.native_id for name, kind in KV_TYPES.items()} == {
        name: getattr(abi, f"LP_KV_{name.upper()}") for name in KV_TYPES}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    # n_embd 128: head size 32, the quantized types' block
    return write_tiny_llama(tmp_path_factory.mktemp("kvq") / "tiny.gguf", n_ctx=512, n_embd=128)


@pytest.mark.parametrize("name", QUANT_TYPES)
def test_the_native_forward_writes_the_same_blocks(tiny, name):
    """The first layer's K/V of a prompt, computed in float32 and quantized by kv_quant, are the
    bytes the native forward stores itself."""
    if runtime.library() is None:
        pytest.skip(f"no native library: {runtime.unavailable_reason()}")
    kind = QUANT_TYPES[name]
    runner = runner_for(GGUFFile(tiny), "native")
    prompt = [3 + (i * 17) % 200 for i in range(70)]
    plain, quantized = runner.new_state(80, torch.float32), runner.new_state(80, kind)
    for state in (plain, quantized):
        runner.run([SequenceChunk(prompt, 0, list(range(70)))], state)
    for ours, floats in ((quantized.kv.k[0], plain.kv.k[0]), (quantized.kv.v[0], plain.kv.v[0])):  # numpy pools
        assert np.array_equal(ours[:, :70], quantize(kind, torch.from_numpy(floats[:, :70])).numpy())


@pytest.mark.parametrize("backend", ["reference", "native"])
@pytest.mark.parametrize("name", QUANT_TYPES)
def test_tokens_do_not_depend_on_the_batch_or_the_run(tiny, backend, name):
    if backend == "native" and runtime.library() is None:
        pytest.skip(f"no native library: {runtime.unavailable_reason()}")
    gguf_file = GGUFFile(tiny)
    runner, tokenizer = runner_for(gguf_file, backend), Tokenizer.from_gguf(gguf_file)
    seeded = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=3, ignore_eos=True)
    prompts = [[3 + (i * k) % 200 for i in range(20 + 7 * k)] for k in range(1, 4)]

    def run(engine, requests):
        handles = [engine.submit(r) for r in requests]
        return [next(e for e in h.iter_events(timeout=120) if isinstance(e, FinalEvent)).token_ids for h in handles]

    results = []
    for _ in range(2):
        engine = Engine(runner, tokenizer, EngineConfig(n_ctx=512, n_parallel=3, kv_unified=True, n_ubatch=32,
                                                         cache_type_k=name, cache_type_v=name))
        engine.start()
        try:
            requests = [GenerationRequest(p, seeded, n_predict=24) for p in prompts]
            alone = [run(engine, [r])[0] for r in requests]
            together = run(engine, requests)
        finally:
            engine.stop()
        assert together == alone
        results.append(alone)
    assert results[0] == results[1]


def test_a_head_size_off_the_block_is_refused_at_start(tmp_path):
    path = write_tiny_llama(tmp_path / "narrow.gguf", n_embd=64)  # head size 16
    gguf_file = GGUFFile(path)
    with pytest.raises(ValueError, match="-ctk/-ctv q8_0: head size 16 is not a multiple of 32"):
        Engine(runner_for(gguf_file), Tokenizer.from_gguf(gguf_file),
               EngineConfig(n_ctx=256, n_parallel=1, cache_type_k="q8_0", cache_type_v="f16"))


@pytest.mark.parametrize("name", QUANT_TYPES)
def test_the_native_forward_stores_and_reads_blocks_as_kv_quant_does(name):
    """The forward's own row conversions (lp_kv_rows): its blocks are kv_quant's bytes, and what it
    reads from kv_quant's blocks is kv_quant's dequantized values, bit for bit."""
    lib = runtime.library()
    if lib is None:
        pytest.skip(f"no native library: {runtime.unavailable_reason()}")
    kind = QUANT_TYPES[name]
    rows = edge_rows().contiguous()
    stored = torch.zeros(rows.shape[0], kind.row_bytes(128), dtype=torch.uint8)
    assert lib.lp_kv_rows(kind.native_id, 1, stored.data_ptr(), rows.shape[0], 128, rows.data_ptr()) == 0
    assert torch.equal(stored, quantize(kind, rows))
    read = torch.empty_like(rows)
    assert lib.lp_kv_rows(kind.native_id, 0, stored.data_ptr(), rows.shape[0], 128, read.data_ptr()) == 0
    assert torch.equal(read, dequantize(kind, stored, 128))


def test_a_server_started_with_quantized_kv_serves(tiny):
    """-ctk q8_0 -ctv q4_0 as a server takes them: replies come, the same ones twice, and bad
    input is still a 400."""
    with model_server(tiny, n_ctx=512, n_parallel=2, cache_type_k="q8_0", cache_type_v="q4_0") as (server, _):
        engine = server.state.engine
        assert engine.state.kv.k_type is QUANT_TYPES["q8_0"] and engine.state.kv.v_type is QUANT_TYPES["q4_0"]
        body = {"prompt": "the cat sat on the mat", "n_predict": 8, "temperature": 0, "ignore_eos": True}
        replies = [httpx.post(f"{server.url}/completion", json=body, timeout=60).json() for _ in range(2)]
        assert replies[0]["tokens_predicted"] == 8 and replies[0]["content"] == replies[1]["content"]
        assert httpx.post(f"{server.url}/completion", json={**body, "n_predict": "x"}, timeout=60).status_code == 400
