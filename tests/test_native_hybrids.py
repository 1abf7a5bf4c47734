"""The 2026 hybrid architectures on the native runner (lamplight.native), against llama.cpp.

The same goldens and checks as tests/test_archs2.py (shared/reference/archs2, see its README.md)
on the C++ forward: every position within |mine - golden| <= ATOL + 2 x fp32_weights_diff, top-1
where llama.cpp's margin is clear, greedy continuations through single-token decode steps, the
two-part evaluations, and the reproducibility rule: the recurrent state after a prompt and the
logits from there are bit-identical whatever the chunking, and a sequence decoded beside others
computes what it computes alone. Run with -s to see the figures.
"""

from __future__ import annotations

import pytest
import torch

import lamplight
from model_helpers import runner_for
from test_archs2 import (ATOL, TOP1_MARGIN, _bound, _evaluate_in_parts, _greedy_prompt_len, _ids, _path,
                         _rows)

from lamplight.models.batch import SequenceChunk
from lamplight.native import runtime
from lamplight.runner import greedy, score

NATIVE_ARCHS = ["qwen35", "qwen35moe", "lfm2", "granitehybrid", "gemma4", "smollm3"]
# How close the native runner's logits stay to the reference path's (float32 on dequantized
# weights); the native matmuls round activations as llama.cpp's do.
NEAR_REFERENCE = 0.6


@pytest.fixture(scope="module")
def runners():
    if runtime.library() is None:
        pytest.skip(f"no native library: {runtime.unavailable_reason()}")
    cache: dict[tuple[str, str], object] = {}

    def get(arch: str, backend: str = "native"):
        if (arch, backend) not in cache:
            cache[arch, backend] = runner_for(_path(arch), backend)
        return cache[arch, backend]

    return get


@pytest.mark.parametrize("arch", NATIVE_ARCHS)
def test_fast_backend_serves_the_native_runner(arch, runners):
    loaded = lamplight.load(_path(arch), backend="fast")
    assert loaded.runner.backend == "native", loaded.kernels


def _greedy_agrees(mine: list[int], row: dict) -> bool:
    """Equal to llama.cpp's F32-weights greedy, or to its own greedy up to the first step whose
    margin is below 0.5 (the README's check: the native matmuls round activations as it does)."""
    if mine == row["greedy_fp32_weights"]:
        return True
    for step, (a, b) in enumerate(zip(mine, row["greedy"])):
        if row["greedy_margins"][step] < 0.5:
            return True
        if a != b:
            return False
    return True


@pytest.mark.parametrize("arch", NATIVE_ARCHS)
def test_logits_match_llama_cpp(arch, runners):
    model = runners(arch)
    worst, worst_ratio, checked, as_fp32, rows = 0.0, 0.0, 0, 0, _rows(arch)
    for r, row in enumerate(rows):
        mine = score(model, row["tokens"])
        golden, noise = torch.tensor(row["logits"]), torch.tensor(row["fp32_weights_diff"])
        diff = (mine - golden).abs().amax(dim=-1)
        worst, worst_ratio = max(worst, diff.max().item()), max(worst_ratio, (diff / _bound(noise)).max().item())
        bad = (diff > _bound(noise)).nonzero().flatten().tolist()
        assert not bad, f"{arch} sequence {r}: positions {bad} beyond the bound (max {diff.max():.3f})"
        top2 = golden.topk(2, dim=-1).values
        sure = (top2[:, 0] - top2[:, 1]) > TOP1_MARGIN + noise
        checked += int(sure.sum())
        assert torch.equal(mine.argmax(-1)[sure], golden.argmax(-1)[sure]), f"{arch} sequence {r}: top-1 differs"
        mine_greedy = greedy(model, row["tokens"][: _greedy_prompt_len()], len(row["greedy"]))
        assert _greedy_agrees(mine_greedy, row), f"{arch} sequence {r}: greedy {mine_greedy}, llama.cpp {row['greedy']}"
        as_fp32 += mine_greedy == row["greedy_fp32_weights"]
    print(f"\n{arch} (native): max |logit diff| {worst:.4f}, at most {worst_ratio:.2f} of the bound ({ATOL} + 2 x noise), "
          f"top-1 equal at {checked} sure positions, greedy {len(rows)}/{len(rows)} ({as_fp32} equal to the F32-weights run)")


@pytest.mark.parametrize("arch", NATIVE_ARCHS)
def test_stays_close_to_the_reference_path(arch, runners):
    worst, agree, total = 0.0, 0, 0
    for row in _rows(arch):
        a, b = score(runners(arch), row["tokens"]), score(runners(arch, "reference"), row["tokens"])
        worst = max(worst, (a - b).abs().max().item())
        agree += int((a.argmax(-1) == b.argmax(-1)).sum())
        total += a.shape[0]
    print(f"\n{arch} native vs reference: max |diff| {worst:.3f}, top-1 agreement {agree}/{total}")
    assert worst < NEAR_REFERENCE and agree >= 0.9 * total


@pytest.mark.parametrize("arch", NATIVE_ARCHS)
def test_two_part_evaluations_match_llama_cpp(arch, runners):
    """tokens[:k] then tokens[k:] (state and KV carried): within the bound of llama.cpp's split
    logits, and bit-identical to this runner's own one-pass logits."""
    model = runners(arch)
    n_splits = 0
    for r, row in enumerate(_rows(arch)):
        if not row.get("splits"):
            continue
        one_pass = score(model, row["tokens"])
        noise = torch.tensor(row["fp32_weights_diff"])
        for split in row["splits"]:
            k = split["k"]
            mine = _evaluate_in_parts(model, row["tokens"], [k])[k:]
            diff = (mine - torch.tensor(split["logits"])).abs().amax(dim=-1)
            bad = (diff > _bound(noise[k:]) + torch.tensor(split["diff_vs_one_batch"])).nonzero().flatten().tolist()
            assert not bad, f"{arch} sequence {r} split at {k}: positions {bad} beyond the bound"
            assert torch.equal(mine, one_pass[k:]), f"{arch} sequence {r} split at {k}: not the one-pass logits"
            n_splits += 1
    assert n_splits > 0


@pytest.mark.parametrize("arch", NATIVE_ARCHS)
def test_state_is_computed_one_way_whatever_the_chunking(arch, runners):
    """A 40-token prompt as one chunk, as 3 + 37, and as 40 single-token steps: the recurrent
    state after it, the prompt's last logits, 8 greedy decode steps from there and their logits
    are bit-identical."""
    model = runners(arch)
    ids = _ids(40)
    results = []
    for cuts in ([], [3], list(range(1, 40))):
        state = model.new_state(40 + 8)
        prompt_last = last = _evaluate_in_parts(model, ids, cuts, state=state)[-1]
        snapshot = state.snapshot(0)
        tokens, out = list(ids), []
        for _ in range(8):
            out.append(int(last.argmax()))
            tokens.append(out[-1])
            last = model.run([SequenceChunk(tokens[-1:], len(tokens) - 1, range(len(tokens)))], state)[-1]
        results.append((snapshot, prompt_last, out, last, state.snapshot(0)))
    first = results[0]
    assert first[0].abs().sum() > 0 or not model.state_spec.recurrent  # the state was written
    for cuts, result in zip(("3 + 37", "40 steps"), results[1:]):
        assert torch.equal(result[0], first[0]), f"{cuts}: recurrent state"
        assert torch.equal(result[1], first[1]), f"{cuts}: the prompt's last logits"
        assert result[2] == first[2] and torch.equal(result[3], first[3]), f"{cuts}: the continuation"
        assert torch.equal(result[4], first[4]), f"{cuts}: the state after the continuation"


@pytest.mark.parametrize("arch", NATIVE_ARCHS)
def test_a_follow_up_from_decoded_state_equals_a_fresh_read(arch, runners):
    """Prompt rows and decode rows give the same bits: a prompt, 6 decode steps, then 10 more
    tokens as one chunk, equals the whole as one fresh chunk (state and logits)."""
    model = runners(arch)
    ids = _ids(30, salt=2)
    state = model.new_state(64)
    model.run([SequenceChunk(ids[:14], 0, range(14), state_slot=0)], state)
    for p in range(14, 20):
        model.run([SequenceChunk(ids[p:p + 1], p, range(p + 1))], state)
    resumed = model.run([SequenceChunk(ids[20:], 20, range(30), all_logits=True)], state)
    fresh_state = model.new_state(64)
    fresh = model.run([SequenceChunk(ids, 0, range(30), all_logits=True)], fresh_state)[20:]
    assert torch.equal(resumed, fresh)
    assert torch.equal(state.snapshot(0), fresh_state.snapshot(0))


@pytest.mark.parametrize("arch", NATIVE_ARCHS)
def test_batched_decode_gives_each_sequence_what_it_gets_alone(arch, runners):
    """One decode step over 4 sequences on their own state slots, a prompt chunk beside them:
    each sequence's logits and state bit-identical to its step alone."""
    model = runners(arch)
    seqs = [_ids(n, salt) for salt, n in enumerate([5, 17, 2, 30])]

    def step(group: list[list[int]], with_prompt: bool):
        state = model.new_state(sum(len(s) for s in group) + 12, n_sequences=len(group) + 1)
        chunks, offset = [], 0
        for slot, s in enumerate(group):
            slots = list(range(offset, offset + len(s)))
            model.run([SequenceChunk(s[:-1], 0, slots[:-1], state_slot=slot)], state)
            chunks.append(SequenceChunk(s[-1:], len(s) - 1, slots, state_slot=slot))
            offset += len(s)
        if with_prompt:
            chunks.append(SequenceChunk(_ids(12, 9), 0, range(offset, offset + 12), state_slot=len(group)))
        return model.run(chunks, state), state

    together, state = step(seqs, with_prompt=True)
    for i, s in enumerate(seqs):
        alone, alone_state = step([s], with_prompt=False)
        assert torch.equal(alone[0], together[i]), f"sequence {i}"
        assert torch.equal(alone_state.snapshot(0), state.snapshot(i)), f"sequence {i}: state"


def test_bad_state_slots_are_refused(runners):
    """A chunk that does not continue its slot, or two chunks on one slot: a ValueError naming
    it, and no state written."""
    model = runners(NATIVE_ARCHS[0])
    ids = _ids(10)
    state = model.new_state(32, n_sequences=2)
    model.run([SequenceChunk(ids[:4], 0, range(4), state_slot=0)], state)
    before = state.snapshot(0)
    with pytest.raises(ValueError, match="position 6 on state slot 0, which holds the state after 4 tokens"):
        model.run([SequenceChunk(ids[6:], 6, range(10), state_slot=0)], state)
    with pytest.raises(ValueError, match="two chunks of one step on recurrent state slot 1"):
        model.run([SequenceChunk(ids[:2], 0, range(2), state_slot=1),
                   SequenceChunk(ids[:2], 0, range(16, 18), state_slot=1)], state)
    with pytest.raises(ValueError, match="state slot 5 is outside"):
        model.run([SequenceChunk(ids[:2], 0, range(2), state_slot=5)], state)
    assert torch.equal(state.snapshot(0), before)
