"""How a decode row reads its weights (lamplight/native/prefetch.py): the prefetch distance and the
column groups read side by side, timed once per process, the fastest kept, and never a change in
any result."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType as Q
from model_helpers import runner_for
from tiny_gguf import write_tiny_llama

from lamplight.bench.random_model import write_random_model
from lamplight.engine.kv_cache import BlockTable, KVCache
from lamplight.models.batch import SequenceChunk
from lamplight.native import build, prefetch, runtime
from lamplight.native.prefetch import OneRowReads
from lamplight.native.runner import NativeRunner
from lamplight.state import ModelState

VARIANTS = build.runnable_variants()


def _decode_logits(runner: NativeRunner, reads: OneRowReads) -> list[torch.Tensor]:
    """A 9-token prompt (multi-row tiles, which always prefetch), then 4 decode rows (one-row
    tiles) read as `reads` says: every step's logits."""
    prefetch.apply(runner.lib, reads)
    cache = KVCache(runner.new_state(64, torch.float16).kv, 8)
    table = BlockTable(cache)
    ids = [(7 * i + 3) % 200 + 5 for i in range(13)]
    steps = [(ids[:9], 0)] + [([ids[t]], t) for t in range(9, 13)]
    outs = []
    for tokens, start in steps:
        table.fill_to(start + len(tokens))
        outs.append(runner.run([SequenceChunk(tokens, start, table.slots(), all_logits=True)], ModelState(cache.pool)))
    return outs


@pytest.fixture(params=["Q4_1", "Q8_0", "Q4_K_M"])
def quantized(request, tmp_path, smollm2_path):
    """A llama of a block format, or a random Llama 3.2 1B cut to 2 layers of 256 as
    llama-quantize's Q4_K_M lays it out (Q4_K and Q6_K: the k-quants' super-block tiles). Their
    linears are wide enough that a thread's column chunk holds 4 groups side by side."""
    if request.param == "Q4_K_M":
        return write_random_model("llama-3.2-1b", tmp_path / "k.gguf", "Q4_K_M", seed=1, layers=2,
                                  overrides=("n_embd=256", "n_ff=512", "n_head=4", "n_head_kv=2"),
                                  tokenizer_from=smollm2_path).path
    qtype = Q[request.param]
    return write_tiny_llama(tmp_path / "m.gguf", qtype=qtype, output_qtype=qtype, n_embd=256)


def test_no_way_of_reading_changes_any_bits(quantized):
    """Block formats and k-quants, every build: decode rows give the same logits with every choice
    the build has as with the plain reads, and the setters return the settings before."""
    model = runner_for(quantized)
    for variant in VARIANTS:
        lib = runtime.load_variant(variant)
        runner = NativeRunner(model.spec, lib)
        assert {c.streams for c in prefetch.choices_of(lib)} == ({1, 4} if variant == "avx512vnni" else {1})
        plain = _decode_logits(runner, prefetch.PLAIN)
        for reads in prefetch.choices_of(lib)[1:]:
            other = _decode_logits(runner, reads)
            assert prefetch.current(lib) == reads
            for a, b in zip(plain, other):
                assert torch.equal(a, b), (variant, reads)
        prefetch.apply(lib, prefetch.PLAIN)
        assert prefetch.current(lib) == prefetch.PLAIN


def test_the_distance_is_clamped_to_whole_lines():
    """lp_set_one_row_prefetch keeps a distance in [0, LP_MAX_ONE_ROW_PREFETCH], in whole lines."""
    lib = runtime.load_variant(VARIANTS[0])
    lib.lp_set_one_row_prefetch(0)
    for asked, kept in ((2048, 2048), (2100, 2048), (63, 0), (-5, 0), (1 << 30, 65536), (0, 0)):
        lib.lp_set_one_row_prefetch(asked)
        assert lib.lp_set_one_row_prefetch(0) == kept, asked


def _times(fastest: OneRowReads, choices, slow: float = 2.0) -> dict:
    return {c: [1.0] * 4 if c == fastest else [slow] * 4 for c in choices}


def test_the_fastest_choice_is_kept_once_a_process(tmp_path, monkeypatch):
    """choose_one_row_reads keeps the choice whose median step was fastest, sets it on the
    library, and reuses it for the next model on that library without timing again; a tie keeps
    the plain reads."""
    model = runner_for(write_tiny_llama(tmp_path / "m.gguf"))
    lib = runtime.load_variant(VARIANTS[0])
    runner = NativeRunner(model.spec, lib)
    choices = prefetch.choices_of(lib)
    near, far = OneRowReads(1, 2048), OneRowReads(1, 6144)
    cases = [(far, {c: [2.0] * 3 for c in choices} | {near: [3.0, 3.0, 1.0], far: [1.0, 9.0, 1.0]}),
             (near, {c: [2.0] * 3 for c in choices} | {near: [1.5, 9.0, 1.5], far: [9.0, 1.0, 9.0]}),
             (prefetch.PLAIN, {c: [2.0] * 3 for c in choices})]  # a tie: the plain reads
    cases += [(c, _times(c, choices)) for c in choices]  # each choice, side by side included
    for fastest, times in cases:
        monkeypatch.setattr(prefetch, "_chosen", {})
        monkeypatch.setattr(prefetch, "_step_times", lambda r, cs, t=times: {c: t[c] for c in cs})
        assert prefetch.choose_one_row_reads(runner) == fastest
        assert prefetch.current(lib) == fastest
    monkeypatch.setattr(prefetch, "_step_times", lambda r, cs: pytest.fail("timed again"))
    prefetch.apply(lib, far)
    assert prefetch.choose_one_row_reads(runner) == choices[-1]  # the kept choice, set again
    assert prefetch.current(lib) == choices[-1]
    prefetch.apply(lib, prefetch.PLAIN)


def test_a_step_that_fails_leaves_the_plain_reads_and_untimed(tmp_path, monkeypatch):
    model = runner_for(write_tiny_llama(tmp_path / "m.gguf"))
    lib = runtime.load_variant(VARIANTS[0])
    runner = NativeRunner(model.spec, lib)
    monkeypatch.setattr(prefetch, "_chosen", {})

    def fails(r, choices):
        raise ValueError("no step")

    monkeypatch.setattr(prefetch, "_step_times", fails)
    prefetch.apply(lib, OneRowReads(4, 2048))
    assert prefetch.choose_one_row_reads(runner) is None
    assert prefetch.current(lib) == prefetch.PLAIN
    assert prefetch._chosen == {}


def test_the_real_timing_runs_a_model(tmp_path, monkeypatch):
    """Without stand-ins: the steps run on a real (tiny) model and a choice is made and kept."""
    model = runner_for(write_tiny_llama(tmp_path / "m.gguf"))
    lib = runtime.load_variant(VARIANTS[0])
    runner = NativeRunner(model.spec, lib)
    monkeypatch.setattr(prefetch, "_chosen", {})
    choices = prefetch.choices_of(lib)
    steps, step = [], runner.step
    monkeypatch.setattr(runner, "step", lambda *args: steps.append(1) or step(*args))
    times = prefetch._step_times(runner, choices)
    assert sorted(times) == sorted(choices)
    assert all(len(ts) == prefetch.ROUNDS and all(t > 0 for t in ts) for ts in times.values())
    # a tiny model's step is far under SAMPLE_SECONDS: each timed sample is the mean of several
    slowest = max(max(ts) for ts in times.values())
    assert slowest < prefetch.SAMPLE_SECONDS / 4
    assert len(steps) >= len(choices) * (1 + prefetch.ROUNDS * 3)
    chosen = prefetch.choose_one_row_reads(runner)
    assert chosen in choices and prefetch._chosen == {lib._handle: chosen}
    assert prefetch.current(lib) == chosen
    prefetch.apply(lib, prefetch.PLAIN)


def test_loading_a_model_chooses_and_the_kernels_line_says_so(tmp_path, monkeypatch):
    """The loader makes the choice for the first native model and the start-up log's kernels line
    (NativeRunner.describe, also in /props) names it."""
    from lamplight.loader import load

    path = write_tiny_llama(tmp_path / "m.gguf")
    cases = ((OneRowReads(1, 2048), "decode rows prefetch 2 KiB ahead"),
             (OneRowReads(1, 6144), "decode rows prefetch 6 KiB ahead"),
             (OneRowReads(4, 2048), "decode rows read 4 column groups at once, prefetch 2 KiB ahead"),
             (OneRowReads(4, 0), "decode rows read 4 column groups at once, prefetch not at all"),
             (prefetch.PLAIN, None))
    for fastest, said in cases:
        if fastest not in prefetch.choices_of(runtime.library()):
            continue  # a build without side-by-side tiles
        monkeypatch.setattr(prefetch, "_chosen", {})
        monkeypatch.setattr(prefetch, "_step_times", lambda r, cs, f=fastest: _times(f, cs))
        runner = load(str(path), backend="native").runner
        assert runner.one_row_reads == fastest
        assert ("decode rows" in runner.describe()) is (said is not None)
        assert said is None or said in runner.describe()
    prefetch.apply(runner.lib, prefetch.PLAIN)
