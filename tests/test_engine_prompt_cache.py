"""The host-memory prompt cache (--cache-ram, lamplight.engine.prompt_cache): more cached
conversations than slots, each entry only ever standing for its own tokens, within a budget."""

from __future__ import annotations

import pytest
import torch
from model_helpers import engine_model, runner_for
from tiny_gguf import write_tiny_llama

from lamplight.engine.config import EngineConfig
from lamplight.engine.engine import Engine
from lamplight.engine.types import FinalEvent, GenerationRequest
from lamplight.gguf.file import GGUFFile
from lamplight.native import runtime
from lamplight.sampling import SamplingParams
from lamplight.state.kv_quant import QUANT_TYPES
from lamplight.tokenizer import Tokenizer

GREEDY = SamplingParams(temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module", params=["llama-reference", "llama-native", "qwen35-native"])
def model(request, tmp_path_factory):
    return engine_model(request.param, tmp_path_factory.mktemp("cram"))


def make_engine(model, **cfg) -> Engine:
    runner, tokenizer = model
    settings = {"n_ctx": 512, "n_parallel": 1, "n_ubatch": 64, "cache_ram_mib": 64}
    engine = Engine(runner, tokenizer, EngineConfig(**{**settings, **cfg}))
    engine.start()
    return engine


def tokens(n: int, seed: int) -> list[int]:
    return [3 + (seed * 31 + i * 17) % 240 for i in range(n)]


def run(engine: Engine, prompt: list[int], **fields) -> FinalEvent:
    request = GenerationRequest(prompt, GREEDY, n_predict=6, **fields)
    return next(e for e in engine.submit(request).iter_events(timeout=120) if isinstance(e, FinalEvent))


def test_a_conversation_comes_back_from_ram_with_the_same_tokens(model):
    """One slot, two conversations taking turns: each comes back from RAM (its follow-up reads
    only its new tokens) and answers as an uncached read does."""
    eng = make_engine(model)
    try:
        a, b = tokens(120, 1), tokens(90, 2)
        first_a = run(eng, a)
        run(eng, b)  # takes the slot: a's tokens go to RAM
        follow_up = a + list(first_a.token_ids[:-1]) + tokens(9, 3)
        again = run(eng, follow_up)
        fresh = run(eng, follow_up, cache_prompt=False)
    finally:
        eng.stop()
    assert again.n_cached == len(a) + 5  # everything the slot held for a (its last token never computed)
    assert eng.prompt_cache.hits == 1
    assert again.token_ids == fresh.token_ids


def test_an_entry_stands_only_for_its_own_tokens(model):
    """A prompt that shares 50 tokens with a cached one reuses those 50 (attention-only models)
    or none (a recurrent state cannot be cut back), never more."""
    eng = make_engine(model)
    try:
        shared = tokens(50, 4)
        run(eng, shared + tokens(60, 5))
        run(eng, tokens(80, 6))  # the first goes to RAM
        other = shared + tokens(40, 7)
        reused = run(eng, other)
        fresh = run(eng, other, cache_prompt=False)
    finally:
        eng.stop()
    recurrent = eng.state.recurrent is not None
    assert reused.n_cached == (0 if recurrent else 50)
    assert reused.token_ids == fresh.token_ids


def test_the_budget_holds_and_the_oldest_goes_first(model):
    eng = make_engine(model, cache_ram_mib=1)
    try:
        for seed in range(12):
            run(eng, tokens(400, 20 + seed))
        cache = eng.prompt_cache
        sizes = [entry.bytes for entry in cache.entries.values()]
        assert 0 < sum(sizes) <= 2**20 < sum(sizes) + max(sizes) * 2 and len(sizes) < 11
        held = {key[:400] for key in cache.entries}
        assert tuple(tokens(400, 20)) not in held and tuple(tokens(400, 30)) in held  # the oldest went first
    finally:
        eng.stop()


def test_off_with_zero(model):
    eng = make_engine(model, cache_ram_mib=0)
    try:
        a = tokens(120, 1)
        run(eng, a)
        run(eng, tokens(90, 2))
        assert eng.prompt_cache is None and run(eng, a).n_cached == 0
    finally:
        eng.stop()


def test_room_taken_from_an_idle_slot_keeps_its_tokens_in_ram(model):
    """One pool of 256 tokens for 2 slots: b needs slot 0's blocks, whose tokens go to RAM, and
    come back from there for a's follow-up."""
    eng = make_engine(model, n_ctx=256, n_parallel=2, kv_unified=True)
    try:
        a = tokens(150, 8)
        first = run(eng, a, id_slot=0)
        run(eng, tokens(180, 9), id_slot=1)
        assert eng.slots[0].cached_tokens == []  # the pool took its blocks
        follow_up = a + list(first.token_ids[:-1]) + tokens(5, 10)
        again = run(eng, follow_up, id_slot=0)
    finally:
        eng.stop()
    assert again.n_cached == len(a) + 5 and eng.prompt_cache.hits == 1


@pytest.mark.parametrize("backend", ["reference", "native"])
def test_a_quantized_kv_cache_is_kept_at_its_own_size(backend, tmp_path):
    """-ctk q8_0 -ctv iq4_nl: an entry holds the pool's own bytes (not dequantized floats, 3.8x
    larger), and the conversation back from RAM answers as an uncached read does."""
    if backend == "native" and runtime.library() is None:
        pytest.skip(f"no native library: {runtime.unavailable_reason()}")
    gguf_file = GGUFFile(write_tiny_llama(tmp_path / "tiny.gguf", n_ctx=512, n_embd=128))  # head size 32
    eng = make_engine((runner_for(gguf_file, backend), Tokenizer.from_gguf(gguf_file)),
                      cache_type_k="q8_0", cache_type_v="iq4_nl")
    try:
        a = tokens(120, 1)
        first_a = run(eng, a)
        run(eng, tokens(90, 2))  # a's tokens go to RAM
        (entry,) = eng.prompt_cache.entries.values()
        follow_up = a + list(first_a.token_ids[:-1]) + tokens(9, 3)
        again = run(eng, follow_up)
        fresh = run(eng, follow_up, cache_prompt=False)
    finally:
        eng.stop()
    layout = eng.state.kv.layout
    assert entry.bytes == len(entry.tokens) * layout.bytes_per_token(QUANT_TYPES["q8_0"], QUANT_TYPES["iq4_nl"])
    assert entry.bytes * 3 < len(entry.tokens) * layout.bytes_per_token(torch.float32)
    assert again.n_cached == len(a) + 5 and eng.prompt_cache.hits == 1
    assert again.token_ids == fresh.token_ids
