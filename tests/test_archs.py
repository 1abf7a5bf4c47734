"""Every supported architecture against llama.cpp, and the engine's invariants on each.

The goldens (shared/reference/archs/, see its README.md) are llama.cpp's logits for tiny
random-weight files with an F32 KV cache. lamplight's reference path multiplies dequantized
weights in float32, so it should match llama.cpp's run on the same weights stored as F32
(`fp32_weights_diff` says how far that run is from the golden) and the `llama-f32` control to
~1e-4. Run with -s to see the figures per architecture.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from conftest import load_jsonl, reference_dir
from gguf import GGMLQuantizationType as Q
from gguf import GGUFWriter
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize
from model_helpers import runner_for
from test_engine import test_shifted_kv_equals_recomputation as check_shifted_kv
from test_engine import until_first_eog
from test_models import test_batched_sequences_equal_each_alone as check_batched_equal_alone
from test_models import test_incremental_decode_equals_full_scoring as check_incremental_decode
from tiny_gguf import TINY_ARCHS, write_tiny_arch, write_tiny_gemma3, write_tiny_llama

import lamplight
from lamplight.gguf.file import GGUFError, GGUFFile
from lamplight.gguf.quant import dequantize_mxfp4
from lamplight.models import ARCHITECTURES, define_model
from lamplight.models.layers import Rotary
from lamplight.models.rope import RopeTables
from lamplight.models.rope_scaling import RopeScaling, yarn_corr_dims
from lamplight.runner import greedy, score

GOLDEN_ARCHS = ["llama", "qwen2", "qwen3", "mistral3", "gemma2", "olmo2", "granite", "phi3", "qwen3moe", "gpt-oss"]
ATOL = 0.05  # on top of twice llama.cpp's own quantization noise (README's suggested check)
TOP1_MARGIN = 0.3


def _golden(arch: str) -> tuple[GGUFFile, list[dict]]:
    rows = load_jsonl(f"archs/{arch}.logits.jsonl")
    return GGUFFile(reference_dir() / "archs" / f"{arch}.gguf"), rows


def _greedy_prompt_len() -> int:
    """How many tokens of each sequence the goldens' greedy runs start from (index.json)."""
    return int(json.loads((reference_dir() / "archs" / "index.json").read_text())["greedy_prompt_len"])


def native_or_skip(gguf: GGUFFile):
    """The file's native runner; skipped where there is none (no compiler, or an architecture
    the native forward refuses)."""
    from lamplight.native import runtime
    from lamplight.native.runner import NativeRunner, NativeUnsupported

    lib = runtime.library()
    if lib is None:
        pytest.skip(f"no native kernels here: {runtime.unavailable_reason()}")
    try:
        return NativeRunner(define_model(gguf), lib)
    except NativeUnsupported as exc:
        pytest.skip(f"no native forward for {gguf.architecture}: {exc}")


@pytest.fixture(scope="module")
def golden_models():
    """Each golden file's runner, made once per path: the reference path, or the native forward."""
    cache: dict[tuple[str, str], object] = {}

    def get(arch: str, path: str = "reference"):
        if (arch, path) not in cache:
            gguf, rows = _golden(arch)
            cache[arch, path] = (native_or_skip(gguf) if path == "native" else runner_for(gguf), rows)
        return cache[arch, path]

    return get


ROUTING_TIE = 0.005  # a gap this small between the k-th and the next expert's router probability


def _near_tied_routing(runner, tokens: list[int]) -> torch.Tensor:
    """Per position: whether some MoE layer's expert choice is nearly tied on the reference
    runner's modules (always False for dense models)."""
    from lamplight.models.moe import MoEFeedForward

    tied = torch.zeros(len(tokens), dtype=torch.bool)

    def check(layer, inputs, _output):
        nonlocal tied
        probs = torch.softmax(layer.router(inputs[0]) + (layer.router_bias if layer.router_bias is not None else 0), -1)
        top = probs.topk(layer.n_used + 1, dim=-1).values
        tied |= (top[:, layer.n_used - 1] - top[:, layer.n_used]) < ROUTING_TIE

    hooks = [b.ffn.register_forward_hook(check) for b in runner.model.blocks if isinstance(b.ffn, MoEFeedForward)]
    try:
        score(runner, tokens)
    finally:
        for hook in hooks:
            hook.remove()
    return tied


def _follows_greedy(tokens: list[int], row: dict) -> bool:
    """Equal to llama.cpp's own greedy run up to its first step with a top-1/top-2 margin below
    0.5, where 8-bit activation rounding may pick the other token (the goldens' README)."""
    close = next((i for i, m in enumerate(row["greedy_margins"]) if m < 0.5), len(tokens))
    return tokens[:close] == row["greedy"][:close]


@pytest.mark.parametrize("path", ["reference", "native"])
@pytest.mark.parametrize("arch", GOLDEN_ARCHS)
def test_logits_match_llama_cpp(arch, path, golden_models):
    """The bounds of the goldens' README. The native forward quantizes activations as llama.cpp
    does, so its greedy run may follow llama.cpp's own (`greedy`) instead of the F32-weights one."""
    model, rows = golden_models(arch, path)
    worst, worst_excess, checked, greedy_ok = 0.0, -math.inf, 0, 0
    for r, row in enumerate(rows):
        mine = score(model, row["tokens"])
        golden = torch.tensor(row["logits"])
        noise = torch.tensor(row["fp32_weights_diff"])
        diff = (mine - golden).abs().amax(dim=-1)
        worst = max(worst, diff.max().item())
        worst_excess = max(worst_excess, (diff - noise).max().item())
        beyond = diff > ATOL + 2 * noise
        if path == "native":  # 8-bit activations may flip a near-tied expert choice, as in llama.cpp
            beyond &= ~_near_tied_routing(golden_models(arch)[0], row["tokens"])
        bad = beyond.nonzero().flatten().tolist()
        assert not bad, f"{arch} sequence {r}: positions {bad} beyond the bound (max {diff.max():.3f})"
        top2 = golden.topk(2, dim=-1).values
        sure = (top2[:, 0] - top2[:, 1]) > TOP1_MARGIN + noise
        checked += int(sure.sum())
        assert torch.equal(mine.argmax(-1)[sure], golden.argmax(-1)[sure]), f"{arch} sequence {r}: top-1 differs"
        prompt = row["tokens"][: _greedy_prompt_len()]
        mine_greedy = greedy(model, prompt, len(row["greedy_fp32_weights"]))
        assert mine_greedy == row["greedy_fp32_weights"] or (path == "native" and _follows_greedy(mine_greedy, row)), \
            f"{arch} sequence {r}: greedy"
        greedy_ok += 1
    print(f"\n{arch} ({path}): max |logit diff| {worst:.4f} (bound {ATOL} + 2 x noise; beyond llama.cpp's F32-weights "
          f"run by at most {worst_excess:.5f}), top-1 equal at {checked} sure positions, greedy {greedy_ok}/{len(rows)}")


def test_f32_control_matches_to_1e4():
    gguf, rows = _golden("llama-f32")
    model = runner_for(gguf)
    worst = max((score(model, row["tokens"]) - torch.tensor(row["logits"])).abs().max().item() for row in rows)
    print(f"\nllama-f32 control: max |logit diff| {worst:.2e}")
    assert worst < 2e-4  # the goldens are rounded to 5 decimals


@pytest.mark.parametrize("arch", GOLDEN_ARCHS[1:])
def test_fast_path_agrees_with_reference(arch, golden_models):
    """PyTorch's fast kernels (packed int4, int8 head) stay close to the reference path."""
    reference, rows = golden_models(arch)
    fast = runner_for(_golden(arch)[0], "pytorch")
    worst, agree, total = 0.0, 0, 0
    for row in rows:
        a, b = score(fast, row["tokens"]), score(reference, row["tokens"])
        worst = max(worst, (a - b).abs().max().item())
        agree += int((a.argmax(-1) == b.argmax(-1)).sum())
        total += a.shape[0]
    print(f"\n{arch} fast path: max |diff| vs reference {worst:.3f}, top-1 agreement {agree}/{total}")
    assert worst < 0.6 and agree >= 0.9 * total


# -- tiny generated files: the engine's invariants on every new architecture ------------------------


@pytest.fixture(scope="module", params=sorted(TINY_ARCHS))
def tiny_arch(request, tmp_path_factory):
    path = write_tiny_arch(tmp_path_factory.mktemp("arch") / f"{request.param}.gguf", request.param)
    return path, runner_for(path)


def test_incremental_decode_equals_full_scoring(tiny_arch):
    check_incremental_decode(tiny_arch[1])


def test_batched_sequences_equal_each_alone(tiny_arch):
    """Decode tokens of several sequences in one step give each sequence's logits alone:
    attention, sinks and MoE routing are per token."""
    check_batched_equal_alone(tiny_arch[1])


def test_shifted_kv_equals_recomputation(tiny_arch, tmp_path):
    """Context shift re-rotates cached keys (scaled and partial ropes included) exactly."""
    arch = GGUFFile(tiny_arch[0]).architecture
    check_shifted_kv(lambda path, **kw: write_tiny_arch(path, arch, **kw), tmp_path)


def test_engine_greedy_equals_reference(tiny_arch):
    from lamplight.engine.config import EngineConfig
    from lamplight.engine.engine import Engine
    from lamplight.engine.types import FinalEvent, GenerationRequest
    from lamplight.sampling import SamplingParams
    from lamplight.tokenizer import Tokenizer

    path, model = tiny_arch
    ids = [5, 40, 77, 12, 9]
    engine = Engine(model, Tokenizer.from_gguf(GGUFFile(path)), EngineConfig(n_ctx=256, n_parallel=2))
    engine.start()
    try:
        handles = [engine.submit(GenerationRequest(ids, SamplingParams(temperature=0.0), n_predict=8, stop=())) for _ in range(2)]
        finals = [[e for e in h.iter_events(timeout=60) if isinstance(e, FinalEvent)][0] for h in handles]
    finally:
        engine.stop()
    expected = until_first_eog(greedy(model, ids, 8), engine.tokenizer.eog_ids)
    for final in finals:
        assert list(final.token_ids) == expected  # cut only where the reference emits EOS


def test_fast_load_serves_native_or_falls_back(tiny_arch):
    """The fast backend serves every architecture on the native forward (PyTorch's kernels without
    a compiler); either stays close to the reference path."""
    path, reference = tiny_arch
    loaded = lamplight.load(path, backend="fast")
    assert loaded.runner.backend == "native" or loaded.kernels.startswith("pytorch fast (no C++ compiler")
    ids = list(range(20, 44))
    fast, ref = score(loaded.runner, ids), score(reference, ids)
    assert (fast.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.8
    assert (fast - ref).abs().max() < 0.1 * ref.abs().max() + 0.5


# -- loading rules and the pieces with hand-computed values -----------------------------------------


def test_unsupported_architecture_is_refused_by_name(tmp_path):
    w = GGUFWriter(str(tmp_path / "ds.gguf"), "deepseek2")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((8, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(GGUFError) as exc:
        define_model(GGUFFile(tmp_path / "ds.gguf"))
    message = str(exc.value)
    assert "'deepseek2'" in message and all(arch in message for arch in ARCHITECTURES)


def test_longrope_files_are_refused_clearly(tmp_path):
    path = write_tiny_arch(tmp_path / "phi3.gguf", "phi3")
    gguf = GGUFFile(path)
    gguf.tensors["rope_factors_long.weight"] = gguf.tensors["output_norm.weight"]
    with pytest.raises(GGUFError, match="LongRoPE"):
        define_model(gguf)


def test_mxfp4_dequantizes_like_ggml():
    # One hand-built block: exponent byte 129 -> scale 2^(129 - 128) = 2; nibble 0x7 is 12 (6.0
    # doubled), 0xF is -12, 0x1 is 1 (0.5 doubled); low nibbles are values 0..15, high ones 16..31.
    block = np.zeros((1, 17), dtype=np.uint8)
    block[0, 0] = 129
    block[0, 1] = 0xF7  # value 0: 0x7 -> 24, value 16: 0xF -> -24
    block[0, 2] = 0x01  # value 1: 0x1 -> 2
    values = dequantize_mxfp4(block)[0]
    assert values[0] == 24.0 and values[16] == -24.0 and values[1] == 2.0 and values[2:16].sum() == 0
    data = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32) * 3
    raw = quantize(data, Q.MXFP4)
    np.testing.assert_array_equal(dequantize_mxfp4(raw), gguf_dequantize(raw, Q.MXFP4))


def test_linear_rope_scaling_hand_computed():
    """Linear scaling (factor 4): pair i at position p turns by p / 4 * base^(-2i / n_rot)."""
    rope = Rotary(4, 100.0, 16, neox=False, scaling=RopeScaling("linear", freq_scale=0.25))
    x = torch.tensor([[[1.0, 0.0, 1.0, 0.0]]])
    out = rope(x, rope.angles(torch.tensor([8])))[0, 0]
    # pair 0: angle 8 / 4 * 1 = 2; pair 1: angle 8 / 4 * 100^(-1/2) = 0.2
    expected = torch.tensor([math.cos(2.0), math.sin(2.0), math.cos(0.2), math.sin(0.2)])
    torch.testing.assert_close(out, expected)


def test_yarn_rope_hand_computed():
    """YaRN per ggml: corr dims from beta_fast/slow, pairs below keep their frequency, pairs above
    are interpolated, cos/sin scaled by 1 + 0.1 ln(factor)."""
    n_rot, base, n_ctx_orig = 8, 10000.0, 64
    # corr_dim(b) = 8 ln(64 / (2 pi b)) / (2 ln 10000): b = 32 -> -0.50 (floor -1 -> 0), b = 1 -> 1.01 (ceil 2)
    assert yarn_corr_dims(n_rot, n_ctx_orig, base, 32.0, 1.0) == (0.0, 2.0)
    scaling = RopeScaling("yarn", freq_scale=0.5, n_ctx_orig=n_ctx_orig, ext_factor=1.0)
    rope = Rotary(n_rot, base, 8, neox=True, scaling=scaling)
    mscale = 1 + 0.1 * math.log(2.0)
    ramp = [1.0, 0.5, 0.0, 0.0]  # 1 - (i - 0) / (2 - 0), clamped to [0, 1]
    inv = [base ** (-2 * i / n_rot) for i in range(4)]
    theta = [3 * f * (0.5 * (1 - r) + r) for f, r in zip(inv, ramp)]
    cos, sin, _ = rope.angles(torch.tensor([3]))
    torch.testing.assert_close(cos[0, 0], torch.tensor([mscale * math.cos(t) for t in theta]))
    torch.testing.assert_close(sin[0, 0], torch.tensor([mscale * math.sin(t) for t in theta]))


def test_rope_tables_match_torch_float64_angles():
    """The numpy tables (lamplight.models.rope) against the angles computed in torch's float64,
    as the tables were before: the same float32 values but for a few in a million (numpy's and
    torch's float64 pow, cos and sin differ in rare last bits), those one float32 ulp apart. A
    long YaRN rope with frequency factors; the native forward's tables with the magnitude folded
    in are the float32 products PyTorch's `cos * magnitude` gives."""
    n_rot, base, max_pos, n_ctx_orig = 128, 500000.0, 32768, 8192
    factors = np.linspace(1.0, 8.0, n_rot // 2, dtype=np.float32)
    scaling = RopeScaling("yarn", freq_scale=0.25, n_ctx_orig=n_ctx_orig, ext_factor=1.0)
    tables = RopeTables.compute(n_rot, base, max_pos, factors, scaling)
    inv = 1.0 / (base ** (torch.arange(0, n_rot, 2, dtype=torch.float64) / n_rot)) / torch.from_numpy(factors).double()
    low, high = yarn_corr_dims(n_rot, n_ctx_orig, base, 32.0, 1.0)
    ramp = 1 - ((torch.arange(n_rot // 2, dtype=torch.float64) - low) / max(0.001, high - low)).clamp(0, 1)
    angles = torch.arange(max_pos, dtype=torch.float64)[:, None] * (inv * 0.25 * (1 - ramp) + inv * ramp)[None]
    for ours, theirs in ((tables.cos, angles.cos().float().numpy()), (tables.sin, angles.sin().float().numpy())):
        assert ours.dtype == np.float32 and ours.shape == (max_pos, n_rot // 2)
        assert np.count_nonzero(ours != theirs) <= 1e-5 * ours.size
        assert (np.abs(ours - theirs) <= np.spacing(np.abs(theirs))).all()
    assert tables.magnitude == pytest.approx(1 + 0.1 * math.log(4.0))
    for ours, unit in zip(tables.scaled(), (tables.cos, tables.sin)):
        assert np.array_equal(ours, (torch.from_numpy(unit) * tables.magnitude).numpy())


# -- rope scaling, read by every architecture -------------------------------------------------------

EVERY_ARCH = ["llama", "gemma3", *sorted(TINY_ARCHS)]


def _write_any(arch: str, path, keys: dict | None = None):
    if arch == "mistral3":  # its query temperature needs a length where no YaRN context gives one
        keys = {"attention.temperature_length": 16, **(keys or {})}
    if arch == "llama":
        return write_tiny_llama(path, keys=keys)
    if arch == "gemma3":
        return write_tiny_gemma3(path, keys=keys)
    return write_tiny_arch(path, arch, keys=keys)


@pytest.mark.parametrize("kind", ["linear", "yarn"])
@pytest.mark.parametrize("arch", EVERY_ARCH)
def test_rope_scaling_is_read_by_every_architecture(arch, kind, tmp_path):
    """A file's rope.scaling.* keys change the full-attention layers' rotation (the hand-written
    llama and gemma3 models once ignored them); Gemma 3's local layers keep base 10000 unscaled,
    as llama.cpp's; every backend computes the scaled file alike."""
    keys = {"rope.scaling.type": kind, "rope.scaling.factor": 4.0, "rope.scaling.original_context_length": 64}
    scaled = runner_for(_write_any(arch, tmp_path / "scaled.gguf", keys))
    full = scaled.spec.ropes[0]
    assert full.scaling.kind == kind and full.scaling.freq_scale == 0.25
    if arch == "gemma3":
        local = scaled.spec.ropes[1]
        assert local.base == 10000.0 and local.scaling.kind == "none"
    plain = runner_for(_write_any(arch, tmp_path / "plain.gguf", {"rope.scaling.type": "none"}))
    ids = list(range(20, 60))
    reference, unscaled = score(scaled, ids), score(plain, ids)
    assert not torch.allclose(reference, unscaled, atol=1e-3)
    # The fast backend (native, else PyTorch's) scales alike: it follows the scaled reference,
    # far closer to it than to the unscaled one.
    fast = score(runner_for(tmp_path / "scaled.gguf", "fast"), ids)
    assert (fast.argmax(-1) == reference.argmax(-1)).float().mean() >= 0.8
    assert (fast - reference).abs().mean() < 0.5 * (fast - unscaled).abs().mean()


@pytest.mark.parametrize("arch", EVERY_ARCH)
def test_unknown_rope_scaling_is_refused_by_every_architecture(arch, tmp_path):
    path = _write_any(arch, tmp_path / "m.gguf", {"rope.scaling.type": "longrope", "rope.scaling.factor": 4.0})
    with pytest.raises(GGUFError, match="rope scaling 'longrope' is not supported"):
        define_model(GGUFFile(path))
