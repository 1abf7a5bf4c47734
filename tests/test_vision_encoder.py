"""The vision towers, projectors and prompt layout (lamplight.vision) against llama.cpp's records
(../shared/reference/vision): projector rows (embd/), positions and chunks (chunks.jsonl,
server.jsonl), load-time checks, and the mlp projector's image through SmolLM2 (server.jsonl)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import load_jsonl, reference_path
from gguf import GGUFWriter

from lamplight.gguf.file import GGUFError, GGUFFile
from lamplight.gguf.quant import dequantize
from lamplight.models.batch import SequenceChunk, build_forward_batch
from lamplight.tokenizer import Tokenizer
from lamplight.vision import (EmbeddingRows, TextSegment, assemble_prompt, count_positions,
                              decode_image, flatten_for_batch, load_vision_model)
from lamplight.vision.model import PROJECTOR_KINDS

VISION = reference_path("vision")
INDEX = json.loads((VISION / "index.json").read_text())
IMAGES = [p.name for p in sorted((VISION / "images").iterdir())]
TYPES = sorted(PROJECTOR_KINDS)
MARKER = INDEX["marker"]
# README 6.2: a float32 implementation lands within 4.3e-3 x rms; 1e-2 x rms catches every real mistake.
ROW_BOUND = 1e-2


def mmproj(projector_type: str):
    return VISION / "mmproj" / f"mmproj-{projector_type}.gguf"


@pytest.fixture(scope="module")
def text_models(smollm2_path, gemma3_path, smolvlm_text_model):
    """The text model each projector pairs with; idefics3's is SmolLM2 with SmolVLM's image tokens."""
    return {"idefics3": smolvlm_text_model, "gemma3": gemma3_path, "mlp": smollm2_path}


@pytest.fixture(scope="module")
def paired(text_models):
    """Each projector type's text tokenizer and its projector loaded with it, made once per
    module (reading a 49k-token vocabulary costs more than the checks that use it)."""
    cache: dict[str, tuple[Tokenizer, object]] = {}

    def get(projector_type: str):
        if projector_type not in cache:
            tok = tokenizer_of(text_models[projector_type])
            cache[projector_type] = tok, load_vision_model(mmproj(projector_type), tokenize=text_tokenize(tok))
        return cache[projector_type]

    return get


def tokenizer_of(path) -> Tokenizer:
    return Tokenizer.from_gguf(GGUFFile(path))


def text_tokenize(tok: Tokenizer):
    return lambda text: tok.encode(text, add_special=False, parse_special=True)


def reference_embd(projector_type: str, name: str) -> list[np.ndarray]:
    z = np.load(VISION / "embd" / f"{projector_type}__{name.rsplit('.', 1)[0]}.npz")
    return [z[f"embd_{j}"] for j in range(sum(k.startswith("embd_") for k in z.files))]


def reference_pixels(projector_type: str, name: str) -> list[np.ndarray]:
    z = np.load(VISION / "embd" / f"{projector_type}__{name.rsplit('.', 1)[0]}.npz")
    return [z[f"pixels_{j}"] for j in range(sum(k.startswith("pixels_") for k in z.files))]


@pytest.mark.parametrize("projector_type", TYPES)
def test_projector_rows_within_bound(projector_type):
    """Every projector output row of every image: max |diff| <= 1e-2 x rms of llama.cpp's rows."""
    model = load_vision_model(mmproj(projector_type), text_n_embd=INDEX["text_models"][
        INDEX["types"][projector_type]["text_model"]]["n_embd"])
    worst = 0.0
    for name in IMAGES:
        for j, (pixels, want) in enumerate(zip(reference_pixels(projector_type, name),
                                               reference_embd(projector_type, name))):
            got = model.embed(pixels).numpy()
            assert got.shape == want.shape, (name, j)
            rel = np.abs(got - want).max() / np.sqrt(np.mean(want.astype(np.float64) ** 2))
            worst = max(worst, rel)
            cosine = np.sum(got * want, 1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
            assert cosine.min() > 0.9999, (name, j)
    print(f"{projector_type}: max |diff| / rms = {worst:.5f}, weights {model.weight_bytes} bytes")
    assert worst <= ROW_BOUND


def test_weight_bytes_count_every_loaded_tensor():
    """All tensors of the file, as float32, except LLaVA's last block (in the file, never run)."""
    for projector_type in TYPES:
        model = load_vision_model(mmproj(projector_type))
        gguf = GGUFFile(mmproj(projector_type))
        last = f"v.blk.{model.config.n_layer - 1}."
        skipped = projector_type == "mlp"
        want = sum(4 * int(np.prod(t.shape)) for n, t in gguf.tensors.items() if not (skipped and n.startswith(last)))
        assert model.weight_bytes == want, projector_type


def _chunk_view(segments):
    return [{"type": "text", "tokens": list(s.token_ids)} if isinstance(s, TextSegment)
            else {"type": "image", "n_tokens": s.n_positions, "non_causal": s.non_causal} for s in segments]


def _prompt(model, tok, prompt: str, names: list[str]):
    texts = [text_tokenize(tok)(piece) for piece in prompt.split(MARKER)]
    plans = [model.plan(decode_image((VISION / "images" / n).read_bytes())) for n in names]
    return assemble_prompt(texts, [p.segments for p in plans], tok.bos_id if tok.add_bos else None)


@pytest.mark.real_model
def test_layout_equals_llama_cpp_chunks(paired):
    """chunks.jsonl: for every (type, image) the same text tokens around the same image rows."""
    rows = load_jsonl("vision/chunks.jsonl")
    assert len(rows) == len(TYPES) * len(IMAGES)
    for row in rows:
        tok, model = paired(row["type"])
        segments = _prompt(model, tok, INDEX["prompts"]["completion"], [row["image"]])
        want = [{"type": "text", "tokens": c["tokens"]} if c["type"] == "text"
                else {"type": "image", "n_tokens": c["n_tokens"], "non_causal": c["non_causal"]} for c in row["chunks"]]
        assert _chunk_view(segments) == want, (row["type"], row["image"])
        assert count_positions(segments) == row["positions"]


@pytest.mark.real_model
def test_positions_equal_llama_server(paired):
    """server.jsonl: tokens_evaluated of every /completion with images (one, two, image first)."""
    checked = 0
    for rec in load_jsonl("vision/server.jsonl"):
        if rec.get("endpoint") != "/completion" or rec.get("status") != 200 or "multimodal_data" not in str(rec["request"]):
            continue
        if rec["case"] == "idefics3_with_plain_smollm2" or rec["case"].startswith("default_marker"):
            continue
        prompt = rec["request"]["prompt"]["prompt_string"]
        tok, model = paired(rec["type"])
        segments = _prompt(model, tok, prompt, rec["image"].split("+"))
        assert count_positions(segments) == rec["response"]["tokens_evaluated"], (rec["type"], rec["case"])
        checked += 1
    print(f"{checked} /completion records: positions equal")
    assert checked >= 3 * (len(IMAGES) * 2 + 2)  # completion, precise, image first, two images


@pytest.mark.real_model
def test_idefics3_needs_smolvlm_tokens(smollm2_path):
    """llama.cpp fails every image request on plain SmolLM2 (README 1.1); we refuse at load."""
    tok = tokenizer_of(smollm2_path)
    with pytest.raises(GGUFError, match="no token '<fake_token_around_image>'.*idefics3"):
        load_vision_model(mmproj("idefics3"), tokenize=text_tokenize(tok))


def test_output_width_must_match_the_text_model():
    with pytest.raises(GGUFError, match=r"mismatch between text model \(n_embd = 640\) and mmproj \(output width 576\)"):
        load_vision_model(mmproj("mlp"), text_n_embd=640)
    load_vision_model(mmproj("gemma3"), text_n_embd=640)


def _rewrite(src, dst, drop: str | None = None, set_keys: dict | None = None):
    """A copy of a GGUF (tensors as float32) without tensor `drop`, with `set_keys` changed
    (None: removed)."""
    gguf = GGUFFile(src)
    writer = GGUFWriter(str(dst), arch=gguf.metadata["general.architecture"])
    for key, value in {**gguf.metadata, **(set_keys or {})}.items():
        if key.startswith("GGUF.") or key == "general.architecture" or value is None:
            continue
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        else:
            writer.add_array(key, [float(v) for v in value])
    for name, info in gguf.tensors.items():
        if name != drop:
            writer.add_tensor(name, dequantize(info))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


def test_rewritten_copy_still_loads(tmp_path):
    """The copies below differ from the original only where they are meant to."""
    copy = _rewrite(mmproj("idefics3"), tmp_path / "same.gguf")
    pixels = reference_pixels("idefics3", "square_64.png")[0]
    a, b = load_vision_model(copy).embed(pixels), load_vision_model(mmproj("idefics3")).embed(pixels)
    assert torch.equal(a, b)


@pytest.mark.parametrize("projector_type,tensor", [
    ("idefics3", "mm.model.fc.weight"), ("gemma3", "mm.soft_emb_norm.weight"), ("mlp", "mm.2.weight"),
    ("mlp", "v.class_embd"), ("gemma3", "v.blk.1.attn_k.bias"), ("idefics3", "v.position_embd.weight"),
])
def test_missing_tensor_is_named(tmp_path, projector_type, tensor):
    broken = _rewrite(mmproj(projector_type), tmp_path / "broken.gguf", drop=tensor)
    # Without the class embedding LLaVA's position table has one row too many: named as well.
    with pytest.raises(GGUFError, match=f"tensor ({tensor} is missing|v.position_embd.weight has shape)"):
        load_vision_model(broken)


def test_unknown_projector_type_is_named(tmp_path):
    broken = _rewrite(mmproj("mlp"), tmp_path / "odd.gguf", set_keys={"clip.projector_type": "resampler9"})
    with pytest.raises(GGUFError, match="projector type 'resampler9' is not supported"):
        load_vision_model(broken)


def test_idefics3_without_scale_factor_is_refused(tmp_path):
    key = "clip.vision.projector.scale_factor"
    assert key in GGUFFile(mmproj("idefics3")).metadata
    broken = _rewrite(mmproj("idefics3"), tmp_path / "no_scale.gguf", set_keys={key: None})
    with pytest.raises(GGUFError, match="scale_factor is missing"):
        load_vision_model(broken)


def test_text_model_is_not_a_projector(smollm2_path):
    with pytest.raises(GGUFError, match="not a multimodal projector"):
        load_vision_model(smollm2_path)


@pytest.mark.real_model
def test_encoding_does_not_depend_on_what_else_is_encoded(paired):
    """Reproducibility: an image's rows are the same bits alone, after another image, or again
    (on the module's shared projector, which the tests before have encoded with)."""
    _, model = paired("idefics3")
    first, other = (model.plan(decode_image((VISION / "images" / n).read_bytes())) for n in IMAGES[:2])
    alone = model.encode(first)
    model.encode(other)
    again = model.encode(first)
    rows = lambda enc: [s.embeddings for s in enc.segments if isinstance(s, EmbeddingRows)]  # noqa: E731
    assert all(torch.equal(a, b) for a, b in zip(rows(alone), rows(again)))
    assert alone.content_hash == first.content_hash != other.content_hash
    assert alone.n_positions == first.n_positions


@pytest.fixture(scope="module")
def smollm2_last_logprobs(smollm2_path):
    """The last position's log-probabilities of SmolLM2 on the reference runner (loaded once for
    the images below), with image rows overriding some positions' embeddings, or without any:
    those are worked out once per token sequence (the images of one prompt share them when their
    row counts agree)."""
    from model_helpers import paged_state, runner_for

    runner = runner_for(smollm2_path)
    plain: dict[tuple[int, ...], torch.Tensor] = {}

    def last_logprobs(token_ids: list[int], overrides=None) -> torch.Tensor:
        if overrides is None and tuple(token_ids) in plain:
            return plain[tuple(token_ids)]
        batch = build_forward_batch([SequenceChunk(token_ids, 0, list(range(len(token_ids))))])
        batch.embedding_overrides = overrides
        state, _ = paged_state(runner, num_blocks=4, block_size=32)
        logprobs = torch.log_softmax(runner.run_batch(batch, state)[-1].double(), -1)
        if overrides is None:
            plain[tuple(token_ids)] = logprobs
        return logprobs

    return last_logprobs


@pytest.mark.real_model
@pytest.mark.parametrize("name", IMAGES)
def test_mlp_image_through_smollm2(paired, smollm2_last_logprobs, name):
    """The mlp projector's rows spliced into SmolLM2 (reference runner, float32 KV): the first
    generated step's top-10 log-probabilities against llama-server's precise records (README 6.3:
    its own servers differ by up to 0.34 nats here), top-1 equal where llama.cpp's margin is clear."""
    record = next(r for r in load_jsonl("vision/server.jsonl")
                  if r["type"] == "mlp" and r["case"] == "completion_precise" and r["image"] == name)
    tok, _ = paired("mlp")
    model = load_vision_model(mmproj("mlp"), text_n_embd=576, tokenize=text_tokenize(tok))
    texts = [text_tokenize(tok)(p) for p in record["request"]["prompt"]["prompt_string"].split(MARKER)]
    encoded = model.encode(model.plan(decode_image((VISION / "images" / name).read_bytes())))
    segments = assemble_prompt(texts, [encoded.segments], None)
    token_ids, rows, values = flatten_for_batch(segments, placeholder_id=0)
    assert len(token_ids) == record["response"]["tokens_evaluated"]

    logprobs = smollm2_last_logprobs(token_ids, (torch.tensor(rows), values))

    top = record["response"]["completion_probabilities"][0]["top_logprobs"]
    diffs = [abs(logprobs[t["id"]].item() - t["logprob"]) for t in top]
    print(f"{name}: max |dlogprob| top-10 {max(diffs):.3f}, top-1 {int(logprobs.argmax()) == top[0]['id']}")
    assert max(diffs) < 0.3, diffs
    margin = top[0]["logprob"] - top[1]["logprob"]
    if margin > 0.3:
        assert int(logprobs.argmax()) == top[0]["id"]
    # The image matters: without its rows (placeholder tokens instead) the distribution moves.
    without = smollm2_last_logprobs(token_ids)
    assert max(abs(without[t["id"]].item() - t["logprob"]) for t in top) > max(diffs)
