"""The native forward pass (lamplight/native): fidelity to the PyTorch path, the reproducibility
rule (a row's bits never depend on what shares its step, chunking, or a cached prefix), every
instruction-set build, and the fallback to PyTorch's kernels without a compiler."""

from __future__ import annotations

import ctypes
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from model_helpers import runner_for
from tiny_gguf import write_tiny_arch, write_tiny_gemma3, write_tiny_llama

from lamplight.engine.kv_cache import BlockTable, KVCache
from lamplight.gguf.file import GGUFFile
from lamplight.models.batch import SequenceChunk, build_forward_batch
from lamplight.models.spec import ExpertsSpec
from lamplight.native import build, runtime
from lamplight.native import linear as native_linear
from lamplight.native.abi import PROFILE_PHASES
from lamplight.native.runner import NativeRunner
from lamplight.state import ModelState

VARIANTS = build.runnable_variants()


def _native(model, variant: str | None = None, packed: bool = True) -> NativeRunner:
    """The native runner of `model`'s definition (any runner of it)."""
    lib = runtime.load_variant(variant or VARIANTS[0])
    return NativeRunner(model.spec, lib, packed=packed)


# The configurable decoder's architectures (biases, Q/K norms per head or whole, post-norms only,
# scales, softcaps, YaRN and query temperature, fused tensors, partial rotary, sinks, experts).
DECODER_ARCHS = ["qwen2", "qwen3", "mistral3", "gemma2", "olmo2", "granite", "phi3", "qwen3moe", "gpt-oss"]


@pytest.fixture(scope="module", params=["llama-q4_1", "llama-q8_0", "llama-q4_0", "gemma3", *DECODER_ARCHS])
def tiny(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("native") / f"{request.param}.gguf"
    if request.param == "gemma3":
        write_tiny_gemma3(path)
    elif request.param in DECODER_ARCHS:
        write_tiny_arch(path, request.param)
    else:
        write_tiny_llama(path, qtype=Q[request.param.split("-")[1].upper()], n_embd=128)
    return runner_for(path)


def _cache(model, dtype=torch.float32, blocks: int = 64, block_size: int = 8) -> KVCache:
    """A fresh pool in blocks (BlockTables over it); `_state(cache)` is what runners compute on."""
    return KVCache(model.new_state(blocks * block_size, dtype).kv, block_size)


def _state(cache: KVCache) -> ModelState:
    return ModelState(cache.pool)


def _run(runner, steps, cache: KVCache) -> list[torch.Tensor]:
    """Run steps (each a list of (table, tokens, start)) with all logits; logits per chunk."""
    outs = []
    for step in steps:
        chunks = []
        for table, tokens, start in step:
            table.fill_to(start + len(tokens))
            chunks.append(SequenceChunk(tokens, start, table.slots(), all_logits=True))
        logits = runner.run(chunks, _state(cache))
        row = 0
        for _, tokens, _ in step:
            outs.append(logits[row : row + len(tokens)])
            row += len(tokens)
    return outs


def _ids(n: int, k: int = 0) -> list[int]:
    return [(7 * i + 3 * k + 11) % 240 + 5 for i in range(n)]


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16])
def test_native_close_to_the_pytorch_path(tiny, kv_dtype):
    """Dense float32 weights: the same model as PyTorch's reference path up to float rounding;
    packed weights: within 8-bit activation rounding of it."""
    seqs = [_ids(n, k) for k, n in enumerate([21, 5, 40])]
    ref_cache = _cache(tiny, kv_dtype)
    reference = _run(tiny, [[(BlockTable(ref_cache), s, 0) for s in seqs]], ref_cache)
    # Packed: activations rounded to 8 bits per block of 32 (as llama.cpp), about 0.5% per matmul.
    # Dense with a half-precision cache: a K/V value may round to the other neighbouring half.
    dense_tolerance = 1e-4 if kv_dtype == torch.float32 else 1e-3
    if tiny.spec.options.activation == "gelu_tanh_fp16":
        dense_tolerance = 1e-3  # the reference looks GELU up in ggml's fp16 table; native computes it
    # With experts, 8-bit activations can flip a near-tied expert choice (as in llama.cpp): a
    # whole expert's output then differs, so packed MoE rows are held to the top token only
    # (tests/test_archs.py bounds them against llama.cpp, excepting near-tied routing).
    moe = any(isinstance(layer.ffn, ExpertsSpec) for layer in tiny.spec.layers)
    for packed, tolerance in ((False, dense_tolerance), (True, math.inf if moe else 0.1)):
        native = _native(tiny, packed=packed)
        cache = _cache(tiny, kv_dtype)
        got = _run(native, [[(BlockTable(cache), s, 0) for s in seqs]], cache)
        for g, r in zip(got, reference):
            scale = r.abs().max()
            assert (g - r).abs().max() <= tolerance * scale, (packed, (g - r).abs().max(), scale)
            assert (g.argmax(-1) == r.argmax(-1)).float().mean() >= (1.0 if not packed else 0.8)


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16])
def test_rows_do_not_depend_on_the_step(tiny, kv_dtype):
    """The reproducibility rule: a sequence's logits are bit-identical whether its prompt is one
    chunk or several, whether its prefix was cached (computed in an earlier step), and whatever
    other sequences (prompt chunks or decode tokens) share its steps."""
    native = _native(tiny)
    seq = _ids(37)
    cache = _cache(tiny, kv_dtype)
    (whole,) = _run(native, [[(BlockTable(cache), seq, 0)]], cache)

    cache = _cache(tiny, kv_dtype)
    table = BlockTable(cache)
    pieces = _run(native, [[(table, seq[:13], 0)], [(table, seq[13:14], 13)], [(table, seq[14:30], 14)]]
                  + [[(table, seq[i : i + 1], i)] for i in range(30, 37)], cache)
    assert torch.equal(torch.cat(pieces), whole)

    cache = _cache(tiny, kv_dtype)
    table, others = BlockTable(cache), [BlockTable(cache) for _ in range(3)]
    crowded = _run(native, [
        [(others[0], _ids(9, 1), 0), (table, seq[:20], 0), (others[1], _ids(50, 2), 0)],
        [(others[0], _ids(1, 3), 9), (table, seq[20:36], 20), (others[2], _ids(3, 4), 0)],
        [(others[2], _ids(1, 5), 3), (table, seq[36:], 36), (others[0], _ids(1, 6), 10)],
    ], cache)
    assert torch.equal(torch.cat([crowded[1], crowded[4], crowded[7]]), whole)


def test_instruction_set_builds_agree(tiny):
    """Every build this CPU runs computes the same bits: integer block sums are exact and every
    float reduction runs in one order in all builds (the generic one emulates the vector order)."""
    seq = _ids(33)
    results = {}
    for variant in VARIANTS:
        cache = _cache(tiny)
        (results[variant],) = _run(_native(tiny, variant), [[(BlockTable(cache), seq, 0)]], cache)
    first = results[VARIANTS[0]]
    for variant, logits in results.items():
        assert torch.equal(logits, first), variant


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("n_heads, n_kv, head_dim", [(4, 4, 48), (2, 1, 48), (6, 2, 64), (8, 2, 32), (5, 1, 64),
                                                    (7, 1, 32), (3, 1, 128)])
def test_query_heads_sharing_loads_give_each_heads_bits(tmp_path, n_heads, n_kv, head_dim, kv_dtype):
    """Attention runs a KV group's query heads 4, 3 or 2 at a time where the build holds their
    accumulators (sharing each key's and value's loads), the rest one at a time; every head's
    scores and outputs are the one-head kernels' (the generic build's), for prompt and decode
    rows, whole 32- or 64-value passes over a head or a tail. An fp16 pool is read in place by
    the vector builds (converted to float32 rows first by the generic one): the same bits. The
    rows of a short chunk (3 and 9 rows; the 37-row prompt too where a group has fewer than 4
    heads) attend together on AVX-512, up to 8 heads of 2 to 6 rows, each row over its own keys;
    so do the rows of a chunk long enough to transpose its keys (37 rows from 4 heads a group,
    130 rows below), up to 8 heads of 1 to 8 rows, scored 4 or 2 lanes of the chains a pass."""
    path = write_tiny_llama(tmp_path / "heads.gguf", n_embd=n_heads * head_dim, n_heads=n_heads, n_kv=n_kv)
    results = {}
    for variant in VARIANTS:
        model = runner_for(path)
        cache = _cache(model, kv_dtype)
        table = BlockTable(cache)
        results[variant] = _run(_native(model, variant), [[(table, _ids(37), 0)], [(table, _ids(3, 5), 37)],
                                                          [(table, _ids(9, 6), 40)], [(table, [9], 49)],
                                                          [(table, _ids(130, 7), 50)]], cache)
    first = results[VARIANTS[-1]]
    for variant, steps in results.items():
        for got, want in zip(steps, first):
            assert torch.equal(got, want), variant


@pytest.mark.parametrize("qtype", [Q.F16, Q.BF16])
def test_half_precision_weights_are_read_as_stored_and_give_the_float32_bits(tmp_path, qtype, monkeypatch):
    """F16 and BF16 weights stay 2 bytes a value (half what float32 reads) and are widened exactly
    before the same dot products: prompt and decode rows give the float32 path's bits, every build
    (the output head's 267 columns end in a tile padded with zero columns)."""
    model = runner_for(write_tiny_llama(tmp_path / "half.gguf", qtype=qtype, n_embd=128, output_qtype=qtype))
    assert model.config.vocab_size % 4 != 0

    def steps(cache):  # a prompt (rows widened 16 at a time), then 3 rows and 1 (read straight from the tiles)
        table = BlockTable(cache)
        return [[(table, _ids(37), 0)], [(table, _ids(3, 5), 37)], [(table, [9], 40)]]

    results, bytes_read = {}, {}
    for variant in VARIANTS:
        runner = _native(model, variant)
        assert qtype.name.lower() in runner.kinds and "f32" not in runner.kinds
        cache = _cache(model)
        results[variant] = _run(runner, steps(cache), cache)
        bytes_read[variant] = runner.weight_bytes()
    monkeypatch.setattr(native_linear, "_DENSE_FORMATS", {})
    wide = _native(model)
    assert wide.kinds == ["f32"] and wide.weight_bytes() > 1.5 * bytes_read[VARIANTS[0]]
    cache = _cache(model)
    expected = _run(wide, steps(cache), cache)
    for variant, outs in results.items():
        assert all(torch.equal(a, b) for a, b in zip(outs, expected)), variant


def test_the_fast_backend_is_the_native_forward(tiny):
    """The loader's fast backend builds the native runner where the machine has one: the same
    bits as the native runner built directly."""
    from lamplight.loader import build_runner

    fast = build_runner(tiny.spec, "fast")
    assert fast.backend == "native" and fast.describe().startswith("native ")
    cache = _cache(tiny)
    (via_loader,) = _run(fast, [[(BlockTable(cache), _ids(12), 0)]], cache)
    cache = _cache(tiny)
    (direct,) = _run(_native(tiny), [[(BlockTable(cache), _ids(12), 0)]], cache)
    assert torch.equal(via_loader, direct)


def test_without_a_compiler_lamplight_runs_on_pytorch_kernels(tmp_path):
    """No C++ compiler and nothing cached: a warning once, then PyTorch's kernels serve."""
    path = write_tiny_llama(tmp_path / "t.gguf", qtype=Q.Q4_1)
    script = (
        "import logging, lamplight, torch\n"
        "logging.basicConfig(level=logging.INFO)\n"
        f"m = lamplight.load({str(path)!r}, backend='fast')\n"
        "print('KERNELS', m.kernels)\n"
        "print('NATIVE', m.runner.backend == 'native')\n"
        "from lamplight.runner import greedy\n"
        "print('TOKENS', greedy(m.runner, [5, 6, 7], 4))\n"
    )
    env = dict(os.environ, PATH=str(tmp_path / "empty"), CXX="", LAMPLIGHT_NATIVE_CACHE=str(tmp_path / "cache"))
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "KERNELS pytorch fast (no C++ compiler found" in out.stdout, out.stdout
    assert "NATIVE False" in out.stdout
    assert out.stderr.count("native kernels unavailable") == 1
    assert "TOKENS [" in out.stdout


def test_seeded_output_does_not_depend_on_the_cache_or_neighbours(tmp_path):
    """A seeded request's tokens are the same from a fresh engine, alone and without its cache,
    as from a busy engine that reuses a cached prefix of its prompt and splits it into other
    chunks (issue: reused-prefix and fresh paths must compute every row identically)."""
    from lamplight.engine.config import EngineConfig
    from lamplight.engine.engine import Engine
    from lamplight.engine.types import FinalEvent, GenerationRequest
    from lamplight.sampling import SamplingParams
    from lamplight.tokenizer import Tokenizer

    path = write_tiny_llama(tmp_path / "t.gguf", qtype=Q.Q4_1, n_ctx=512)
    gguf = GGUFFile(path)
    model, tokenizer = _native(runner_for(gguf)), Tokenizer.from_gguf(gguf)
    # n_probs: the raw softmax of every step's logits comes back, so any difference in the
    # logits' bits shows, not only one that flips a sampled token.
    seeded = SamplingParams(temperature=1.0, seed=1234, n_probs=5)
    prefix, rest = _ids(45, 1), _ids(30, 2)

    def final(handle) -> FinalEvent:
        return next(e for e in handle.iter_events(timeout=120) if isinstance(e, FinalEvent))

    def engine(**cfg) -> Engine:
        eng = Engine(model, tokenizer, EngineConfig(n_ctx=2048, n_parallel=4, cache_type_k="f16", cache_type_v="f16", **cfg))
        eng.start()
        return eng

    fresh = engine()
    try:
        expected = final(fresh.submit(GenerationRequest(prefix + rest, seeded, n_predict=24, cache_prompt=False)))
    finally:
        fresh.stop()
    busy = engine(n_ubatch=16)  # prompts in 16-token chunks, cut where the neighbours leave room
    try:
        final(busy.submit(GenerationRequest(prefix, seeded, n_predict=3)))  # leaves the prefix cached
        others = [busy.submit(GenerationRequest(_ids(20 + 7 * k, 10 + k), seeded, n_predict=20)) for k in range(3)]
        prefix_cached = final(busy.submit(GenerationRequest(prefix + rest, seeded, n_predict=24)))
        # Now the whole prompt is cached: only its last token is evaluated, alone in its chunk.
        all_cached = final(busy.submit(GenerationRequest(prefix + rest, seeded, n_predict=24)))
        for handle in others:
            final(handle)
    finally:
        busy.stop()
    assert prefix_cached.n_cached >= len(prefix) - 1 and all_cached.n_cached == len(prefix + rest) - 1
    for again in (prefix_cached, all_cached):
        assert again.token_ids == expected.token_ids
        assert again.probs == expected.probs and len(expected.probs) == 24


def test_server_serves_on_native_kernels_and_says_so(tmp_path):
    """`lamplight.load(backend="fast")` picks the native forward; the engine then keeps its KV cache in
    f16 (llama-server's default); /props names the kernel set and the memory budget."""
    import httpx
    from test_server_support import serve

    import lamplight
    from lamplight.server.launcher import EngineOptions, build_engine

    loaded = lamplight.load(str(write_tiny_llama(tmp_path / "t.gguf", qtype=Q.Q4_1)), backend="fast")
    assert loaded.runner.backend == "native" and loaded.kernels.startswith("native ")
    torch_threads = torch.get_num_threads()  # build_engine gives PyTorch one thread: restored below
    engine = build_engine(loaded, EngineOptions(n_ctx=512, n_parallel=2))
    server = serve(loaded, engine)
    try:
        assert engine.state.kv.k_type.name == "f16" and engine.state.kv.k[0].dtype == np.float16  # a numpy pool
        props = httpx.get(f"{server.url}/props").json()["lamplight"]
        assert props["kernels"] == loaded.kernels
        assert props["memory_mib"]["weights"] > 0 and props["memory_mib"]["kv_cache"] > 0
        reply = httpx.post(f"{server.url}/completion", json={"prompt": "the", "n_predict": 5}, timeout=60).json()
        assert reply["tokens_predicted"] == 5
        assert "scratch" in httpx.get(f"{server.url}/props").json()["lamplight"]["memory_mib"]
        assert loaded.runner.scratch_bytes() > 0
        assert torch.get_num_threads() == 1
    finally:
        server.stop()
        engine.stop()
        torch.set_num_threads(torch_threads)


def test_out_of_range_positions_are_refused_not_read(tiny):
    """A position past the RoPE table or a slot past the pool is an error, never a stray read."""
    native = _native(tiny)
    cache = _cache(tiny, blocks=4)
    table = BlockTable(cache)
    table.fill_to(3)
    bad = SequenceChunk([5], tiny.config.n_ctx_train, list(range(tiny.config.n_ctx_train)) + [2])
    with pytest.raises(ValueError, match="out of range"):
        native.run_batch(build_forward_batch([bad]), _state(cache))
    outside = SequenceChunk([5, 6], 0, [0, cache.num_blocks * cache.block_size])
    with pytest.raises(ValueError, match="out of range"):
        native.run_batch(build_forward_batch([outside]), _state(cache))


def test_bad_step_arrays_are_refused_and_the_next_step_runs(tiny, monkeypatch):
    """Every index the native forward reads from a step's arrays is checked before any work: a
    logit row, key offset or key slot out of its range is a ValueError naming the array and row,
    and the next good step gives the same logits as before."""
    import dataclasses

    from lamplight.native import runner

    native = _native(tiny)
    cache = _cache(tiny, blocks=4)
    table, other = BlockTable(cache), BlockTable(cache)
    table.fill_to(6)
    other.fill_to(3)
    good = build_forward_batch([SequenceChunk(_ids(6), 0, table.slots(), all_logits=True),
                                SequenceChunk(_ids(3, 1), 0, other.slots())])
    expected = native.run_batch(good, _state(cache))
    pool_tokens = cache.num_blocks * cache.block_size

    def keys(change):  # the step's real key table, changed
        real = runner.key_table
        return lambda batch: change(*real(batch))

    cases = [
        (dataclasses.replace(good, logit_rows=torch.tensor([0, 9])), None, r"logit_rows\[1\] = 9 is out of range \[0, 9\)"),
        (dataclasses.replace(good, logit_rows=torch.tensor([-1])), None, r"logit_rows\[0\] = -1 is out of range"),
        (good, keys(lambda offsets, slots: (offsets + 4, slots)), r"key_offsets\[5\] = 4 is out of range: "
         r"position 5 reads key_slots\[9\] of \[0, 9\)"),
        (good, keys(lambda offsets, slots: (offsets - 1, slots)), r"key_offsets\[5\] = -1 is out of range"),
        (good, keys(lambda offsets, slots: (offsets, slots[:-1])), r"key_offsets\[8\] = 6 is out of range: "
         r"position 2 reads key_slots\[8\] of \[0, 8\)"),
        (good, keys(lambda offsets, slots: (offsets, np.where(np.arange(slots.size) == 7, pool_tokens, slots))),
         rf"key_slots\[7\] = {pool_tokens} \(row 8, position 1\) is out of range"),
    ]
    for batch, key_table, message in cases:
        with monkeypatch.context() as patch:
            if key_table is not None:
                patch.setattr(runner, "key_table", key_table)
            with pytest.raises(ValueError, match=message):
                native.run_batch(batch, _state(cache))
        assert torch.equal(native.run_batch(good, _state(cache)), expected)


def test_a_bad_model_description_is_refused(tiny):
    """lp_model_new checks the description (parts, shapes, rope tables, experts, adapters) and
    returns null, which Python raises on, rather than run a model it would read out of bounds."""
    import ctypes

    from lamplight.native import abi

    native = _native(tiny)
    config = abi.Config.from_buffer_copy(native._config)
    config.head.n_parts = abi.MAX_PARTS + 1
    with pytest.raises(ValueError, match=f"refused the model: head: {abi.MAX_PARTS + 1} parts"):
        native.lib.lp_model_new(ctypes.byref(config), native._layers)
    layers = (abi.Layer * len(native._layers)).from_buffer_copy(native._layers)
    layers[0].rope = 2
    with pytest.raises(ValueError, match="layer 0: rope table 2"):
        native.lib.lp_model_new(ctypes.byref(native._config), layers)
    layers = (abi.Layer * len(native._layers)).from_buffer_copy(native._layers)
    layers[-1].wo.n_out += 16
    with pytest.raises(ValueError, match=f"layer {len(layers) - 1} wo: .* outputs in its parts"):
        native.lib.lp_model_new(ctypes.byref(native._config), layers)


def test_lora_adapters_on_the_native_forward(tmp_path):
    """Adapters are applied by the native forward itself: at scale 0 the logits are the base
    model's, bit for bit; at scale 1 they follow the PyTorch reference path with the adapter; a
    row's result does not depend on the step (adapter deltas are computed row by row)."""
    from tiny_gguf import write_tiny_lora

    from lamplight.models.lora import load_lora
    from lamplight.runner import score

    path = write_tiny_llama(tmp_path / "t.gguf", qtype=Q.Q4_1)
    targets = {"blk.0.attn_q.weight": (64, 64), "blk.1.ffn_down.weight": (64, 128), "blk.1.attn_v.weight": (32, 64)}
    adapter_path = write_tiny_lora(tmp_path / "a.gguf", targets, rank=4, alpha=8.0)
    ids = _ids(20)
    reference = runner_for(path)
    model = _native(reference)
    base = score(model, ids)
    scales = model.attach_loras([load_lora(adapter_path, "llama")])
    reference_scales = reference.attach_loras([load_lora(adapter_path, "llama")])
    assert torch.equal(score(model, ids), base)
    scales.scales = reference_scales.scales = [1.0]
    adapted, expected = score(model, ids), score(reference, ids)
    assert not torch.equal(adapted, base)
    assert (adapted - expected).abs().max() <= 0.1 * expected.abs().max()
    assert (adapted - expected).abs().max() < 0.5 * (base - expected).abs().max()
    cache = _cache(model)
    table, other = BlockTable(cache), BlockTable(cache)
    pieces = _run(model, [[(table, ids[:7], 0), (other, _ids(9, 3), 0)], [(other, _ids(1, 4), 9), (table, ids[7:], 7)]], cache)
    assert torch.equal(torch.cat([pieces[0], pieces[3]]), adapted)
    # A step whose scales do not cover the adapters' indices is refused, then runs once they do.
    scales.scales = []
    with pytest.raises(ValueError, match=r"LoRA adapter 0 is out of range: lora_scales holds 0"):
        score(model, ids)
    scales.scales = [1.0]
    assert torch.equal(score(model, ids), adapted)


@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K", "Q8_0", "gemma2", "phi3"])
def test_a_prompt_steps_fused_feed_forward_gives_the_bits_of_smaller_steps(tmp_path, kind):
    """Steps of 64 rows or more take gate_up, the activation and down's quantization together in
    blocks of rows and columns (lp::gated_linear: the activation phase's profile stays at zero);
    smaller steps take them phase by phase. The same prompt's logits are the same bits either
    way, on every build: k-quants quantize down's input per 256, Q8_0 per 32; gemma2's GELU;
    phi3's gate and up in one tensor."""
    if kind in ("gemma2", "phi3"):
        path = write_tiny_arch(tmp_path / f"{kind}.gguf", kind, shape={"n_ff": 256})
    else:
        path = write_tiny_llama(tmp_path / f"{kind}.gguf", qtype=Q[kind], n_embd=256)
    model = runner_for(path)
    seq = _ids(70)
    activation = PROFILE_PHASES.index("activation")
    for variant in VARIANTS:
        native = _native(model, variant)
        times, results = [], []
        for steps in ([[seq]], [[seq[i:i + 10]] for i in range(0, len(seq), 10)]):
            cache = _cache(model)
            table = BlockTable(cache)
            native.lib.lp_profile(1, None)
            starts = np.cumsum([0] + [len(step[0]) for step in steps])
            chunks = [[(table, step[0], int(start))] for step, start in zip(steps, starts)]
            results.append(torch.cat(_run(native, chunks, cache)))
            phases = (ctypes.c_double * len(PROFILE_PHASES))()
            native.lib.lp_profile(0, phases)
            times.append(phases[activation])
        assert times[0] == 0.0 and times[1] > 0.0, (variant, times)  # fused, then phase by phase
        assert torch.equal(results[0], results[1]), variant
