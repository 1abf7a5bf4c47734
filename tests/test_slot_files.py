"""Slot files (POST /slots/{id}?action=save|restore): version 2 is numpy, so a native engine saves
and restores a slot without torch, bit for bit; files of the torch.save format (version 1) and
files saved under other KV types are still restored, through PyTorch's codecs."""

from __future__ import annotations

import json
import zipfile

import numpy as np
import pytest
import torch
from conftest import reference_dir
from no_torch import printed, run_script
from tiny_gguf import write_tiny_llama

import lamplight
from lamplight.engine.config import EngineConfig
from lamplight.engine.engine import Engine
from lamplight.engine.slot_files import FORMAT, load_slot
from lamplight.engine.types import FinalEvent, GenerationRequest, InvalidRequestError
from lamplight.native import runtime
from lamplight.sampling import SamplingParams
from lamplight.state.torch_pools import torch_view

GREEDY = SamplingParams(temperature=0.0, ignore_eos=True)

# Each case: a request fills slot 1, the slot is saved, erased and overwritten by another request,
# restored, then continued; the continuation must equal the same prompt computed from scratch in
# slot 0, and reuse every restored token.
SCRIPT = """
import json, zipfile

import numpy as np

import lamplight
from lamplight.engine.config import EngineConfig
from lamplight.engine.engine import Engine
from lamplight.engine.types import FinalEvent, GenerationRequest
from lamplight.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0, ignore_eos=True)


def tokens(n, seed):
    return [3 + (seed * 31 + i * 17) % 240 for i in range(n)]


def final(engine, request):
    return next(e for e in engine.submit(request).iter_events(timeout=120) if isinstance(e, FinalEvent))


def round_trip(model, config, path):
    engine = Engine(model.runner, model.tokenizer, config)
    engine.start()
    try:
        prompt = tokens(40, 1)
        first = final(engine, GenerationRequest(prompt, GREEDY, n_predict=6, id_slot=1))
        follow_up = prompt + list(first.token_ids) + tokens(5, 2)
        expected = final(engine, GenerationRequest(follow_up, GREEDY, n_predict=8, id_slot=0, cache_prompt=False))
        saved = engine.save_slot(1, path)
        engine.erase_slot(1)
        final(engine, GenerationRequest(tokens(30, 3), GREEDY, n_predict=4, id_slot=1))  # the slot overwritten
        restored = engine.restore_slot(1, path)
        resumed = final(engine, GenerationRequest(follow_up, GREEDY, n_predict=8, id_slot=1))
        with np.load(path, allow_pickle=False) as archive:
            header = json.loads(archive["header"].tobytes().decode())
            stored = str(archive["k0"].dtype)
        return dict(saved=saved["n_saved"], restored=restored["n_restored"], first=first.tokens_cached,
                    cached=resumed.n_cached, same=list(resumed.token_ids) == list(expected.token_ids),
                    version=header["version"], types=[header["k_type"], header["v_type"]], stored=stored,
                    recurrent="recurrent.npy" in zipfile.ZipFile(path).namelist())
    finally:
        engine.stop()


results = {{}}
llama = lamplight.load({llama!r}, backend="native")
for kind in ("f16", "q8_0", "bf16"):
    results[kind] = round_trip(llama, EngineConfig(n_ctx=512, n_parallel=2, cache_type_k=kind, cache_type_v=kind),
                               {tmp!r} + "/llama-" + kind + ".slot")
hybrid = lamplight.load({hybrid!r}, backend="native")
results["lfm2"] = round_trip(hybrid, EngineConfig(n_ctx=512, n_parallel=2), {tmp!r} + "/lfm2.slot")
from lamplight.engine.slot_files import load_slot
from lamplight.engine.types import InvalidRequestError
with open({tmp!r} + "/garbage.slot", "wb") as f:
    f.write(b"not a slot file")
try:
    load_slot({tmp!r} + "/garbage.slot", "any model", 512)
except InvalidRequestError as exc:
    results["garbage"] = str(exc)
print("RESULTS", json.dumps(results))
print("TORCH_LOADED", "torch" in sys.modules)
"""


@pytest.fixture(scope="module")
def llama_file(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("slot_files") / "tiny.gguf", n_ctx=512, n_embd=128)


@pytest.fixture(scope="module")
def native_llama(llama_file):
    if runtime.library() is None:
        pytest.skip(f"no native library here: {runtime.unavailable_reason()}")
    return lamplight.load(str(llama_file), backend="native")


def test_native_slots_are_saved_and_restored_without_torch(llama_file, tmp_path):
    if runtime.library() is None:
        pytest.skip(f"no native library here: {runtime.unavailable_reason()}")
    hybrid = reference_dir() / "archs2" / "lfm2.gguf"
    if not hybrid.is_file():
        pytest.skip(f"no hybrid reference model at {hybrid}")
    out = run_script(SCRIPT.format(llama=str(llama_file), hybrid=str(hybrid), tmp=str(tmp_path)), timeout=600)
    assert out.returncode == 0, out.stderr
    lines = printed(out)
    assert lines["TORCH_LOADED"] == "False"
    results = json.loads(lines["RESULTS"])
    for case, stored in (("f16", "float16"), ("q8_0", "uint8"), ("bf16", "uint16"), ("lfm2", "float32")):
        r = results[case]
        assert r["same"], case  # the restored slot continues as a fresh computation does
        assert r["saved"] == r["restored"] == r["first"] and r["cached"] == r["first"], case
        assert r["version"] == 2 and r["stored"] == stored, case  # the pool's own rows, at its type's size
    assert results["lfm2"]["recurrent"] and not results["f16"]["recurrent"]
    assert "not a lamplight slot file" in results["garbage"]  # refused before torch could be asked


def engine_for(model, **config) -> Engine:
    engine = Engine(model.runner, model.tokenizer, EngineConfig(**{"n_ctx": 512, "n_parallel": 2, **config}))
    engine.start()
    return engine


def final(engine, request):
    return next(e for e in engine.submit(request).iter_events(timeout=120) if isinstance(e, FinalEvent))


PROMPT = [3 + (i * 17) % 240 for i in range(40)]


def filled_slot(engine) -> tuple[list[int], FinalEvent]:
    """Slot 1 after a request, the follow-up prompt and what it gives computed from scratch in slot 0."""
    first = final(engine, GenerationRequest(PROMPT, GREEDY, n_predict=6, id_slot=1))
    follow_up = PROMPT + list(first.token_ids) + [9, 10, 11]
    return follow_up, final(engine, GenerationRequest(follow_up, GREEDY, n_predict=8, id_slot=0, cache_prompt=False))


def overwrite_and_restore(engine, path: str, n: int, follow_up: list[int], expected: FinalEvent) -> list:
    """Slot 1 erased and overwritten by another request, then `path` restored into it: its pool
    rows afterwards. The restored slot must continue as the fresh computation `expected` did."""
    engine.erase_slot(1)
    final(engine, GenerationRequest(PROMPT[::-1], GREEDY, n_predict=4, id_slot=1))
    assert engine.restore_slot(1, path)["n_restored"] == n
    rows = pool_rows(engine, 1, n)
    resumed = final(engine, GenerationRequest(follow_up, GREEDY, n_predict=8, id_slot=1))
    assert resumed.n_cached == n and resumed.token_ids == expected.token_ids
    return rows


def pool_rows(engine, slot_id: int, n: int) -> list[np.ndarray]:
    pool, slots = engine.cache.pool, engine.slots[slot_id].table.slots(0, n)
    return [rows for layer in range(len(pool.k)) for rows in pool.read_stored(layer, slots)]


def test_a_slot_saved_under_another_kv_type_is_converted(native_llama, tmp_path):
    """f32 rows restored into an f16 pool are their fp16 roundings, bit for bit; the first layer's
    are the rows the f16 engine computes itself (later layers differ: they attend to the cache)."""
    path = str(tmp_path / "f32.slot")
    source = engine_for(native_llama)  # f32 KV, the engine's default
    try:
        final(source, GenerationRequest(PROMPT, GREEDY, n_predict=6, id_slot=1))
        n = len(source.slots[1].cached_tokens)
        saved_rows = pool_rows(source, 1, n)
        source.save_slot(1, path)
    finally:
        source.stop()
    target = engine_for(native_llama, cache_type_k="f16", cache_type_v="f16")
    try:
        follow_up, _ = filled_slot(target)
        assert len(target.slots[1].cached_tokens) == n
        own = pool_rows(target, 1, n)
        target.erase_slot(1)
        assert target.restore_slot(1, path)["n_restored"] == n
        restored = pool_rows(target, 1, n)
        assert all(r.dtype == np.float16 and np.array_equal(r, s.astype(np.float16)) for r, s in zip(restored, saved_rows))
        assert np.array_equal(restored[0], own[0]) and np.array_equal(restored[1], own[1])  # layer 0's K and V
        resumed = final(target, GenerationRequest(follow_up, GREEDY, n_predict=8, id_slot=1))
        assert resumed.n_cached == n and len(resumed.token_ids) == 8
    finally:
        target.stop()


def test_version_1_files_are_still_restored(native_llama, tmp_path):
    """A torch.save dictionary of float rows (what lamplight wrote before version 2)."""
    path = str(tmp_path / "v1.slot")
    engine = engine_for(native_llama, cache_type_k="q8_0", cache_type_v="q8_0")
    try:
        follow_up, expected = filled_slot(engine)
        slot = engine.slots[1]
        pool = torch_view(engine.cache.pool)
        index = torch.tensor(slot.table.slots(0, len(slot.cached_tokens)), dtype=torch.long)
        layers = [pool.read(layer, index) for layer in range(len(pool.k))]
        torch.save({"format": FORMAT, "version": 1, "model": engine.fingerprint, "tokens": list(slot.cached_tokens),
                    "lora": list(slot.cached_lora), "k": [k for k, _ in layers], "v": [v for _, v in layers]}, path)
        n = len(slot.cached_tokens)
        own = pool_rows(engine, 1, n)
        restored = overwrite_and_restore(engine, path, n, follow_up, expected)
        # q8_0 of the dequantized rows is the same bytes (requantizing a q8_0 block is exact here)
        assert all(np.array_equal(a, b) for a, b in zip(restored, own))
    finally:
        engine.stop()


def test_bad_slot_files_are_refused(native_llama, tmp_path):
    engine = engine_for(native_llama)
    try:
        final(engine, GenerationRequest(PROMPT, GREEDY, n_predict=2, id_slot=1))
        good = str(tmp_path / "good.slot")
        engine.save_slot(1, good)
        with np.load(good, allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
        header = json.loads(arrays["header"].tobytes().decode())

        def variant(name: str, **changes) -> str:
            path = str(tmp_path / name)
            with open(path, "wb") as f:
                np.savez(f, **{**arrays, "header": np.frombuffer(json.dumps({**header, **changes}).encode(), np.uint8)})
            return path

        fingerprint, n_ctx = engine.fingerprint, engine.n_ctx_slot
        with pytest.raises(InvalidRequestError, match="another model"):
            load_slot(variant("model.slot", model="other"), fingerprint, n_ctx)
        with pytest.raises(InvalidRequestError, match="unknown"):
            load_slot(variant("type.slot", k_type="q9_9"), fingerprint, n_ctx)
        with pytest.raises(InvalidRequestError, match="not a lamplight slot file"):
            load_slot(variant("version.slot", version=7), fingerprint, n_ctx)
        with pytest.raises(InvalidRequestError, match="layers"):
            engine.restore_slot(1, variant("fewer.slot", layers=header["layers"] - 1))
        with pytest.raises(InvalidRequestError, match="layers"):
            load_slot(variant("more.slot", layers=header["layers"] + 1), fingerprint, n_ctx)
        with pytest.raises(InvalidRequestError, match="more than a slot"):
            load_slot(variant("long.slot", tokens=[1] * (n_ctx + 1)), fingerprint, n_ctx)
        with pytest.raises(InvalidRequestError, match="malformed"):
            load_slot(variant("tokens.slot", tokens="abc"), fingerprint, n_ctx)
        wrong_rows = str(tmp_path / "rows.slot")
        with open(wrong_rows, "wb") as f:
            np.savez(f, **{**arrays, "k0": arrays["k0"][:, :-1]})
        with pytest.raises(InvalidRequestError, match="layer 0 K/V"):
            engine.restore_slot(1, wrong_rows)
        garbage = tmp_path / "garbage.slot"
        garbage.write_bytes(b"not a slot file at all")
        with pytest.raises(InvalidRequestError, match="not a lamplight slot file"):  # refused without torch
            load_slot(str(garbage), fingerprint, n_ctx)
        with zipfile.ZipFile(tmp_path / "other.zip", "w") as z:
            z.writestr("x.npy", b"")
        with pytest.raises(InvalidRequestError, match="cannot be read|not a lamplight slot file"):
            load_slot(str(tmp_path / "other.zip"), fingerprint, n_ctx)
        # the engine still serves, and the good file still restores
        assert engine.restore_slot(1, good)["n_restored"] == len(header["tokens"])
    finally:
        engine.stop()


@pytest.mark.parametrize("kind", ["bf16", "q4_0"])
def test_pytorch_pools_save_and_restore_their_own_rows(llama_file, tmp_path, kind):
    """A PyTorch runner's pool (tensors: bf16 as torch.bfloat16, a quantized type as bytes) goes
    through the same numpy file and comes back to the bit."""
    model = lamplight.load(str(llama_file), backend="reference")
    engine = engine_for(model, cache_type_k=kind, cache_type_v=kind)
    try:
        follow_up, expected = filled_slot(engine)
        n = len(engine.slots[1].cached_tokens)
        own = [r.clone() for r in pool_rows(engine, 1, n)]
        path = str(tmp_path / f"{kind}.slot")
        engine.save_slot(1, path)
        with np.load(path, allow_pickle=False) as archive:
            assert archive["k0"].dtype == (np.uint16 if kind == "bf16" else np.uint8)
        restored = overwrite_and_restore(engine, path, n, follow_up, expected)
        assert all(torch.equal(a, b) for a, b in zip(restored, own))
    finally:
        engine.stop()
