"""A decode row's weight prefetch (lamplight/native/prefetch.py): its distance timed once per
process, the fastest kept, and never a change in any result."""

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
from lamplight.native.runner import NativeRunner
from lamplight.state import ModelState

VARIANTS = build.runnable_variants()


def _decode_logits(runner: NativeRunner, distance: int) -> list[torch.Tensor]:
    """A 9-token prompt (multi-row tiles, which always prefetch), then 4 decode rows (one-row
    tiles) with the one-row prefetch `distance` bytes ahead (0: none): every step's logits."""
    runner.lib.lp_set_one_row_prefetch(distance)
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
    """A tiny llama of a block format, or a random Llama 3.2 1B cut to 2 layers of 256 as
    llama-quantize's Q4_K_M lays it out (Q4_K and Q6_K: the k-quants' super-block tiles)."""
    if request.param == "Q4_K_M":
        return write_random_model("llama-3.2-1b", tmp_path / "k.gguf", "Q4_K_M", seed=1, layers=2,
                                  overrides=("n_embd=256", "n_ff=512", "n_head=4", "n_head_kv=2"),
                                  tokenizer_from=smollm2_path).path
    qtype = Q[request.param]
    return write_tiny_llama(tmp_path / "m.gguf", qtype=qtype, output_qtype=qtype)


def test_the_one_row_prefetch_changes_no_bits(quantized):
    """Block formats and k-quants, every build: decode rows give the same logits at every
    distance as without the prefetch, and the setter returns the previous distance."""
    model = runner_for(quantized)
    for variant in VARIANTS:
        runner = NativeRunner(model.spec, runtime.load_variant(variant))
        without = _decode_logits(runner, 0)
        for distance in prefetch.DISTANCES[1:]:
            with_it = _decode_logits(runner, distance)
            assert runner.lib.lp_set_one_row_prefetch(0) == distance
            for a, b in zip(without, with_it):
                assert torch.equal(a, b), (variant, distance)
        assert runner.lib.lp_set_one_row_prefetch(0) == 0


def test_the_distance_is_clamped_to_whole_lines():
    """lp_set_one_row_prefetch keeps a distance in [0, LP_MAX_ONE_ROW_PREFETCH], in whole lines."""
    lib = runtime.load_variant(VARIANTS[0])
    lib.lp_set_one_row_prefetch(0)
    for asked, kept in ((2048, 2048), (2100, 2048), (63, 0), (-5, 0), (1 << 30, 65536), (0, 0)):
        lib.lp_set_one_row_prefetch(asked)
        assert lib.lp_set_one_row_prefetch(0) == kept, asked


def test_the_fastest_distance_is_kept_once_a_process(tmp_path, monkeypatch):
    """choose_one_row_prefetch keeps the distance whose median step was fastest, sets it on the
    library, and reuses the choice for the next model on that library without timing again."""
    model = runner_for(write_tiny_llama(tmp_path / "m.gguf"))
    runner = NativeRunner(model.spec, runtime.load_variant(VARIANTS[0]))
    none, near, far = prefetch.DISTANCES
    for fastest, times in ((far, {none: [2.0] * 3, near: [3.0, 3.0, 1.0], far: [1.0, 9.0, 1.0]}),
                           (near, {none: [2.0] * 3, near: [1.5, 9.0, 1.5], far: [9.0, 1.0, 9.0]}),
                           (none, {none: [2.0, 9.0, 2.0], near: [3.0, 3.0, 1.0], far: [2.5] * 3}),
                           (none, {none: [2.0] * 3, near: [2.0] * 3, far: [2.0] * 3})):  # a tie: no prefetch
        monkeypatch.setattr(prefetch, "_chosen", {})
        monkeypatch.setattr(prefetch, "_step_times", lambda r, t=times: t)
        assert prefetch.choose_one_row_prefetch(runner) == fastest
        assert runner.lib.lp_set_one_row_prefetch(fastest) == fastest
    monkeypatch.setattr(prefetch, "_step_times", lambda r: pytest.fail("timed again"))
    runner.lib.lp_set_one_row_prefetch(far)
    assert prefetch.choose_one_row_prefetch(runner) == none  # the kept choice, set again
    assert runner.lib.lp_set_one_row_prefetch(0) == 0


def test_a_step_that_fails_leaves_the_prefetch_off_and_untimed(tmp_path, monkeypatch):
    model = runner_for(write_tiny_llama(tmp_path / "m.gguf"))
    runner = NativeRunner(model.spec, runtime.load_variant(VARIANTS[0]))
    monkeypatch.setattr(prefetch, "_chosen", {})

    def fails(r):
        raise ValueError("no step")

    monkeypatch.setattr(prefetch, "_step_times", fails)
    runner.lib.lp_set_one_row_prefetch(2048)
    assert prefetch.choose_one_row_prefetch(runner) is None
    assert runner.lib.lp_set_one_row_prefetch(0) == 0
    assert prefetch._chosen == {}


def test_the_real_timing_runs_a_model(tmp_path, monkeypatch):
    """Without stand-ins: the steps run on a real (tiny) model and a choice is made and kept."""
    model = runner_for(write_tiny_llama(tmp_path / "m.gguf"))
    runner = NativeRunner(model.spec, runtime.load_variant(VARIANTS[0]))
    monkeypatch.setattr(prefetch, "_chosen", {})
    times = prefetch._step_times(runner)
    assert sorted(times) == sorted(prefetch.DISTANCES)
    assert all(len(ts) == prefetch.ROUNDS and all(t > 0 for t in ts) for ts in times.values())
    chosen = prefetch.choose_one_row_prefetch(runner)
    assert chosen in prefetch.DISTANCES and prefetch._chosen == {runner.lib._handle: chosen}
    assert runner.lib.lp_set_one_row_prefetch(0) == chosen
    runner.lib.lp_set_one_row_prefetch(0)


def test_loading_a_model_chooses_and_the_kernels_line_says_so(tmp_path, monkeypatch):
    """The loader makes the choice for the first native model and the start-up log's kernels line
    (NativeRunner.describe, also in /props) names it."""
    from lamplight.loader import load

    path = write_tiny_llama(tmp_path / "m.gguf")
    for fastest, said in ((2048, "decode rows prefetch 2 KiB ahead"), (6144, "decode rows prefetch 6 KiB ahead"),
                          (0, None)):
        monkeypatch.setattr(prefetch, "_chosen", {})
        monkeypatch.setattr(prefetch, "_step_times",
                            lambda r, f=fastest: {d: [1.0 if d == f else 2.0] * 4 for d in prefetch.DISTANCES})
        runner = load(str(path), backend="native").runner
        assert runner.one_row_prefetch == fastest
        assert ("decode rows prefetch" in runner.describe()) is (said is not None)
        assert said is None or said in runner.describe()
    runner.lib.lp_set_one_row_prefetch(0)
