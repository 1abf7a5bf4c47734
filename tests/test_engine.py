"""The engine on a tiny model: batching, prefix reuse, stopping, cancellation, slots, queue."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from model_helpers import paged_state, runner_for
from tiny_gguf import write_tiny_gemma3, write_tiny_llama

from lamplight.engine.config import EngineConfig
from lamplight.engine.engine import Engine
from lamplight.engine.types import (
    ContextExceededError,
    FinalEvent,
    GenerationRequest,
    InvalidRequestError,
    PromptProgress,
    QueueFullError,
    TokenEvent,
)
from lamplight.gguf.file import GGUFFile
from lamplight.runner import greedy
from lamplight.sampling import SamplingParams
from lamplight.tokenizer import Tokenizer

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module", params=["llama", "gemma3", "llama-native", "gemma3-native"])
def tiny(request, tmp_path_factory):
    """Every engine test on both architectures, on the PyTorch reference path and on the native
    forward (packed weights; its f32 KV cache here, as the engine's default)."""
    arch, _, native = request.param.partition("-")
    path = tmp_path_factory.mktemp("tiny") / f"{arch}.gguf"
    (write_tiny_llama if arch == "llama" else write_tiny_gemma3)(path, n_ctx=512)
    gguf = GGUFFile(path)
    if native:
        from lamplight.native import runtime

        if runtime.library() is None:
            pytest.skip(f"no native kernels here: {runtime.unavailable_reason()}")
    return runner_for(gguf, "native" if native else "reference"), Tokenizer.from_gguf(gguf)


def make_engine(tiny, **cfg) -> Engine:
    model, tokenizer = tiny
    engine = Engine(model, tokenizer, EngineConfig(**{"n_ctx": 2048, "n_parallel": 4, **cfg}))
    engine.start()
    return engine


@pytest.fixture
def engine(tiny):
    eng = make_engine(tiny)
    yield eng
    eng.stop()


def run(engine: Engine, request: GenerationRequest) -> tuple[list, list[FinalEvent]]:
    events = list(engine.submit(request).iter_events(timeout=60))
    return events, [e for e in events if isinstance(e, FinalEvent)]


def prompt_ids(tiny, text: str) -> list[int]:
    return tiny[1].encode(text, add_special=True, parse_special=True)


def until_first_eog(tokens: list[int], eog_ids) -> list[int]:
    """`tokens` up to and including the first end-of-generation token: where the engine stops."""
    end = next((i for i, t in enumerate(tokens) if t in eog_ids), len(tokens) - 1)
    return tokens[: end + 1]


PROMPTS = ["the cat sat on", "in the beginning", "hello there", "a b c d e f", "then the", "tea", "ask the", "not in"]


def test_greedy_equals_reference_decoding(tiny, engine):
    model, tokenizer = tiny
    ids = prompt_ids(tiny, "the theater")
    _, (final,) = run(engine, GenerationRequest(ids, GREEDY, n_predict=12, stop=()))
    expected = until_first_eog(greedy(model, ids, 12), tokenizer.eog_ids)
    # Exactly the reference run: cut only where the reference itself emits EOS (an empty or
    # truncated output fails).
    assert list(final.token_ids) == expected
    assert final.stop_type == ("eos" if expected[-1] in tokenizer.eog_ids else "limit")


def test_eight_concurrent_equal_one_by_one(tiny, engine):
    requests = [GenerationRequest(prompt_ids(tiny, p), GREEDY, n_predict=10, cache_prompt=False) for p in PROMPTS]
    alone = [run(engine, r)[1][0].token_ids for r in requests]
    handles = [engine.submit(r) for r in requests]
    together = [[e for e in h.iter_events(timeout=60) if isinstance(e, FinalEvent)][0].token_ids for h in handles]
    assert together == alone


def test_stream_text_equals_final_content(tiny, engine):
    events, (final,) = run(engine, GenerationRequest(prompt_ids(tiny, "the"), GREEDY, n_predict=20))
    streamed = "".join(e.text for e in events if isinstance(e, TokenEvent))
    assert streamed == final.content
    assert final.n_decoded == len(final.token_ids) == len([e for e in events if isinstance(e, TokenEvent)])


def test_stop_string_never_leaks(tiny, engine):
    ids = prompt_ids(tiny, "the cat")
    _, (free,) = run(engine, GenerationRequest(ids, GREEDY, n_predict=24))
    text = free.content
    assert len(text) > 4
    stop = text[2:4]  # a stop string that occurs in the greedy output
    events, (final,) = run(engine, GenerationRequest(ids, GREEDY, n_predict=24, stop=[stop, "never-occurs"]))
    streamed = "".join(e.text for e in events if isinstance(e, TokenEvent))
    assert final.stop_type == "word" and final.stopping_word == stop
    assert final.content == text[: text.index(stop)]
    assert streamed == final.content
    assert stop not in streamed


def test_prefix_cache_reuse(tiny, engine):
    ids = prompt_ids(tiny, "the same long prompt " * 4)
    _, (first,) = run(engine, GenerationRequest(ids, GREEDY, n_predict=4))
    _, (second,) = run(engine, GenerationRequest(ids, GREEDY, n_predict=4))
    assert first.n_cached == 0
    assert second.n_cached == len(ids) - 1  # at least one prompt token is evaluated
    assert second.timings.prompt_n == 1 and second.timings.cache_n + second.timings.prompt_n == len(ids)
    assert second.token_ids == first.token_ids
    _, (uncached,) = run(engine, GenerationRequest(ids, GREEDY, n_predict=4, cache_prompt=False))
    assert uncached.n_cached == 0 and uncached.token_ids == first.token_ids


def test_prompt_only_and_limits(tiny, engine):
    ids = prompt_ids(tiny, "the end")
    events, (final,) = run(engine, GenerationRequest(ids, GREEDY, n_predict=0))
    assert final.content == "" and final.n_decoded == 0 and final.stop_type == "limit"
    assert not [e for e in events if isinstance(e, TokenEvent)]
    _, (final,) = run(engine, GenerationRequest(ids, SamplingParams(temperature=0, ignore_eos=True), n_predict=5))
    assert final.n_decoded == 5 and final.stop_type == "limit" and not final.truncated


def test_full_context_truncates(tiny):
    eng = make_engine(tiny, n_ctx=128, n_parallel=2)  # 64 tokens per slot
    try:
        ids = prompt_ids(tiny, "the " * 20)
        _, (final,) = run(eng, GenerationRequest(ids, SamplingParams(temperature=0, ignore_eos=True), n_predict=-1))
        assert final.truncated and final.stop_type == "limit"
        assert len(ids) + final.n_decoded == eng.n_ctx_slot
        with pytest.raises(ContextExceededError) as err:
            eng.submit(GenerationRequest(list(range(5, 69)), GREEDY))
        assert err.value.n_prompt_tokens == 64 and err.value.n_ctx == 64
    finally:
        eng.stop()


def test_several_choices_share_the_prompt(tiny, engine):
    ids = prompt_ids(tiny, "the cat")
    request = GenerationRequest(ids, SamplingParams(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=7, ignore_eos=True), n_predict=8, n_choices=3)
    _, finals = run(engine, request)
    assert sorted(f.choice for f in finals) == [0, 1, 2]
    assert len({f.token_ids for f in finals}) > 1  # each choice draws its own stream
    _, again = run(engine, request)
    assert {f.choice: f.token_ids for f in again} == {f.choice: f.token_ids for f in finals}


def test_seeded_sampling_is_independent_of_batch(tiny, engine):
    params = SamplingParams(temperature=1.0, seed=1234)
    request = GenerationRequest(prompt_ids(tiny, "the cat"), params, n_predict=12)
    _, (alone,) = run(engine, request)
    others = [engine.submit(GenerationRequest(prompt_ids(tiny, p), SamplingParams(temperature=1.0, seed=i), n_predict=12)) for i, p in enumerate(PROMPTS[:3])]
    _, (busy,) = run(engine, request)
    for h in others:
        list(h.iter_events(timeout=60))
    assert busy.token_ids == alone.token_ids


def test_cancel_frees_the_slot(tiny):
    eng = make_engine(tiny, n_parallel=1, n_ctx=512)
    try:
        handle = eng.submit(GenerationRequest(prompt_ids(tiny, "the"), SamplingParams(temperature=0, ignore_eos=True), n_predict=-1))
        events = handle.iter_events(timeout=60)
        next(e for e in events if isinstance(e, TokenEvent))
        assert not eng.slots[0].is_idle
        handle.cancel()
        deadline = time.time() + 10
        while not eng.slots[0].is_idle and time.time() < deadline:
            time.sleep(0.01)
        assert eng.slots[0].is_idle
        _, (final,) = run(eng, GenerationRequest(prompt_ids(tiny, "next"), GREEDY, n_predict=3))
        assert final.n_decoded >= 1
    finally:
        eng.stop()


def test_queue_full_and_forced_slot(tiny):
    eng = make_engine(tiny, n_parallel=1, n_ctx=512, queue_size=1)
    try:
        long = GenerationRequest(prompt_ids(tiny, "the"), SamplingParams(temperature=0, ignore_eos=True), n_predict=200)
        running = eng.submit(long)
        next(e for e in running.iter_events(timeout=60) if isinstance(e, TokenEvent))
        queued = eng.submit(GenerationRequest(prompt_ids(tiny, "a"), GREEDY, n_predict=2, id_slot=0))
        with pytest.raises(QueueFullError):
            eng.submit(GenerationRequest(prompt_ids(tiny, "b"), GREEDY, n_predict=2))
        running.cancel()
        _, (final,) = [], [e for e in queued.iter_events(timeout=60) if isinstance(e, FinalEvent)]
        assert final.id_slot == 0
        with pytest.raises(InvalidRequestError):
            eng.submit(GenerationRequest(prompt_ids(tiny, "a"), GREEDY, id_slot=3))
    finally:
        eng.stop()


def test_long_prompt_is_chunked_and_reports_progress(tiny):
    eng = make_engine(tiny, n_ubatch=16)
    try:
        ids = prompt_ids(tiny, "the cat sat on the mat " * 6)
        events, (final,) = run(eng, GenerationRequest(ids, GREEDY, n_predict=2, return_progress=True))
        progress = [e for e in events if isinstance(e, PromptProgress)]
        assert progress[0].processed == 0 and progress[-1].processed == len(ids)
        assert [p.processed for p in progress] == sorted(p.processed for p in progress)
        assert len(progress) >= len(ids) // 16
        assert final.n_prompt == len(ids)
    finally:
        eng.stop()


@pytest.mark.parametrize("writer", [write_tiny_llama, write_tiny_gemma3])
def test_shifted_kv_equals_recomputation(writer, tmp_path):
    """Moving cached keys by RoPE re-rotation gives the same next logits as recomputing.

    With one layer K/V depend only on token and position, so the shift must be exact; with more
    layers kept entries still carry the dropped context (as in llama.cpp), so equality would not hold.
    """
    from lamplight.engine.kv_cache import BlockTable
    from lamplight.models.batch import SequenceChunk
    from lamplight.runner import score

    model = runner_for(writer(tmp_path / "one_layer.gguf", n_layers=1, n_ctx=128))
    ids = [(5 * i + 3) % 200 + 10 for i in range(40)]
    state, cache = paged_state(model, num_blocks=8, block_size=8)
    table = BlockTable(cache)
    table.fill_to(39)
    model.run([SequenceChunk(ids[:39], 0, table.slots())], state)
    keep, discard = 4, 17
    import torch

    src = torch.tensor(table.slots(keep + discard, 39))
    dst = torch.tensor(table.slots(keep, 39 - discard))
    model.shift_kv(state, src, dst, -discard)
    table.truncate(39 - discard)
    compact = ids[:keep] + ids[keep + discard :]
    table.fill_to(len(compact))
    out = model.run([SequenceChunk(compact[-1:], len(compact) - 1, table.slots())], state)
    torch.testing.assert_close(out[0], score(model, compact)[-1], atol=2e-4, rtol=1e-4)


def test_context_shift_keeps_generating(tiny):
    eng = make_engine(tiny, n_ctx=128, n_parallel=2, context_shift=True)  # 64 tokens per slot
    try:
        ids = prompt_ids(tiny, "the cat")
        params = SamplingParams(temperature=0, ignore_eos=True)
        events, (final,) = run(eng, GenerationRequest(ids, params, n_predict=150, n_keep=-1))
        assert final.n_decoded == 150 and final.truncated and final.stop_type == "limit"
        streamed = "".join(e.text for e in events if isinstance(e, TokenEvent))
        assert streamed == final.content
        assert final.tokens_cached < eng.n_ctx_slot
    finally:
        eng.stop()


def test_slot_save_restore_continues_identically(tiny, tmp_path):
    from lamplight.engine.slot_files import slot_file_path

    eng = make_engine(tiny, n_parallel=2)
    try:
        ids = prompt_ids(tiny, "the cat sat on the mat")
        params = SamplingParams(temperature=0, ignore_eos=True)
        _, (first,) = run(eng, GenerationRequest(ids, params, n_predict=6, id_slot=1))
        follow_up = ids + list(first.token_ids)
        _, (expected,) = run(eng, GenerationRequest(follow_up, params, n_predict=6, id_slot=0, cache_prompt=False))

        path = slot_file_path(str(tmp_path), "slot1.bin")
        saved = eng.save_slot(1, path)
        assert saved["n_saved"] == first.tokens_cached
        assert eng.erase_slot(1)["n_erased"] == first.tokens_cached
        assert eng.restore_slot(1, path)["n_restored"] == first.tokens_cached
        _, (resumed,) = run(eng, GenerationRequest(follow_up, params, n_predict=6, id_slot=1))
        assert resumed.n_cached == first.tokens_cached
        assert resumed.token_ids == expected.token_ids
        with pytest.raises(InvalidRequestError):
            slot_file_path(str(tmp_path), "../escape.bin")
        with pytest.raises(InvalidRequestError, match="does not exist"):
            eng.restore_slot(0, str(tmp_path / "missing.bin"))
        with pytest.raises(InvalidRequestError, match="does not exist"):
            eng.save_slot(7, str(tmp_path / "x.bin"))
    finally:
        eng.stop()


def test_seeded_sampling_is_the_same_with_a_cached_prefix(tiny, engine):
    params = SamplingParams(temperature=1.0, seed=99)
    ids = prompt_ids(tiny, "the cat sat on the mat")
    _, (first,) = run(engine, GenerationRequest(ids, params, n_predict=12))
    _, (cached,) = run(engine, GenerationRequest(ids, params, n_predict=12))
    assert cached.n_cached == len(ids) - 1
    assert cached.token_ids == first.token_ids


def test_context_shift_honours_n_discard(tiny):
    eng = make_engine(tiny, n_ctx=128, n_parallel=2, context_shift=True)  # 64 tokens per slot
    try:
        ids = prompt_ids(tiny, "the cat")
        params = SamplingParams(temperature=0, ignore_eos=True)
        # n_keep -1 keeps the prompt; dropping 10 per shift leaves 53 after each, so a shift every 10 tokens.
        _, (final,) = run(eng, GenerationRequest(ids, params, n_predict=100, n_keep=-1, n_discard=10))
        assert final.n_decoded == 100 and final.truncated
        assert final.tokens_cached >= eng.n_ctx_slot - 10
    finally:
        eng.stop()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_grammar_constrains_every_choice(tiny, engine, seed):
    import json
    import re

    from lamplight.grammar import GrammarCompiler

    model, tokenizer = tiny
    compiler = GrammarCompiler(tokenizer)
    grammar = compiler.compile_gbnf('root ::= "ab" [0-9]{2,4} ("-" [a-c]{1,3})?')
    params = SamplingParams(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=seed)
    request = GenerationRequest(prompt_ids(tiny, "the"), params, n_predict=40, grammar=grammar, n_choices=2)
    _, finals = run(engine, request)
    for final in finals:
        assert re.fullmatch(r"ab[0-9]{2,4}(-[a-c]{1,3})?", final.content), final.content
        assert final.stop_type == "eos"

    schema = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99}},
              "required": ["a"]}
    request = GenerationRequest(prompt_ids(tiny, "the"), params, n_predict=60, grammar=compiler.compile_json_schema(schema))
    _, (final,) = run(engine, request)
    value = json.loads(final.content)
    assert isinstance(value["a"], int) and 0 <= value["a"] <= 99


def test_slot_is_idle_when_the_final_event_arrives(tiny, engine):
    for _ in range(5):
        handle = engine.submit(GenerationRequest(prompt_ids(tiny, "the"), GREEDY, n_predict=2))
        final = [e for e in handle.iter_events(timeout=60) if isinstance(e, FinalEvent)][0]
        assert engine.slots[final.id_slot].is_idle


def test_kv_cache_that_does_not_fit_is_a_clear_error(tiny, monkeypatch):
    import lamplight.engine.engine as engine_module

    monkeypatch.setattr(engine_module, "available_memory_bytes", lambda device: 1024)
    with pytest.raises(MemoryError, match="lower --ctx-size or --parallel"):
        Engine(tiny[0], tiny[1], EngineConfig(n_ctx=512, n_parallel=2))


def test_half_precision_kv_cache_serves_and_unknown_types_are_refused(tiny):
    eng = make_engine(tiny, cache_type_k="f16", cache_type_v="bf16")
    try:
        kv = eng.state.kv
        assert (kv.k_type.name, kv.v_type.name) == ("f16", "bf16")
        # the native runner's pool is numpy's (bf16 kept as its 16 bits), the PyTorch runners' torch's
        stored = (np.float16, np.uint16) if tiny[0].backend == "native" else (torch.float16, torch.bfloat16)
        assert (kv.k[0].dtype, kv.v[0].dtype) == stored
        _, (final,) = run(eng, GenerationRequest(prompt_ids(tiny, "the cat"), GREEDY, n_predict=6))
        assert final.n_decoded == 6
    finally:
        eng.stop()
    with pytest.raises(ValueError, match="--cache-type-k 'q4_k' is not supported"):
        EngineConfig(cache_type_k="q4_k").validate()
