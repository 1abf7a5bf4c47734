"""Model fidelity: our logits against llama.cpp's, and the loader on tiny generated files."""

from __future__ import annotations

import statistics

import numpy as np
import pytest
import torch
from conftest import load_jsonl
from gguf import GGMLQuantizationType as Q
from gguf import GGUFWriter
from gguf.quants import quantize
from model_helpers import paged_state, runner_for
from tiny_gguf import write_tiny_gemma3, write_tiny_llama

from lamplight.engine.kv_cache import BlockTable
from lamplight.gguf.file import GGUFError, GGUFFile
from lamplight.gguf.quant import dequantize
from lamplight.kernels.unpack import unpack_int4
from lamplight.models import define_model
from lamplight.models.batch import SequenceChunk
from lamplight.runner import greedy, score
from lamplight.state import KVLayout

MARGIN = 0.5


def _agreement(model, rows, kv_dtype=torch.float32):
    """Top-1 agreement where llama.cpp's margin >= MARGIN, and the per-position max top-10 diff."""
    checked, mismatches, diffs = 0, [], []
    for r, row in enumerate(rows):
        logits = score(model, row["tokens"], kv_dtype=kv_dtype)
        for i, pos in enumerate(row["positions"]):
            ref = torch.tensor(pos["logits"])
            diffs.append((logits[i][pos["ids"]] - ref).abs().max().item())
            if ref[0] - ref[1] >= MARGIN:
                checked += 1
                if int(logits[i].argmax()) != pos["ids"][0]:
                    mismatches.append((r, i))
    return checked, mismatches, diffs


def _greedy_prefix(row) -> tuple[list[int], list[int]]:
    """The prompt and llama.cpp's continuation up to its first low-margin position."""
    n = row["n_prompt"]
    continuation = row["tokens"][n:]
    for j in range(len(continuation)):
        top = row["positions"][n - 1 + j]["logits"]
        if top[0] - top[1] < MARGIN:
            return row["tokens"][:n], continuation[:j]
    return row["tokens"][:n], continuation


@pytest.mark.real_model
@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_fast_path_keeps_fidelity(name, request):
    """The packed int4 / bf16 path stays within the reference path's bounds (figures printed)."""
    path = request.getfixturevalue(f"{name}_path")
    rows = load_jsonl(f"{name}.logits.jsonl")
    model = runner_for(path, "pytorch")
    checked, mismatches, diffs = _agreement(model, rows)
    median = statistics.median(diffs)
    print(f"\n{name} fast path: top-1 agrees at {checked - len(mismatches)}/{checked}; max top-10 |diff| median {median:.3f}")
    assert not mismatches and median <= 0.5


@pytest.mark.real_model
@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_native_path_keeps_fidelity(name, request):
    """The native forward (8-bit activations, packed GGUF weights, f16 KV cache as served) stays
    within the reference path's bounds against llama.cpp (figures printed)."""
    from lamplight.native import runtime

    if runtime.library() is None:
        pytest.skip(f"no native kernels here: {runtime.unavailable_reason()}")
    path = request.getfixturevalue(f"{name}_path")
    rows = load_jsonl(f"{name}.logits.jsonl")
    model = runner_for(path, "native")
    checked, mismatches, diffs = _agreement(model, rows, kv_dtype=torch.float16)
    median = statistics.median(diffs)
    print(f"\n{name} native path: top-1 agrees at {checked - len(mismatches)}/{checked}; max top-10 |diff| median {median:.3f}")
    assert not mismatches and median <= 0.5


@pytest.mark.real_model
@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_logits_match_llama_cpp(name, request):
    path = request.getfixturevalue(f"{name}_path")
    rows = load_jsonl(f"{name}.logits.jsonl")
    model = runner_for(path)
    checked, mismatches, diffs = _agreement(model, rows)
    median = statistics.median(diffs)
    print(
        f"\n{name}: top-1 agrees at {checked - len(mismatches)}/{checked} positions with margin >= {MARGIN}; "
        f"max top-10 |diff| median {median:.3f}, p90 {sorted(diffs)[int(0.9 * len(diffs))]:.3f}, over {len(diffs)} positions"
    )
    assert not mismatches, f"top-1 differs at (sequence, position) {mismatches}"
    assert median <= 0.5

    greedy_tokens = 0
    for row in rows:
        prompt, expected = _greedy_prefix(row)
        assert greedy(model, prompt, len(expected)) == expected
        greedy_tokens += len(expected)
    print(f"{name}: greedy reproduced {greedy_tokens} continuation tokens of llama.cpp over {len(rows)} prompts")


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def tiny_model(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny") / f"{request.param}.gguf"
    (write_tiny_llama if request.param == "llama" else write_tiny_gemma3)(path)
    return runner_for(path)


def test_incremental_decode_equals_full_scoring(tiny_model):
    ids = [(7 * i + 11) % 250 + 5 for i in range(40)]
    full = score(tiny_model, ids)
    state, cache = paged_state(tiny_model, num_blocks=8, block_size=8)
    table = BlockTable(cache)
    # The prompt in two chunks, then one token at a time.
    steps = [(0, 13), (13, 25)] + [(i, i + 1) for i in range(25, 40)]
    for start, end in steps:
        table.fill_to(end)
        chunk = SequenceChunk(ids[start:end], start, table.slots(), all_logits=True)
        out = tiny_model.run([chunk], state)
        torch.testing.assert_close(out, full[start:end], atol=2e-4, rtol=1e-4)


def test_batched_sequences_equal_each_alone(tiny_model):
    seqs = [[(3 * i + k) % 240 + 6 for i in range(n)] for k, n in enumerate([5, 17, 1, 30])]
    alone = [score(tiny_model, s)[-1] for s in seqs]
    state, cache = paged_state(tiny_model, num_blocks=32, block_size=4)
    chunks = []
    for s in seqs:
        table = BlockTable(cache)
        # Prefill all but the last token alone, then put every last token (and one prompt) in one step.
        if len(s) > 1:
            table.fill_to(len(s) - 1)
            tiny_model.run([SequenceChunk(s[:-1], 0, table.slots())], state)
        table.fill_to(len(s))
        chunks.append(SequenceChunk(s[-1:], len(s) - 1, table.slots()))
    together = tiny_model.run(chunks, state)
    for i, expected in enumerate(alone):
        torch.testing.assert_close(together[i], expected, atol=2e-4, rtol=1e-4)


def test_reference_decode_rows_are_bit_identical_alone_and_batched(tiny_model):
    """The reproducibility rule on the reference path, the tied output head included (its matmul
    pads its rows like the other dense kernels): decode rows of one sequence computed one step
    at a time, or all in one step as speculative decoding verifies them, give the same bits."""
    assert tiny_model.model.output is None  # the tiny model ties its head to the embedding
    seq = [(7 * i) % 240 + 6 for i in range(50)]
    state, cache = paged_state(tiny_model, num_blocks=16, block_size=4)
    table = BlockTable(cache)
    table.fill_to(len(seq))
    tiny_model.run([SequenceChunk(seq[:41], 0, table.slots(0, 41))], state)
    rows = [SequenceChunk([seq[p]], p, table.slots(0, p + 1)) for p in range(41, 50)]
    one_by_one = torch.cat([tiny_model.run([row], state) for row in rows])
    assert torch.equal(tiny_model.run(rows, state), one_by_one)


@pytest.mark.parametrize("k_dtype,v_dtype", [(torch.float16, torch.float16), (torch.bfloat16, torch.float32)])
def test_half_precision_kv_cache_stays_close_to_float32(tiny_model, k_dtype, v_dtype):
    """`-ctk/-ctv f16|bf16`: K/V rounded on their way into the pool, computed in float32."""
    seq = [(5 * i) % 240 + 6 for i in range(40)]

    def logits(dtype, v):
        state, cache = paged_state(tiny_model, num_blocks=8, block_size=8, dtype=dtype, v_dtype=v)
        table = BlockTable(cache)
        table.fill_to(len(seq))
        out = tiny_model.run([SequenceChunk(seq, 0, table.slots(), all_logits=True)], state)
        return state.kv, out

    pool, half = logits(k_dtype, v_dtype)
    _, full = logits(torch.float32, None)
    assert pool.k[0].dtype == k_dtype and pool.v[0].dtype == v_dtype
    assert not torch.equal(half, full)  # the rounding is real
    assert (half - full).abs().max() < 0.02 * full.abs().max()
    assert (half.argmax(-1) == full.argmax(-1)).float().mean() > 0.9
    layout: KVLayout = tiny_model.config.kv_layout
    assert layout.bytes_per_token(torch.float16) * 2 == layout.bytes_per_token()


def test_sliding_window_limits_local_layers(tmp_path):
    """With every layer local (window 8), a token 8+ positions back cannot change the logits."""
    path = write_tiny_gemma3(tmp_path / "g.gguf", n_layers=2, window=8)
    model = runner_for(path)
    assert all(layer.attn.window == 8 for layer in model.spec.layers)
    ids = list(range(10, 30))
    changed_far = [99] + ids[1:]
    changed_near = ids[:-3] + [99] + ids[-2:]
    base = score(model, ids)[-1]
    torch.testing.assert_close(score(model, changed_far)[-1], base)
    assert not torch.allclose(score(model, changed_near)[-1], base)


def test_greedy_is_deterministic(tiny_model):
    prompt = [20, 30, 40]
    assert greedy(tiny_model, prompt, 12) == greedy(tiny_model, prompt, 12)


# gguf's writer cannot quantize K-quants; Q4_K and Q6_K are covered by the real Gemma model.
@pytest.mark.parametrize("qtype", [Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0])
def test_dequantize_each_type(qtype, tmp_path):
    rng = np.random.default_rng(1)
    data = rng.standard_normal((4, 512)).astype(np.float32)
    w = GGUFWriter(str(tmp_path / "t.gguf"), "llama")
    if qtype == Q.F32:
        w.add_tensor("t", data)
    elif qtype == Q.F16:
        w.add_tensor("t", data.astype(np.float16))
    else:
        w.add_tensor("t", quantize(data, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    info = GGUFFile(tmp_path / "t.gguf").tensors["t"]
    assert info.shape == (4, 512)
    out = dequantize(info)
    assert out.dtype == np.float32 and out.shape == (4, 512)
    bits = {Q.Q4_0: 4, Q.Q4_1: 4, Q.Q5_0: 5, Q.Q5_1: 5, Q.Q8_0: 8}.get(qtype, 10)
    rel_err = np.linalg.norm(out - data) / np.linalg.norm(data)
    assert rel_err < 2.0 ** (1 - bits), f"{qtype.name}: relative error {rel_err:.4f}"


def test_errors_are_clear(tmp_path):
    with pytest.raises(GGUFError, match="not found"):
        GGUFFile(tmp_path / "missing.gguf")
    (tmp_path / "junk.gguf").write_bytes(b"hello world, not a model" * 10)
    with pytest.raises(GGUFError, match="not a GGUF file"):
        GGUFFile(tmp_path / "junk.gguf")

    good = write_tiny_llama(tmp_path / "tiny.gguf")
    raw = good.read_bytes()
    (tmp_path / "cut.gguf").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(GGUFError, match="truncated|corrupt"):
        GGUFFile(tmp_path / "cut.gguf")

    w = GGUFWriter(str(tmp_path / "arch.gguf"), "mamba")
    w.add_tensor("x", np.zeros(32, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(GGUFError, match="architecture 'mamba' is not supported"):
        define_model(GGUFFile(tmp_path / "arch.gguf"))


def test_split_gguf_loads_like_the_whole_file(tmp_path):
    """A gguf-split model (NAME-00001-of-0000N.gguf, tensors spread over the parts) from its first
    part; a missing part or a later part given alone is a clear error."""
    whole = runner_for(write_tiny_llama(tmp_path / "whole.gguf"))
    first = write_tiny_llama(tmp_path / "split.gguf", split_max_tensors=8)
    assert first.name == "split-00001-of-00003.gguf"
    split = GGUFFile(first)
    assert len(split.parts) == 3 and len(split.tensors) == int(split.metadata["split.tensors.count"])
    ids = list(range(10, 30))
    assert torch.equal(score(runner_for(split), ids), score(whole, ids))
    with pytest.raises(GGUFError, match="part 2 of a split GGUF: give the first part"):
        GGUFFile(tmp_path / "split-00002-of-00003.gguf")
    (tmp_path / "split-00003-of-00003.gguf").unlink()
    with pytest.raises(GGUFError, match="missing: .*split-00003-of-00003.gguf"):
        GGUFFile(first)


def test_missing_tensor_is_named(tmp_path):
    path = write_tiny_llama(tmp_path / "tiny.gguf")
    gguf = GGUFFile(path)
    del gguf.tensors["blk.1.ffn_up.weight"]
    with pytest.raises(GGUFError, match="blk.1.ffn_up.weight is missing"):
        define_model(gguf)


def test_unsupported_tensor_type_is_named(tmp_path):
    w = GGUFWriter(str(tmp_path / "iq.gguf"), "llama")
    data = np.zeros((1, 256), dtype=np.float32)
    w.add_tensor("t", quantize(data, Q.TQ2_0), raw_dtype=Q.TQ2_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    info = GGUFFile(tmp_path / "iq.gguf").tensors["t"]
    with pytest.raises(GGUFError, match="TQ2_0"):
        dequantize(info)


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1])
def test_fast_path_close_to_reference(qtype, tmp_path):
    path = write_tiny_llama(tmp_path / "t.gguf", qtype=qtype)
    reference = runner_for(path)
    fast = runner_for(path, "pytorch")
    assert fast.model.blocks[0].attn.qkv.fused is not None
    ids = list(range(20, 50))
    ref, out = score(reference, ids), score(fast, ids)
    assert (ref - out).abs().max() / ref.abs().max() < 0.03  # bf16 activations and scales
    assert (ref.argmax(-1) == out.argmax(-1)).float().mean() > 0.9


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1])
def test_int4_unpack_is_exact(qtype, tmp_path):
    path = write_tiny_llama(tmp_path / "t.gguf", qtype=qtype)
    info = GGUFFile(path).tensors["blk.0.ffn_up.weight"]
    q, scale, zero = unpack_int4(info)
    rebuilt = ((q.float() - 8).view(q.shape[0], -1, 32) * scale[:, :, None] + zero[:, :, None]).view(q.shape)
    torch.testing.assert_close(rebuilt, torch.from_numpy(dequantize(info)), rtol=0, atol=1e-6)


def test_fast_decode_rows_are_bit_identical_alone_and_batched(tmp_path):
    """Batch invariance of a fast-path decode step: the same logits bits for a sequence alone or
    beside others. (The float32 reference path is only close: MKL's float32 GEMV for one row
    and GEMM for several sum in different orders; see test_batched_sequences_equal_each_alone.)"""
    path = write_tiny_llama(tmp_path / "t.gguf", qtype=Q.Q4_1)
    model = runner_for(path, "pytorch")
    seqs = [[(5 * i + k) % 240 + 6 for i in range(n)] for k, n in enumerate([9, 30, 70, 3])]

    def decode_last(group):
        state, cache = paged_state(model, num_blocks=64, block_size=8)
        chunks = []
        for s in group:
            table = BlockTable(cache)
            table.fill_to(len(s) - 1)
            model.run([SequenceChunk(s[:-1], 0, table.slots())], state)
            table.fill_to(len(s))
            chunks.append(SequenceChunk(s[-1:], len(s) - 1, table.slots()))
        return model.run(chunks, state)

    together = decode_last(seqs)
    for i, s in enumerate(seqs):
        assert torch.equal(decode_last([s])[0], together[i])


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape", [(320, 576), (576, 1536)])
def test_dense_kernel_rows_do_not_depend_on_their_neighbours(threads, shape):
    """A row's bits whatever rows come with it, on one thread and two: MKL's kernels (and, with
    threads, its split of the work) depend on the product's rows, most on Intel's MKL paths,
    where padding to 4 rows was not enough (1-15 rows on one thread; up to 48 rows of the
    576 x 1536 shape on two)."""
    from lamplight.kernels.linear import BATCH_INVARIANT_ROWS, DenseKernel

    was = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(0)
        kernel = DenseKernel(torch.randn(*shape), torch.float32, BATCH_INVARIANT_ROWS)
        x = torch.randn(70, shape[1])
        full = kernel(x)
        for start, count in [(0, 1), (3, 2), (5, 7), (10, 13), (0, 16), (1, 33), (4, 48), (0, 70)]:
            assert torch.equal(kernel(x[start : start + count]), full[start : start + count]), (start, count)
    finally:
        torch.set_num_threads(was)
