"""LoRA adapters: scale 0 is the base model, scale 1 equals weights merged by hand."""

from __future__ import annotations

import pytest
import torch
from model_helpers import runner_for
from tiny_gguf import write_tiny_llama, write_tiny_lora

from lamplight.engine.config import EngineConfig
from lamplight.engine.engine import Engine
from lamplight.engine.types import FinalEvent, GenerationRequest, InvalidRequestError
from lamplight.gguf.file import GGUFError, GGUFFile
from lamplight.models.lora import load_lora
from lamplight.runner import greedy, score
from lamplight.sampling import SamplingParams
from lamplight.tokenizer import Tokenizer

TARGETS = {"blk.0.attn_q.weight": (64, 64), "blk.1.ffn_down.weight": (64, 128), "blk.0.ffn_up.weight": (128, 64)}
PROMPT = [40, 50, 60, 70, 80]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("lora")
    return write_tiny_llama(d / "base.gguf"), write_tiny_lora(d / "adapter.gguf", TARGETS, rank=4, alpha=8.0)


def merged_model(base_path, adapter_path, scale):
    model = runner_for(base_path)
    adapter = load_lora(adapter_path, "llama")
    linears = {m.name: m for m in model.model.modules() if hasattr(m, "raw")}
    for name, (a, b) in adapter.weights.items():
        delta = torch.from_numpy(b) @ torch.from_numpy(a)
        linears[name].kernel.weight.add_(scale * (adapter.alpha / a.shape[0]) * delta)
    return model


def run(engine, request):
    return next(e for e in engine.submit(request).iter_events(timeout=60) if isinstance(e, FinalEvent))


def test_scale_zero_is_base_and_one_is_merged(files):
    base_path, adapter_path = files
    base = runner_for(base_path)
    merged = merged_model(base_path, adapter_path, 1.0)
    gguf = GGUFFile(base_path)
    model = runner_for(gguf)
    engine = Engine(model, Tokenizer.from_gguf(gguf), EngineConfig(n_ctx=512, n_parallel=2), loras=[load_lora(adapter_path, "llama")])
    engine.start()
    try:
        greedy_params = SamplingParams(temperature=0, ignore_eos=True)
        off = run(engine, GenerationRequest(PROMPT, greedy_params, n_predict=10, lora=[(0, 0.0)]))
        on = run(engine, GenerationRequest(PROMPT, greedy_params, n_predict=10, lora=[(0, 1.0)]))
        default = run(engine, GenerationRequest(PROMPT, greedy_params, n_predict=10))  # server scale 1
        assert list(off.token_ids) == greedy(base, PROMPT, 10)
        assert list(on.token_ids) == greedy(merged, PROMPT, 10)
        assert on.token_ids != off.token_ids
        assert default.token_ids == on.token_ids
        assert on.n_cached == 0  # the cache of the scale-0 run is not reused under another adapter set
        engine.set_lora_scales([])  # every adapter at 0 for requests that name none
        assert run(engine, GenerationRequest(PROMPT, greedy_params, n_predict=10)).token_ids == off.token_ids
        with pytest.raises(InvalidRequestError):
            engine.submit(GenerationRequest(PROMPT, greedy_params, lora=[(3, 1.0)]))
    finally:
        engine.stop()
    # The logits, not just the argmax, match the merged weights.
    model.lora_scales.scales = [1.0]
    torch.testing.assert_close(score(model, PROMPT), score(merged, PROMPT), atol=1e-4, rtol=1e-4)


def test_adapters_mixed_in_flight_keep_their_own_scales(files):
    base_path, adapter_path = files
    gguf = GGUFFile(base_path)
    engine = Engine(runner_for(gguf), Tokenizer.from_gguf(gguf), EngineConfig(n_ctx=1024, n_parallel=4), loras=[load_lora(adapter_path, "llama")])
    engine.start()
    try:
        params = SamplingParams(temperature=0, ignore_eos=True)
        scales = [0.0, 1.0, 0.5, 0.0]
        alone = [run(engine, GenerationRequest(PROMPT, params, n_predict=8, lora=[(0, s)], cache_prompt=False)).token_ids for s in scales]
        handles = [engine.submit(GenerationRequest(PROMPT, params, n_predict=8, lora=[(0, s)], cache_prompt=False)) for s in scales]
        together = [next(e for e in h.iter_events(timeout=60) if isinstance(e, FinalEvent)).token_ids for h in handles]
        assert together == alone
    finally:
        engine.stop()


def test_bad_adapters_are_rejected(files, tmp_path):
    base_path, _ = files
    with pytest.raises(GGUFError, match="not a LoRA adapter"):
        load_lora(base_path, "llama")
    wrong = write_tiny_lora(tmp_path / "gemma.gguf", TARGETS, arch="gemma3")
    with pytest.raises(GGUFError, match="adapter is for 'gemma3'"):
        load_lora(wrong, "llama")
    bad = write_tiny_lora(tmp_path / "bad.gguf", {"blk.9.attn_q.weight": (64, 64)})
    with pytest.raises(GGUFError, match="blk.9.attn_q.weight"):
        runner_for(base_path).attach_loras([load_lora(bad, "llama")])
