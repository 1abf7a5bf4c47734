"""`lamplight bench write-model`: random-weight GGUFs of real model shapes (lamplight.bench.random_model,
random_encoder, random_mmproj).

Checked against llama.cpp's own files where they exist: the type mix against a real
llama-quantize Q4_K_M file (gemma-3-270m), the qwen35 layout against
shared/reference/archs2/qwen35.gguf (read back with the gguf library); the small llama files
load in lamplight, their weights have a trained model's spread, and greedy output is ASCII. The
reranker and the vision projector have the key and tensor sets of the reference folders' tiny
llama.cpp files, load in lamplight (scores; an image's rows for SmolLM2), and their full sizes
are the published models'.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys

import gguf
import numpy as np
import pytest
import torch
from conftest import REPO_ROOT, reference_path
from gguf import GGMLQuantizationType as Q
from gguf.constants import MODEL_ARCH, MODEL_TENSORS, TENSOR_NAMES

import lamplight
from lamplight.bench.random_encoder import (ENCODER_SHAPES, encoder_shape_for, planned_encoder_tensors,
                                            write_random_encoder)
from lamplight.bench.random_mmproj import (MMPROJ_FILE_TYPES, mmproj_shape_for, planned_mmproj_tensors,
                                           write_random_mmproj)
from lamplight.bench.random_model import (FILE_TYPES, HEAD_SHRINK, MATRIX_STD, SHAPES, llama3_rope_factors,
                                          planned_tensors, shape_for, tensor_types, write_random_model)
from lamplight.cli import main as lamplight_main
from lamplight.embeddings import Pooling, load_embedder
from lamplight.gguf.file import GGUFFile
from lamplight.gguf.quant import dequantize
from lamplight.runner import greedy, score
from lamplight.tokenizer import Tokenizer
from lamplight.vision import DecodedImage, load_vision_model

# A llama-3.2-1b cut small: 2 layers of 256 wide (a multiple of Q4_K's 256-value blocks).
SMALL = ("n_embd=256", "n_ff=512", "n_head=4", "n_head_kv=2")
PROMPTS = ("The capital of France is", "def fib(n):", "Bonjour, ça va? 日本語 ✓", "1, 2, 3,")


@pytest.fixture(scope="module")
def small_files(tmp_path_factory, smollm2_path) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("random_models")
    return {ft: str(write_random_model("llama-3.2-1b", folder / f"small-{ft}.gguf", ft, seed=1, layers=2,
                                       overrides=SMALL, tokenizer_from=smollm2_path).path)
            for ft in FILE_TYPES}


@pytest.fixture(scope="module")
def small_model(small_files):
    return lamplight.load(small_files["Q4_K_M"], backend="reference")


def _printable_ascii(text: bytes) -> bool:
    return bool(text) and all(0x20 <= b < 0x7F or b in (9, 10) for b in text)


@pytest.fixture(scope="module")
def ascii_rows(smollm2_path) -> torch.Tensor:
    """Which tokens of the (copied) SmolLM2 vocabulary are whole printable ASCII, not control."""
    tokenizer = Tokenizer.from_gguf(GGUFFile(smollm2_path))
    return torch.tensor([_printable_ascii(tokenizer.token_bytes(i)) and not tokenizer.is_control(i)
                         for i in range(tokenizer.vocab_size)])


def test_q4_k_m_types_are_llama_quantizes(gemma3_path):
    """The rule reproduces every tensor type of a file llama-quantize wrote as Q4_K_M (its
    Q6_K/Q4_K layers of attn_v and ffn_down, the fallbacks of 640-wide rows to Q5_0/Q8_0, the
    tied embeddings' Q8_0)."""
    real = GGUFFile(gemma3_path)
    assert real.metadata["general.file_type"] == FILE_TYPES["Q4_K_M"].ftype
    chosen = tensor_types([(name, t.shape) for name, t in real.tensors.items()], "Q4_K_M")
    wrong = {name: (chosen[name].name, t.qtype.name) for name, t in real.tensors.items() if chosen[name] != t.qtype}
    assert not wrong, f"(ours, llama-quantize's): {wrong}"


@pytest.mark.parametrize("file_type", list(FILE_TYPES))
def test_every_type_writes_and_loads(small_files, file_type):
    path = small_files[file_type]
    written = GGUFFile(path)
    plan = planned_tensors(shape_for("llama-3.2-1b", 2, SMALL), 49152)
    expected = tensor_types([(t.name, t.shape) for t in plan], file_type)
    assert {name: t.qtype for name, t in written.tensors.items()} == expected
    assert written.metadata["general.file_type"] == FILE_TYPES[file_type].ftype
    model = lamplight.load(path, backend="reference")
    logits = score(model.runner, model.tokenizer.encode(PROMPTS[0]))
    assert torch.isfinite(logits).all()
    assert 0.1 < float(logits[-1].std()) < 10  # neither vanished nor blown up after the layers


@pytest.mark.parametrize("file_type", ["Q4_K_M", "Q4_0", "Q8_0"])
def test_dequantized_weights_have_a_trained_spread(small_files, ascii_rows, file_type):
    written = GGUFFile(small_files[file_type])
    for name, info in written.tensors.items():
        values = torch.from_numpy(dequantize(info))
        if name == "rope_freqs.weight":
            continue
        if info.qtype == Q.F32:  # norms
            assert abs(float(values.mean()) - 1) < 0.02, name
            continue
        if name == "token_embd.weight":  # the ASCII rows only (the others are shrunk, tested below)
            values = values[ascii_rows]
        assert abs(float(values.std()) / MATRIX_STD - 1) < 0.05, (name, float(values.std()))
        assert abs(float(values.mean())) < 0.05 * MATRIX_STD, (name, float(values.mean()))


def test_greedy_output_is_ascii(small_model):
    for prompt in PROMPTS:
        out = greedy(small_model.runner, small_model.tokenizer.encode(prompt), 12)
        pieces = [small_model.tokenizer.token_bytes(t) for t in out]
        assert all(_printable_ascii(p) for p in pieces), (prompt, pieces)
        small_model.tokenizer.decode(out).encode("ascii")


def test_head_rows_leave_only_ascii_to_pick(small_model, ascii_rows):
    """For any final hidden state the argmax is an ASCII token: the head's other rows are
    shrunk. Without the shrink, random states do pick non-ASCII tokens (so the check has teeth)."""
    head = torch.from_numpy(dequantize(small_model.gguf.tensors["token_embd.weight"]))
    hidden = torch.randn(2000, head.shape[1], generator=torch.Generator().manual_seed(0))
    assert ascii_rows[(hidden @ head.T).argmax(-1)].all()
    unshrunk = torch.where(ascii_rows[:, None], head, head / HEAD_SHRINK)
    assert not ascii_rows[(hidden @ unshrunk.T).argmax(-1)].all()
    row_norms = head.norm(dim=1)
    assert float(row_norms[~ascii_rows].max()) < 2 * HEAD_SHRINK * float(row_norms[ascii_rows].median())


def test_same_seed_gives_the_same_bytes(tmp_path, small_files, smollm2_path):
    again = write_random_model("llama-3.2-1b", tmp_path / "again.gguf", "Q4_K_M", seed=1, layers=2,
                               overrides=SMALL, tokenizer_from=smollm2_path).path
    other = write_random_model("llama-3.2-1b", tmp_path / "other.gguf", "Q4_K_M", seed=2, layers=2,
                               overrides=SMALL, tokenizer_from=smollm2_path).path
    first = open(small_files["Q4_K_M"], "rb").read()
    assert open(again, "rb").read() == first
    assert open(other, "rb").read() != first
    assert len(open(other, "rb").read()) == len(first)


def test_llama3_rope_factors_follow_the_scaling_rule():
    """Llama 3's rope_scaling: pairs turning faster than original_ctx / high_freq_factor keep
    their frequency, slower than original_ctx / low_freq_factor are divided by factor, with a
    monotone ramp between."""
    s = SHAPES["llama-3.2-1b"]
    factor, low, high, original = s.llama3_rope
    factors = llama3_rope_factors(s.head_dim, s.rope_theta, *s.llama3_rope)
    wavelen = 2 * math.pi * s.rope_theta ** (np.arange(0, s.head_dim, 2) / s.head_dim)
    assert factors.shape == (s.head_dim // 2,)
    assert (factors[wavelen < original / high] == 1).all()
    assert (factors[wavelen > original / low] == factor).all()
    assert (np.diff(factors) >= 0).all() and 1 < factors[(wavelen > original / high) & (wavelen < original / low)].min()


# The archs2 file's qwen35 keys -> the shape fields that write them.
QWEN35_FIELDS = {
    "embedding_length": "n_embd", "feed_forward_length": "n_ff", "attention.head_count": "n_head",
    "attention.head_count_kv": "n_head_kv", "attention.key_length": "head_dim", "context_length": "n_ctx",
    "attention.layer_norm_rms_epsilon": "rms_eps", "rope.freq_base": "rope_theta", "rope.dimension_count": "n_rot",
    "rope.dimension_sections": "rope_sections", "full_attention_interval": "full_attention_interval",
    "ssm.conv_kernel": "ssm_conv_kernel", "ssm.state_size": "ssm_state_size", "ssm.group_count": "ssm_group_count",
    "ssm.time_step_rank": "ssm_time_step_rank",
}


def test_qwen35_file_has_the_reference_layout(tmp_path, smollm2_path):
    """At the reference file's sizes (read from it), a qwen3.5 file holds exactly its keys and
    its tensors with its shapes (the vocabulary dimension aside), read back with gguf's reader."""
    ref = GGUFFile(reference_path("archs2/qwen35.gguf"))
    arch_keys = {k[len("qwen35."):]: v for k, v in ref.metadata.items() if k.startswith("qwen35.")}
    overrides = ["tied=0"] + [f"{field}={_override_text(arch_keys[key])}" for key, field in QWEN35_FIELDS.items()]
    path = write_random_model("qwen3.5-0.8b", tmp_path / "qwen35.gguf", "Q8_0", layers=int(arch_keys["block_count"]),
                              overrides=overrides, tokenizer_from=smollm2_path).path
    reader = gguf.GGUFReader(path)
    fields = {name: field for name, field in reader.fields.items() if name.startswith("qwen35.")}
    assert set(fields) == {f"qwen35.{k}" for k in arch_keys}
    for key, value in arch_keys.items():
        if key != "vocab_size":
            read = reader.fields[f"qwen35.{key}"].contents()
            assert np.allclose(read, value, rtol=1e-6), (key, read, value)
    assert reader.fields["qwen35.rope.dimension_sections"].types == [gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.INT32]
    n_vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    ours = {t.name: tuple(int(n) for n in reversed(t.shape)) for t in reader.tensors}
    theirs = {name: tuple(n_vocab if n == ref.metadata["qwen35.vocab_size"] else n for n in t.shape)
              for name, t in ref.tensors.items()}
    assert ours == theirs


def _override_text(value) -> str:
    return ",".join(str(int(v)) for v in value) if isinstance(value, np.ndarray) else str(value)


# Parameters as published, with each model's own vocabulary: Llama 3.2's exact counts; Qwen 3.5's
# nominal sizes include a vision encoder (~0.1B) that these text-only files leave out.
PUBLISHED = {"llama-3.2-1b": (128256, 1_235_814_400, 0.0), "llama-3.2-3b": (128256, 3_212_749_824, 0.0),
             "qwen3.5-0.8b": (248320, 0.8e9, 0.1), "qwen3.5-2b": (248320, 2e9, 0.1)}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_real_shapes_have_the_published_sizes(shape):
    n_vocab, published, tolerance = PUBLISHED[shape]
    s = shape_for(shape)
    plan = planned_tensors(s, n_vocab)
    params = sum(math.prod(t.shape) for t in plan if t.kind != "rope_freqs")
    assert abs(params / published - 1) <= tolerance, params
    if s.arch == "qwen35":  # every tensor is one the gguf library lists for qwen35
        known = {TENSOR_NAMES[t].format(bid=i) for t in MODEL_TENSORS[MODEL_ARCH.QWEN35] for i in range(s.n_layer)}
        assert {t.name.removesuffix(".weight").removesuffix(".bias") for t in plan} <= known
        assert [s.is_recurrent(i) for i in range(s.n_layer)].count(False) == s.n_layer // s.full_attention_interval


def test_command_line(tmp_path, smollm2_path, capsys):
    out = tmp_path / "cli.gguf"
    args = ["bench", "write-model", "llama-3.2-1b", str(out), "--type", "Q8_0", "--layers", "1",
            "--tokenizer-from", str(smollm2_path), *[f"--shape-override={o}" for o in SMALL]]
    assert lamplight_main(args) == 0
    assert "Q8_0" in capsys.readouterr().out
    assert GGUFFile(out).metadata["llama.block_count"] == 1
    assert lamplight_main(["bench", "write-model", "llama-3.2-1b", str(out), "--shape-override", "n_embed=3"]) == 2
    assert "n_embed" in capsys.readouterr().err
    assert lamplight_main(["bench", "write-model", "llama-3.2-1b", str(out), "--shape-override", "n_embd=100",
                           "--type", "Q4_0", "--tokenizer-from", str(smollm2_path)]) == 2
    assert "not a multiple" in capsys.readouterr().err


# -- the encoders (random_encoder.py) and the vision projector (random_mmproj.py) ---------------------

RERANK_DOCS = ["hi", "it is a bear", "the giant panda is a bear species endemic to china"]


def _fields(path) -> dict[str, list[str]]:
    """Every key of a GGUF file with its value types (gguf's reader)."""
    return {name: [t.name for t in field.types] for name, field in gguf.GGUFReader(path).fields.items()}


def _tensor_layout(path) -> dict[str, tuple[int, str]]:
    """Tensor name (blocks as blk.N) -> (dimensions, type)."""
    return {re.sub(r"blk\.\d+\.", "blk.N.", t.name): (len(t.shape), t.tensor_type.name)
            for t in gguf.GGUFReader(path).tensors}


@pytest.fixture(scope="module")
def encoder_files(tmp_path_factory) -> dict[str, str]:
    """bge-reranker-base (F16, Q8_0) and bert-base (F16) at full width, cut to 2 layers."""
    folder = tmp_path_factory.mktemp("random_encoders")
    return {f"{shape}-{ft}": str(write_random_encoder(shape, folder / f"{shape}-{ft}.gguf", ft, seed=3, layers=2).path)
            for shape, ft in [("bge-reranker-base", "F16"), ("bge-reranker-base", "Q8_0"), ("bert-base", "F16")]}


def test_reranker_has_the_reference_rerankers_layout(encoder_files):
    """The keys (with their GGUF types), the tensor names and the vocabulary of llama.cpp's
    converted reranker (shared/reference/embeddings/bert-rerank.gguf), plus the file type; the
    position embeddings and token types stay F32 (llama-quantize leaves them)."""
    reference = reference_path("embeddings/bert-rerank.gguf")
    ours = encoder_files["bge-reranker-base-Q8_0"]
    assert _fields(ours) == {**_fields(reference), "general.file_type": ["UINT32"],
                             "general.quantization_version": ["UINT32"]}
    assert list(_tensor_layout(ours)) == list(_tensor_layout(reference))
    tokens = lambda path: gguf.GGUFReader(path).fields["tokenizer.ggml.tokens"].contents()  # noqa: E731
    assert tokens(ours) == tokens(reference)
    types = {name: t.qtype for name, t in GGUFFile(ours).tensors.items()}
    assert types["position_embd.weight"] == types["token_types.weight"] == Q.F32
    assert types["blk.1.ffn_down.weight"] == types["cls.output.weight"] == types["token_embd.weight"] == Q.Q8_0
    meta = GGUFFile(ours).metadata
    assert (meta["bert.embedding_length"], meta["bert.feed_forward_length"], meta["bert.attention.head_count"],
            meta["bert.context_length"], meta["tokenizer.ggml.token_type_count"]) == (768, 3072, 12, 512, 1)


@pytest.mark.parametrize("file_type", ["F16", "Q8_0"])
def test_reranker_loads_and_scores(encoder_files, file_type):
    """lamplight loads it as a rank model (the file's pooling type, the cls.* head); each document
    gets a finite score of its own."""
    embedder = load_embedder(encoder_files[f"bge-reranker-base-{file_type}"])
    assert embedder.pooling is Pooling.RANK and embedder.has_rank_head
    scores = np.array(embedder.rerank("what is a panda?", RERANK_DOCS))
    assert np.isfinite(scores).all() and np.ptp(scores) > 1e-4 and np.abs(scores).max() < 10, scores


def test_bert_base_embeds_with_cls_pooling(encoder_files):
    path = encoder_files["bert-base-F16"]
    assert not any(name.startswith("cls") for name in GGUFFile(path).tensors)
    embedder = load_embedder(path)
    assert embedder.pooling is Pooling.CLS and not embedder.has_rank_head
    vectors = embedder.embed([embedder.tokenize("hello world"), embedder.tokenize("the cat sat on the mat")])
    assert all(v.shape == (768,) and np.isfinite(v).all() and abs(np.linalg.norm(v) - 1) < 1e-5 for v in vectors)
    assert float(vectors[0] @ vectors[1]) < 0.9999  # different texts, different vectors


# Published parameter counts with each model's real vocabulary: bert-base-uncased's 109,482,240
# less its pooler (768 x 768 + 768, which the converter drops); bge-reranker-base's 278M (XLM-R
# base, 250002 tokens; the converter keeps 512 of its 514 position rows).
ENCODERS_PUBLISHED = {"bert-base": (30522, 109_482_240 - 590_592, 0.0), "bge-reranker-base": (250002, 278e6, 1e-3)}


@pytest.mark.parametrize("shape", list(ENCODER_SHAPES))
def test_encoder_shapes_have_the_published_sizes(shape):
    n_vocab, published, tolerance = ENCODERS_PUBLISHED[shape]
    params = sum(math.prod(t.shape) for t in planned_encoder_tensors(encoder_shape_for(shape), n_vocab))
    assert abs(params / published - 1) <= tolerance, params


@pytest.fixture(scope="module")
def mmproj_files(tmp_path_factory) -> dict[str, str]:
    """siglip-b16-mlp at full width and patch size, cut to 2 blocks and a 64 px image (16 patches)."""
    folder = tmp_path_factory.mktemp("random_mmproj")
    return {ft: str(write_random_mmproj("siglip-b16-mlp", folder / f"mmproj-{ft}.gguf", ft, seed=4, layers=2,
                                        overrides=["image_size=64"]).path) for ft in MMPROJ_FILE_TYPES}


def test_mmproj_has_the_reference_mlp_projectors_layout(mmproj_files):
    """The keys (with their types) and the tensors (dimensions, types) of the tiny mlp projector in
    shared/reference/vision; Q8_0 turns the matrices (not the convolution, not the positions) into Q8_0."""
    reference = reference_path("vision/mmproj/mmproj-mlp.gguf")
    assert _fields(mmproj_files["F16"]) == _fields(reference) == _fields(mmproj_files["Q8_0"])
    assert _tensor_layout(mmproj_files["F16"]) == _tensor_layout(reference)
    q8 = _tensor_layout(mmproj_files["Q8_0"])
    assert {name for name, (_, qtype) in q8.items() if qtype == "F16"} == {"v.patch_embd.weight",
                                                                           "v.position_embd.weight"}
    assert q8["v.blk.N.ffn_down.weight"][1] == q8["mm.2.weight"][1] == "Q8_0"


def test_mmproj_encodes_an_image_for_smollm2(mmproj_files, smollm2_path):
    """Loaded beside the real SmolLM2 (checked against its width, laid out with its tokenizer), a
    small image becomes one row per patch, finite and of the size of token embeddings."""
    text = GGUFFile(smollm2_path)
    tok = Tokenizer.from_gguf(text)
    tokenize = lambda s: tok.encode(s, add_special=False, parse_special=True)  # noqa: E731
    image = DecodedImage.from_pixels(np.random.default_rng(0).integers(0, 256, (30, 40, 3)))
    for file_type, path in mmproj_files.items():
        model = load_vision_model(path, text_n_embd=text.metadata["llama.embedding_length"], tokenize=tokenize)
        (rows,) = model.encode(model.plan(image)).segments
        assert rows.embeddings.shape == (16, 576) and torch.isfinite(rows.embeddings).all()
        assert 0.05 < float(rows.embeddings.square().mean().sqrt()) < 2, file_type


def test_siglip_b16_mlp_has_siglip_b16_and_smollm2_sizes(smollm2_path):
    """At full size: 512 px in 16 px patches (1024 rows out), rows of SmolLM2's width (read from the
    real file), and a ViT-B/16 tower: torchvision's vit_b_16 has 86,567,656 parameters, of which
    its classifier (768 x 1000 + 1000), patch bias and 197 position rows differ from this layout
    (no head, no patch bias, 1025 position rows; its final LayerNorm is this one's pre-LayerNorm)."""
    s = mmproj_shape_for("siglip-b16-mlp")
    assert (s.n_patches, s.text_n_embd) == (1024, GGUFFile(smollm2_path).metadata["llama.embedding_length"])
    plan = planned_mmproj_tensors(s)
    tower = sum(math.prod(t.shape) for t in plan if not t.name.startswith("mm."))
    assert tower == 86_567_656 - (768 * 1000 + 1000) - 768 + (1025 - 197) * 768
    assert [t.shape for t in plan if t.name.startswith("mm.") and t.name.endswith("weight")] == [(576, 768), (576, 576)]


@pytest.mark.parametrize("write, shape", [(write_random_encoder, "bge-reranker-base"),
                                          (write_random_mmproj, "siglip-b16-mlp")])
def test_encoder_and_mmproj_files_are_deterministic(tmp_path, write, shape):
    small = ["n_embd=64", "n_ff=128", "n_head=4"] + (["image_size=64"] if shape == "siglip-b16-mlp" else [])
    data = [open(write(shape, tmp_path / f"{seed}-{i}.gguf", "Q8_0", seed=seed, layers=2, overrides=small).path,
                 "rb").read() for i, seed in enumerate((1, 1, 2))]
    assert data[0] == data[1] != data[2]


def test_command_line_writes_encoders_and_projectors(tmp_path, capsys):
    out = tmp_path / "cli.gguf"
    small = ["--layers", "2", "--shape-override", "n_embd=64", "--shape-override", "n_ff=128",
             "--shape-override", "n_head=4"]
    assert lamplight_main(["bench", "write-model", "bge-reranker-base", str(out), *small]) == 0
    assert "F16" in capsys.readouterr().out  # the encoders' default type
    assert GGUFFile(out).metadata["bert.pooling_type"] == 4
    assert lamplight_main(["bench", "write-model", "siglip-b16-mlp", str(out), *small, "--type", "Q4_0"]) == 2
    assert "choose from F16, Q8_0" in capsys.readouterr().err
    assert lamplight_main(["bench", "write-model", "siglip-b16-mlp", str(out), "--tokenizer-from", "x"]) == 2
    assert "no vocabulary" in capsys.readouterr().err
    assert lamplight_main(["bench", "write-model", "bert-base", str(out), *small, "--shape-override",
                           "pooling=sum"]) == 2
    assert "pooling" in capsys.readouterr().err


def test_an_encoder_step_reuses_its_buffers(encoder_files):
    """A 4000-token step's FFN rows are 47 MiB: allocated afresh (mmap) each time, every page of
    them faults and is zeroed again at each step; the encoder keeps freed blocks in the heap
    (lamplight.heap.keep_freed_buffers), so a repeated step pages in next to nothing. The Q8_0 file's
    linears run on the native integer kernels, the F16 file's on the native float32 ones. Measured
    in a fresh interpreter: in this one, what earlier tests left running (an engine's idle trim,
    other threads' allocations) can page in a buffer of their own between the two steps."""
    script = _ENCODER_REUSE_SCRIPT.format(q8=str(encoder_files["bge-reranker-base-Q8_0"]),
                                          f16=str(encoder_files["bge-reranker-base-F16"]))
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                            cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert result.returncode == 0, result.stderr[-3000:]
    kernels_q8, kernels_f16, faults, same = result.stdout.strip().splitlines()
    assert kernels_q8.startswith("native") and "Q8_0 weights" in kernels_q8
    assert kernels_f16.startswith("native") and "F16 weights" in kernels_f16 and "pytorch" not in kernels_f16
    # fewer pages than one fresh 47 MiB tensor has (12,000; about 55,000 a step without): 0-3 measured.
    # The least of three repeated steps: now and then the second call grows the heap once more
    # (16,000-21,000 faults, about 64 MB, on the main thread) and the calls after it pay none;
    # which allocation moves is not known. Without the heap's keeping every step faults (48,101 least).
    assert int(faults) < 1000
    assert same == "True"


_ENCODER_REUSE_SCRIPT = """
import resource
import numpy as np
from lamplight.embeddings import load_embedder
embedder = load_embedder({q8!r}, backend="fast")
print(embedder.kernels)
print(load_embedder({f16!r}, backend="fast").kernels)
rng = np.random.default_rng(0)
inputs = [[int(t) for t in rng.integers(5, embedder.body.vocab_size, size=400)] for _ in range(10)]
first = embedder.rank(inputs)
counts, same = [], True
for _ in range(3):
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    again = embedder.rank(inputs)
    counts.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults)
    same = same and np.array_equal(np.asarray(first), np.asarray(again))
print(min(counts))
print(same)
"""
