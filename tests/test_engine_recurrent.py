"""The engine on hybrid models (recurrent layers beside attention): per-slot recurrent state,
checkpoints for follow-up turns, n > 1 choices, batching, slot files, and the reproducibility rule
(a request's tokens do not depend on whether its prefix was cached, nor on chunk boundaries).

Runs on the tiny random-weight files of ../shared/reference/archs2 (llama.cpp's own test set for
these architectures), on the PyTorch reference path and, for the architectures it computes, the
native runner.
"""

from __future__ import annotations

import pytest
from conftest import reference_path

from lamplight.engine.config import EngineConfig
from lamplight.engine.engine import Engine
from lamplight.engine.types import FinalEvent, GenerationRequest
from lamplight.gguf.file import GGUFFile
from lamplight.loader import build_runner
from lamplight.models import define_model
from lamplight.native import runtime
from lamplight.sampling import SamplingParams
from lamplight.tokenizer import Tokenizer

HYBRIDS = ["qwen35", "lfm2", "granitehybrid"]
BACKENDS = [(arch, backend) for backend in ("reference", "native") for arch in HYBRIDS]
GREEDY = SamplingParams(temperature=0.0, ignore_eos=True)
INTERVAL = 16  # checkpoint positions here: multiples of 16


@pytest.fixture(scope="module", params=BACKENDS, ids="-".join)
def hybrid(request):
    arch, backend = request.param
    if backend == "native" and runtime.library() is None:
        pytest.skip(f"no native library: {runtime.unavailable_reason()}")
    path = reference_path(f"archs2/{arch}.gguf")
    gguf = GGUFFile(path)
    return build_runner(define_model(gguf), backend), Tokenizer.from_gguf(gguf)


def make_engine(hybrid, **cfg) -> Engine:
    runner, tokenizer = hybrid
    settings = {"n_ctx": 512, "n_parallel": 2, "n_ubatch": 40, "checkpoint_interval": INTERVAL, "ctx_checkpoints": 4}
    engine = Engine(runner, tokenizer, EngineConfig(**{**settings, **cfg}))
    engine.start()
    return engine


@pytest.fixture
def engine(hybrid):
    eng = make_engine(hybrid)
    yield eng
    eng.stop()


def run(engine: Engine, request: GenerationRequest) -> FinalEvent:
    events = list(engine.submit(request).iter_events(timeout=120))
    finals = [e for e in events if isinstance(e, FinalEvent)]
    assert len(finals) == 1, events
    return finals[0]


def tokens(n: int, seed: int) -> list[int]:
    """A prompt of `n` ids from the tiny vocabulary (ids 3..250: no special tokens)."""
    return [3 + (seed * 31 + i * 17) % 247 for i in range(n)]


def test_follow_up_turn_resumes_from_its_live_state(engine):
    first_prompt = tokens(37, 1)
    first = run(engine, GenerationRequest(first_prompt, GREEDY, n_predict=8, id_slot=0))
    follow_up = first_prompt + list(first.token_ids) + tokens(9, 2)
    second = run(engine, GenerationRequest(follow_up, GREEDY, n_predict=8, id_slot=0))
    fresh = run(engine, GenerationRequest(follow_up, GREEDY, n_predict=8, id_slot=1, cache_prompt=False))
    assert second.n_cached == first.tokens_cached == len(first_prompt) + 7  # everything the slot held
    assert fresh.n_cached == 0
    assert second.token_ids == fresh.token_ids


def test_diverging_follow_up_resumes_from_the_last_checkpoint_inside_its_prefix(engine):
    """A turn whose prefix diverges inside the previous reply (a template that strips the reply's
    thinking, an edited message) re-reads at most INTERVAL - 1 tokens of that prefix."""
    first_prompt = tokens(45, 3)
    first = run(engine, GenerationRequest(first_prompt, GREEDY, n_predict=12, id_slot=0))
    common = len(first_prompt) + 5
    history = first_prompt + list(first.token_ids)
    follow_up = history[:common] + [t for t in tokens(11, 4) if t != history[common]]
    second = run(engine, GenerationRequest(follow_up, GREEDY, n_predict=8, id_slot=0))
    fresh = run(engine, GenerationRequest(follow_up, GREEDY, n_predict=8, id_slot=1, cache_prompt=False))
    assert second.n_cached == common // INTERVAL * INTERVAL  # 48: the checkpoint inside the prefix
    assert common - second.n_cached < INTERVAL
    assert second.token_ids == fresh.token_ids


def test_checkpoints_in_generated_text_serve_an_edited_reply(engine):
    prompt = tokens(10, 5)
    first = run(engine, GenerationRequest(prompt, GREEDY, n_predict=30, id_slot=0))
    history = prompt + list(first.token_ids)
    follow_up = history[:35] + [t for t in tokens(6, 6) if t != history[35]]  # the reply edited after its 25th token
    second = run(engine, GenerationRequest(follow_up, GREEDY, n_predict=6, id_slot=0))
    fresh = run(engine, GenerationRequest(follow_up, GREEDY, n_predict=6, id_slot=1, cache_prompt=False))
    assert second.n_cached == 32  # a checkpoint taken while generating
    assert second.token_ids == fresh.token_ids


def test_a_reply_rendered_otherwise_resumes_before_the_generation_prompt(engine):
    """The next turn renders the previous reply otherwise from its first token (a template that
    strips the thinking): it resumes PROMPT_END_OFFSET tokens before the previous prompt's end,
    not at the last interval (llama-server keeps that checkpoint too)."""
    from lamplight.engine.checkpoints import PROMPT_END_OFFSET

    first_prompt = tokens(45, 13)
    first = run(engine, GenerationRequest(first_prompt, GREEDY, n_predict=6, id_slot=0))
    follow_up = first_prompt + [t for t in tokens(9, 14) if t != first.token_ids[0]]
    second = run(engine, GenerationRequest(follow_up, GREEDY, n_predict=6, id_slot=0))
    fresh = run(engine, GenerationRequest(follow_up, GREEDY, n_predict=6, id_slot=1, cache_prompt=False))
    assert second.n_cached == len(first_prompt) - PROMPT_END_OFFSET  # 41, where the last interval is 32
    assert second.token_ids == fresh.token_ids


def test_replies_are_checkpointed_more_often_than_prompts(hybrid):
    """With 64-token intervals a reply is still snapshot every REPLY_INTERVAL (32) tokens: a
    follow-up whose text diverges inside a long reply re-reads less of it."""
    from lamplight.engine.checkpoints import REPLY_INTERVAL

    eng = make_engine(hybrid, checkpoint_interval=64, ctx_checkpoints=4)
    try:
        prompt = tokens(10, 15)
        first = run(eng, GenerationRequest(prompt, GREEDY, n_predict=60, id_slot=0))
        history = prompt + list(first.token_ids)
        follow_up = history[:50] + [t for t in tokens(7, 16) if t != history[50]]
        second = run(eng, GenerationRequest(follow_up, GREEDY, n_predict=6, id_slot=0))
        fresh = run(eng, GenerationRequest(follow_up, GREEDY, n_predict=6, id_slot=1, cache_prompt=False))
    finally:
        eng.stop()
    assert second.n_cached == REPLY_INTERVAL  # 32: inside the reply, where prompts' checkpoints are 64 apart
    assert second.token_ids == fresh.token_ids


def test_chunk_size_changes_nothing(hybrid):
    prompt = tokens(70, 7)
    finals = []
    for n_ubatch in (2, 13, 64):
        eng = make_engine(hybrid, n_ubatch=n_ubatch)
        try:
            finals.append(run(eng, GenerationRequest(prompt, GREEDY, n_predict=10)).token_ids)
        finally:
            eng.stop()
    assert finals[0] == finals[1] == finals[2]


def test_batched_sequences_keep_their_own_state(engine):
    prompts = [tokens(20 + 7 * i, 10 + i) for i in range(2)]
    alone = [run(engine, GenerationRequest(p, GREEDY, n_predict=10, cache_prompt=False)).token_ids for p in prompts]
    handles = [engine.submit(GenerationRequest(p, GREEDY, n_predict=10, cache_prompt=False)) for p in prompts]
    together = [[e for e in h.iter_events(timeout=120) if isinstance(e, FinalEvent)][0].token_ids for h in handles]
    assert together == alone


def test_choices_share_the_prompts_state(engine):
    prompt = tokens(25, 12)
    seeded = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=11, ignore_eos=True)
    events = list(engine.submit(GenerationRequest(prompt, seeded, n_predict=8, n_choices=2)).iter_events(timeout=120))
    finals = {e.choice: e.token_ids for e in events if isinstance(e, FinalEvent)}
    greedy = list(engine.submit(GenerationRequest(prompt, GREEDY, n_predict=8, n_choices=2)).iter_events(timeout=120))
    greedy_finals = [e.token_ids for e in greedy if isinstance(e, FinalEvent)]
    alone = run(engine, GenerationRequest(prompt, GREEDY, n_predict=8, cache_prompt=False))
    assert greedy_finals == [alone.token_ids, alone.token_ids]  # the sibling continues the same state
    again = list(engine.submit(GenerationRequest(prompt, seeded, n_predict=8, n_choices=2)).iter_events(timeout=120))
    assert {e.choice: e.token_ids for e in again if isinstance(e, FinalEvent)} == finals


def test_slot_file_holds_the_recurrent_state(engine, tmp_path):
    prompt = tokens(30, 13)
    first = run(engine, GenerationRequest(prompt, GREEDY, n_predict=5, id_slot=1))
    follow_up = prompt + list(first.token_ids) + tokens(4, 14)
    expected = run(engine, GenerationRequest(follow_up, GREEDY, n_predict=6, id_slot=0, cache_prompt=False))
    path = str(tmp_path / "slot.bin")
    engine.save_slot(1, path)
    engine.erase_slot(1)
    run(engine, GenerationRequest(tokens(20, 15), GREEDY, n_predict=3, id_slot=1))  # the slot's state overwritten
    assert engine.restore_slot(1, path)["n_restored"] == first.tokens_cached
    resumed = run(engine, GenerationRequest(follow_up, GREEDY, n_predict=6, id_slot=1))
    assert resumed.n_cached == first.tokens_cached and resumed.token_ids == expected.token_ids


def test_context_shift_is_refused_at_start_up(hybrid):
    with pytest.raises(ValueError, match="--context-shift"):
        make_engine(hybrid, context_shift=True)


def test_negative_checkpoint_budget_is_refused(hybrid):
    with pytest.raises(ValueError, match="--ctx-checkpoints"):
        make_engine(hybrid, ctx_checkpoints=-1)


def test_no_checkpoints_still_reproduces(hybrid):
    eng = make_engine(hybrid, ctx_checkpoints=0)
    try:
        prompt = tokens(40, 16)
        first = run(eng, GenerationRequest(prompt, GREEDY, n_predict=6, id_slot=0))
        follow_up = (prompt + list(first.token_ids))[:42] + tokens(5, 17)
        second = run(eng, GenerationRequest(follow_up, GREEDY, n_predict=6, id_slot=0))
        fresh = run(eng, GenerationRequest(follow_up, GREEDY, n_predict=6, id_slot=1, cache_prompt=False))
        assert second.n_cached == 0 and second.token_ids == fresh.token_ids
    finally:
        eng.stop()


def test_a_failed_step_leaves_every_state_as_it_was(hybrid, monkeypatch):
    """A batch (of decode steps: states that are not fresh) that fails in its last layer is run
    again one sequence at a time, so that only a sequence at fault fails: the earlier layers'
    recurrent states must not have been written."""
    runner, _ = hybrid
    if runner.backend != "reference":
        pytest.skip("injects the failure into a PyTorch layer (the native step commits its states last, src/recurrent.h)")
    prompts = [tokens(18, 20), tokens(23, 21)]
    eng = make_engine(hybrid)
    try:
        alone = [run(eng, GenerationRequest(p, GREEDY, n_predict=6, cache_prompt=False)).token_ids for p in prompts]
        last = runner.model.blocks[-1]
        original = last.forward
        failures = []

        def fail_once_when_batched(h, layer, step):
            chunks = step.batch.chunks
            if len(chunks) > 1 and all(c.start_pos > 0 for c in chunks) and not failures:
                failures.append(layer)
                raise RuntimeError("injected failure")
            return original(h, layer, step)

        monkeypatch.setattr(last, "forward", fail_once_when_batched)
        handles = [eng.submit(GenerationRequest(p, GREEDY, n_predict=6, cache_prompt=False)) for p in prompts]
        together = [[e for e in h.iter_events(timeout=120) if isinstance(e, FinalEvent)][0].token_ids for h in handles]
        assert failures and together == alone
    finally:
        eng.stop()


def test_the_start_up_line_states_the_checkpoints_memory(hybrid):
    from lamplight.cli import checkpoint_line

    eng = make_engine(hybrid)
    try:
        line = checkpoint_line(eng)
        per_slot = eng.runner.state_spec.recurrent_bytes_per_sequence()
        assert f"{per_slot / 2**20:.1f} MiB per slot" in line and "up to 4 checkpoints per slot every 16 tokens" in line
    finally:
        eng.stop()


def test_checkpoints_that_cannot_fit_are_a_start_up_error_naming_the_flag(hybrid, monkeypatch):
    import lamplight.engine.engine as engine_module

    runner, _ = hybrid
    spec = runner.state_spec
    kv = spec.bytes_per_token() * 4096  # more than the KV of make_engine's 512 tokens needs
    monkeypatch.setattr(engine_module, "available_memory_bytes", lambda device: kv)
    with pytest.raises(MemoryError, match="--ctx-checkpoints"):
        make_engine(hybrid, ctx_checkpoints=10**6)
    make_engine(hybrid, ctx_checkpoints=0).stop()  # without checkpoints it fits
