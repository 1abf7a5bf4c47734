"""The 2026 hybrid architectures against llama.cpp, on the reference path and the native runner
(lamplight.native), and their recurrent state's invariants on both.

The goldens (shared/reference/archs2/, see its README.md) are llama.cpp's logits for tiny
random-weight qwen35, qwen35moe, lfm2, granitehybrid, gemma4 and smollm3 files, plus, for the
recurrent ones, logits of prompts evaluated in two parts (the recurrent state carried across).
Each backend should sit within the README's bound of llama.cpp's logits at every position:
|mine - golden| <= ATOL + 2 x fp32_weights_diff, top-1 where llama.cpp's margin is clear, greedy
continuations through single-token decode steps; and the reproducibility rule: the recurrent
state after a prompt and the logits from there are bit-identical whatever the chunking, and a
sequence decoded beside others computes what it computes alone. Run with -s to see the figures.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import load_jsonl, reference_dir, reference_path
from gguf import GGMLQuantizationType, GGUFWriter
from model_helpers import runner_for

import lamplight
from lamplight.gguf.file import GGUFError, GGUFFile
from lamplight.models import define_model
from lamplight.models.batch import SequenceChunk
from lamplight.native import runtime
from lamplight.runner import greedy, score

ARCHS = ["qwen35", "qwen35moe", "lfm2", "granitehybrid", "gemma4", "smollm3"]
# The paths checked against the goldens and by the reproducibility rule; PyTorch's fast kernels
# are checked against the reference path only (test_fast_backends_stay_close_to_the_reference).
BACKENDS = ["reference", "native"]
# The reproducibility checks run on every file: gemma4 (shared KV, sliding windows) and smollm3
# (NoPE layers) have attention paths of their own.
ATOL = 0.05  # on top of twice llama.cpp's own quantization noise (the README's suggested check)
TOP1_MARGIN = 0.3
# How close the fast backends' logits stay to the reference path's (float32 on dequantized
# weights): PyTorch's packed int4 with bf16 activations, the native matmuls rounding activations
# as llama.cpp's do.
NEAR_REFERENCE = 0.6


def _path(arch: str):
    return reference_path(f"archs2/{arch}.gguf")


def _rows(arch: str) -> list[dict]:
    return load_jsonl(f"archs2/{arch}.logits.jsonl")


def _greedy_prompt_len() -> int:
    return int(json.loads((reference_dir() / "archs2" / "index.json").read_text())["greedy_prompt_len"])


class Runners:
    """Each (file, backend)'s runner, made once for the module, and the one-pass logits of each
    golden sequence on it, scored once: the goldens' check, the two-part check and the
    comparison with the reference path all read them."""

    def __init__(self):
        self.runners: dict[tuple[str, str], object] = {}
        self.scores: dict[tuple[str, str, int], torch.Tensor] = {}

    def __call__(self, arch: str, backend: str = "reference"):
        if (arch, backend) not in self.runners:
            if backend == "native" and runtime.library() is None:
                pytest.skip(f"no native library: {runtime.unavailable_reason()}")
            self.runners[arch, backend] = runner_for(_path(arch), backend)
        return self.runners[arch, backend]

    def score(self, arch: str, backend: str, r: int) -> torch.Tensor:
        """The logits at every position of golden sequence `r`, one pass from a fresh state."""
        if (arch, backend, r) not in self.scores:
            self.scores[arch, backend, r] = score(self(arch, backend), _rows(arch)[r]["tokens"])
        return self.scores[arch, backend, r]


@pytest.fixture(scope="module")
def runners():
    return Runners()


def _bound(noise: torch.Tensor) -> torch.Tensor:
    return ATOL + 2 * noise


def _same_state(a, b) -> bool:
    """Two recurrent state snapshots equal value for value (as torch.equal): numpy arrays (the
    native runner's state) or tensors (the PyTorch runners')."""
    return np.array_equal(np.asarray(a), np.asarray(b))


def _evaluate_in_parts(runner, tokens: list[int], cuts: list[int], slot: int = 0, state=None) -> torch.Tensor:
    """Logits at every position, the sequence evaluated in chunks split at `cuts` (state carried)."""
    state = state if state is not None else runner.new_state(len(tokens))
    bounds = [0, *cuts, len(tokens)]
    out = [runner.run([SequenceChunk(tokens[a:b], a, range(b), all_logits=True, state_slot=slot)], state)
           for a, b in zip(bounds, bounds[1:])]
    return torch.cat(out)


def _greedy_agrees(mine: list[int], row: dict, backend: str) -> bool:
    """Equal to llama.cpp's F32-weights greedy; on the native runner, whose matmuls round
    activations as llama.cpp's do, equal to llama.cpp's own greedy up to the first step whose
    margin is below 0.5 will do (the README's check)."""
    if mine == row["greedy_fp32_weights"]:
        return True
    if backend == "reference":
        return False
    for step, (a, b) in enumerate(zip(mine, row["greedy"])):
        if row["greedy_margins"][step] < 0.5:
            return True
        if a != b:
            return False
    return True


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", ARCHS)
def test_logits_match_llama_cpp(arch, backend, runners):
    """Every position within the README's bound, top-1 equal where llama.cpp's margin is clear,
    greedy continuations (single-token decode steps) equal to llama.cpp's (_greedy_agrees)."""
    model = runners(arch, backend)
    worst, worst_ratio, checked, as_fp32 = 0.0, 0.0, 0, 0
    rows = _rows(arch)
    for r, row in enumerate(rows):
        mine = runners.score(arch, backend, r)
        golden, noise = torch.tensor(row["logits"]), torch.tensor(row["fp32_weights_diff"])
        diff = (mine - golden).abs().amax(dim=-1)
        worst, worst_ratio = max(worst, diff.max().item()), max(worst_ratio, (diff / _bound(noise)).max().item())
        bad = (diff > _bound(noise)).nonzero().flatten().tolist()
        assert not bad, f"{arch} sequence {r}: positions {bad} beyond the bound (max {diff.max():.3f})"
        top2 = golden.topk(2, dim=-1).values
        sure = (top2[:, 0] - top2[:, 1]) > TOP1_MARGIN + noise
        checked += int(sure.sum())
        assert torch.equal(mine.argmax(-1)[sure], golden.argmax(-1)[sure]), f"{arch} sequence {r}: top-1 differs"
        mine_greedy = greedy(model, row["tokens"][: _greedy_prompt_len()], len(row["greedy_fp32_weights"]))
        assert _greedy_agrees(mine_greedy, row, backend), \
            f"{arch} sequence {r}: greedy {mine_greedy}, llama.cpp {row['greedy']}"
        as_fp32 += mine_greedy == row["greedy_fp32_weights"]
    print(f"\n{arch} ({backend}): max |logit diff| {worst:.4f}, at most {worst_ratio:.2f} of the bound ({ATOL} + 2 x "
          f"noise), top-1 equal at {checked} sure positions, greedy {len(rows)}/{len(rows)} ({as_fp32} equal to the "
          f"F32-weights run)")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", ARCHS)
def test_two_part_evaluations_match_llama_cpp(arch, backend, runners):
    """The goldens' splits (tokens[:k] then tokens[k:], state and KV carried): within the bound of
    llama.cpp's split logits, and bit-identical to this runner's own one-pass logits (the
    reproducibility rule; the README asks an exact engine for ~1e-4)."""
    model = runners(arch, backend)
    n_splits, worst = 0, 0.0
    for r, row in enumerate(_rows(arch)):
        if not row.get("splits"):
            continue
        one_pass = runners.score(arch, backend, r)
        noise = torch.tensor(row["fp32_weights_diff"])
        for split in row["splits"]:
            k = split["k"]
            mine = _evaluate_in_parts(model, row["tokens"], [k])[k:]
            diff = (mine - torch.tensor(split["logits"])).abs().amax(dim=-1)
            bound = _bound(noise[k:]) + torch.tensor(split["diff_vs_one_batch"])
            bad = (diff > bound).nonzero().flatten().tolist()
            assert not bad, f"{arch} sequence {r} split at {k}: positions {bad} beyond the bound"
            own = (mine - one_pass[k:]).abs().max().item()
            assert torch.equal(mine, one_pass[k:]), f"{arch} sequence {r} split at {k}: {own:.2e} from the one-pass logits"
            worst, n_splits = max(worst, diff.max().item()), n_splits + 1
    assert n_splits > 0
    print(f"\n{arch} ({backend}) two-part: {n_splits} splits, max |diff| vs llama.cpp {worst:.4f}, "
          "bit-identical to its own one pass")


@pytest.mark.parametrize("backend", ["pytorch", "native"])
@pytest.mark.parametrize("arch", ARCHS)
def test_fast_backends_stay_close_to_the_reference(arch, backend, runners):
    """PyTorch's fast kernels and the native runner stay close to the reference path, as
    tests/test_archs.py checks for the older architectures."""
    worst, agree, total = 0.0, 0, 0
    for r in range(len(_rows(arch))):
        a, b = runners.score(arch, backend, r), runners.score(arch, "reference", r)
        worst = max(worst, (a - b).abs().max().item())
        agree += int((a.argmax(-1) == b.argmax(-1)).sum())
        total += a.shape[0]
    print(f"\n{arch} {backend} vs reference: max |diff| {worst:.3f}, top-1 agreement {agree}/{total}")
    assert worst < NEAR_REFERENCE and agree >= 0.9 * total


@pytest.mark.parametrize("arch", ARCHS)
def test_fast_backend_serves_the_native_runner(arch, runners):
    runners(arch, "native")  # skipped without the native library
    loaded = lamplight.load(_path(arch), backend="fast")
    assert loaded.runner.backend == "native", loaded.kernels


# -- the recurrent state ----------------------------------------------------------------------------


def _ids(n: int, salt: int = 0) -> list[int]:
    return [0] + [(7 * i + 11 + 13 * salt) % 260 + 3 for i in range(1, n)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", ARCHS)
def test_state_is_computed_one_way_whatever_the_chunking(arch, backend, runners):
    """A 40-token prompt as one chunk, as 3 + 37, and as 40 single-token steps: the recurrent
    state after it, the last position's logits, the greedy continuation from there, its logits
    and the state after it are bit-identical (attention rows too:
    lamplight.models.layers._grouped_attention)."""
    model = runners(arch, backend)
    ids = _ids(40)
    results = []
    for cuts in ([], [3], list(range(1, 40))):
        state = model.new_state(40 + 8)
        prompt_last = last = _evaluate_in_parts(model, ids, cuts, state=state)[-1]
        snapshot = state.snapshot(0)
        tokens, out = list(ids), []
        for _ in range(8):  # greedy, one token per step from the carried state
            out.append(int(last.argmax()))
            tokens.append(out[-1])
            last = model.run([SequenceChunk(tokens[-1:], len(tokens) - 1, range(len(tokens)))], state)[-1]
        results.append((snapshot, prompt_last, out, last, state.snapshot(0)))
    first = results[0]
    assert np.abs(np.asarray(first[0])).sum() > 0 or not model.state_spec.recurrent  # the state was written
    for cuts, result in zip(("3 + 37", "40 steps"), results[1:]):
        assert _same_state(result[0], first[0]), f"{cuts}: recurrent state"
        assert torch.equal(result[1], first[1]), f"{cuts}: the prompt's last logits"
        assert result[2] == first[2] and torch.equal(result[3], first[3]), f"{cuts}: the continuation"
        assert _same_state(result[4], first[4]), f"{cuts}: the state after the continuation"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", ARCHS)
def test_batched_decode_gives_each_sequence_what_it_gets_alone(arch, backend, runners):
    """One decode step over 4 sequences, each on its own state slot, a prompt chunk beside them:
    every sequence's logits and state bit-identical to its step alone."""
    model = runners(arch, backend)
    seqs = [_ids(n, salt) for salt, n in enumerate([5, 17, 2, 30])]

    def step(group: list[list[int]], with_prompt: bool):
        state = model.new_state(sum(len(s) for s in group) + 12, n_sequences=len(group) + 1)
        chunks, offset = [], 0
        for slot, s in enumerate(group):
            slots = list(range(offset, offset + len(s)))
            model.run([SequenceChunk(s[:-1], 0, slots[:-1], state_slot=slot)], state)
            chunks.append(SequenceChunk(s[-1:], len(s) - 1, slots, state_slot=slot))
            offset += len(s)
        if with_prompt:  # a new prompt sharing the step
            chunks.append(SequenceChunk(_ids(12, 9), 0, range(offset, offset + 12), state_slot=len(group)))
        return model.run(chunks, state), state

    together, state = step(seqs, with_prompt=True)
    for i, s in enumerate(seqs):
        alone, alone_state = step([s], with_prompt=False)
        assert torch.equal(alone[0], together[i]), f"sequence {i}"
        assert _same_state(alone_state.snapshot(0), state.snapshot(i)), f"sequence {i}: state"


@pytest.mark.parametrize("arch", ARCHS)
def test_a_follow_up_from_decoded_state_equals_a_fresh_read(arch, runners):
    """On the native runner, prompt rows and decode rows give the same bits: a prompt, 6 decode
    steps, then 10 more tokens as one chunk, equals the whole as one fresh chunk (state and
    logits)."""
    model = runners(arch, "native")
    ids = _ids(30, salt=2)
    state = model.new_state(64)
    model.run([SequenceChunk(ids[:14], 0, range(14), state_slot=0)], state)
    for p in range(14, 20):
        model.run([SequenceChunk(ids[p:p + 1], p, range(p + 1))], state)
    resumed = model.run([SequenceChunk(ids[20:], 20, range(30), all_logits=True)], state)
    fresh_state = model.new_state(64)
    fresh = model.run([SequenceChunk(ids, 0, range(30), all_logits=True)], fresh_state)[20:]
    assert torch.equal(resumed, fresh)
    assert _same_state(state.snapshot(0), fresh_state.snapshot(0))


def test_bad_state_slots_are_refused(runners):
    """On the native runner: a chunk that does not continue its slot, or two chunks on one slot:
    a ValueError naming it, and no state written."""
    model = runners(ARCHS[0], "native")
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
    assert _same_state(state.snapshot(0), before)


def test_copy_snapshot_and_restore_continue_exactly(runners):
    """copy_sequence (n > 1 choices), snapshot / restore (checkpoints): a sequence continued
    from a copied or restored state computes what it computes from its own."""
    model = runners("qwen35")
    ids = _ids(30)
    state = model.new_state(3 * 30, n_sequences=3)
    model.run([SequenceChunk(ids[:20], 0, range(20), state_slot=0)], state)
    checkpoint = state.snapshot(0)
    assert checkpoint.numel() * 4 == model.state_spec.recurrent_bytes_per_sequence()
    state.copy_sequence(0, 1)
    rest = ids[20:]
    expected = model.run([SequenceChunk(rest, 20, range(30), all_logits=True, state_slot=0)], state)
    # slot 1 (a copy) over the same K/V entries; then slot 0 restored from the checkpoint
    copied = model.run([SequenceChunk(rest, 20, range(30), all_logits=True, state_slot=1)], state)
    state.restore(0, checkpoint, 20)
    restored = model.run([SequenceChunk(rest, 20, range(30), all_logits=True, state_slot=0)], state)
    assert torch.equal(copied, expected) and torch.equal(restored, expected)
    with pytest.raises(ValueError, match="position 25 on state slot 2, which holds the state after 0 tokens"):
        model.run([SequenceChunk(ids[25:], 25, range(30), state_slot=2)], state)
    with pytest.raises(ValueError, match="snapshot of 3 floats"):
        state.restore(0, torch.zeros(3), 1)


def test_state_layout(runners):
    """KV only for the layers that keep their own (hybrids: the attention layers; gemma4: not the
    shared ones), one recurrent state per recurrent layer, read from the file's shapes."""
    expected_kv = {"qwen35": 1, "qwen35moe": 1, "lfm2": 2, "granitehybrid": 1, "gemma4": 3, "smollm3": 4}
    for arch, n_kv in expected_kv.items():
        spec = define_model(GGUFFile(_path(arch)))
        state_spec = spec.state_spec
        assert state_spec.kv.num_layers == n_kv, arch
        n_recurrent = sum(layer.recurrent is not None for layer in spec.layers)
        assert len(state_spec.recurrent) == n_recurrent, arch
        state = runner_for(_path(arch)).new_state(16, n_sequences=2)
        assert sum(t.numel() * t.element_size() for t in (*state.kv.k, *state.kv.v)) == 16 * state_spec.bytes_per_token()
        if n_recurrent:
            pool = state.recurrent
            held = sum(t.numel() * 4 for t in pool.history) + sum(t.numel() * 4 for t in pool.matrix if t is not None)
            assert held == 2 * state_spec.recurrent_bytes_per_sequence()
        else:
            assert state.recurrent is None


# -- broken files -----------------------------------------------------------------------------------


def _copy_gguf(src, dst, replace: dict | None = None, drop: tuple[str, ...] = ()):
    """A copy of a GGUF file written with the gguf library, some tensors dropped or replaced by
    float32 arrays."""
    gguf = GGUFFile(src)
    w = GGUFWriter(str(dst), gguf.architecture)
    for key, value in gguf.metadata.items():
        if key in ("general.architecture", "GGUF.version", "general.alignment"):
            continue
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_int32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_array(key, list(value.tolist() if isinstance(value, np.ndarray) else value))
    for name, info in gguf.tensors.items():
        if name in drop:
            continue
        if replace and name in replace:
            w.add_tensor(name, replace[name])
        else:
            w.add_tensor(name, np.asarray(info.data), raw_dtype=GGMLQuantizationType(info.qtype))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def test_a_faithful_copy_loads_alike(tmp_path):
    """The copier itself keeps the model: a check for the broken-file tests below."""
    copy = _copy_gguf(_path("qwen35"), tmp_path / "copy.gguf")
    ids = _ids(12)
    assert torch.equal(score(runner_for(copy), ids), score(runner_for(_path("qwen35")), ids))


@pytest.mark.parametrize("arch,tensor,shape", [
    ("qwen35", "blk.1.ssm_conv1d.weight", (128, 3)),
    ("qwen35", "blk.0.ssm_a", (5,)),
    ("qwen35", "blk.2.attn_qkv.weight", (96, 64)),
    ("lfm2", "blk.3.shortconv.conv.weight", (64, 4)),
    ("lfm2", "blk.0.shortconv.in_proj.weight", (128, 64)),
    ("granitehybrid", "blk.1.ssm_d", (1, 7)),
    ("granitehybrid", "blk.0.ssm_norm.weight", (4, 32)),
    ("granitehybrid", "blk.3.ssm_in.weight", (320, 64)),
])
def test_misshapen_recurrent_tensor_is_refused_by_name(arch, tensor, shape, tmp_path):
    broken = _copy_gguf(_path(arch), tmp_path / "broken.gguf", replace={tensor: np.zeros(shape, dtype=np.float32)})
    with pytest.raises(GGUFError, match=f"tensor {tensor} has shape"):
        lamplight.load(broken)


@pytest.mark.parametrize("arch,tensor", [
    ("qwen35", "blk.0.ssm_beta.weight"), ("qwen35moe", "blk.2.ssm_norm.weight"),
    ("lfm2", "blk.5.shortconv.out_proj.weight"), ("granitehybrid", "blk.0.ssm_conv1d.bias"),
])
def test_missing_recurrent_tensor_is_refused_by_name(arch, tensor, tmp_path):
    broken = _copy_gguf(_path(arch), tmp_path / "broken.gguf", drop=(tensor,))
    with pytest.raises(GGUFError, match=f"tensor {tensor} is missing"):
        lamplight.load(broken)
