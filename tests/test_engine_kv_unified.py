"""One KV pool shared by the slots (--kv-unified, lamplight.engine.kv_room): a sequence may use
the whole context, idle slots' caches give way to running sequences, and running sequences that
do not all fit are preempted and computed again, with the tokens they get alone."""

from __future__ import annotations

import pytest
from model_helpers import engine_model

from lamplight.engine.config import EngineConfig
from lamplight.engine.engine import Engine
from lamplight.engine.types import ContextExceededError, FinalEvent, GenerationRequest, TokenEvent
from lamplight.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0, ignore_eos=True)
SEEDED = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=5, ignore_eos=True)
POOL = 256  # tokens: 16 blocks of 16


@pytest.fixture(scope="module", params=["llama-reference", "llama-native", "qwen35-native"])
def model(request, tmp_path_factory):
    return engine_model(request.param, tmp_path_factory.mktemp("kvu"))


def make_engine(model, **cfg) -> Engine:
    runner, tokenizer = model
    settings = {"n_ctx": POOL, "n_parallel": 4, "kv_unified": True, "n_ubatch": 64, "checkpoint_interval": 32}
    engine = Engine(runner, tokenizer, EngineConfig(**{**settings, **cfg}))
    engine.start()
    return engine


@pytest.fixture
def engine(model):
    eng = make_engine(model)
    yield eng
    eng.stop()


def tokens(n: int, seed: int) -> list[int]:
    return [3 + (seed * 31 + i * 17) % 240 for i in range(n)]


def run(engine: Engine, request: GenerationRequest) -> tuple[list[TokenEvent], FinalEvent]:
    events = list(engine.submit(request).iter_events(timeout=120))
    return [e for e in events if isinstance(e, TokenEvent)], next(e for e in events if isinstance(e, FinalEvent))


def test_one_sequence_may_use_the_whole_context(engine):
    """4 slots over 256 tokens: a 200-token prompt runs (split evenly, a slot would hold 64)."""
    assert engine.n_ctx_slot == POOL
    _, final = run(engine, GenerationRequest(tokens(200, 1), GREEDY, n_predict=20))
    assert final.n_prompt == 200 and len(final.token_ids) == 20
    with pytest.raises(ContextExceededError):
        engine.submit(GenerationRequest(tokens(POOL, 2), GREEDY, n_predict=1))


def test_split_evenly_without_unified(model):
    eng = make_engine(model, kv_unified=False)
    try:
        assert eng.n_ctx_slot == POOL // 4
        with pytest.raises(ContextExceededError):
            eng.submit(GenerationRequest(tokens(100, 1), GREEDY, n_predict=1))
    finally:
        eng.stop()


def test_idle_caches_give_way_to_a_running_sequence(engine):
    first = tokens(150, 3)
    run(engine, GenerationRequest(first, GREEDY, n_predict=4, id_slot=0))
    run(engine, GenerationRequest(tokens(180, 4), GREEDY, n_predict=4, id_slot=1))  # needs slot 0's blocks
    assert engine.slots[0].cached_tokens == [] and not engine.slots[0].table.blocks
    _, again = run(engine, GenerationRequest(first, GREEDY, n_predict=4, id_slot=0))
    assert again.n_cached == 0  # its cache was given away, so it is read again


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_sequences_that_do_not_fit_together_are_preempted_and_lose_nothing(engine, model, sampling):
    """Four requests of 40 + 60 tokens in a pool of 256 (they need 400 together): the newest are
    preempted and computed again, every token is streamed once, and each request's tokens are
    the ones it gets alone."""
    prompts = [tokens(40, 10 + i) for i in range(4)]
    handles = [engine.submit(GenerationRequest(p, sampling, n_predict=60)) for p in prompts]
    together = []
    for handle in handles:
        events = list(handle.iter_events(timeout=300))
        streamed = [e.token_id for e in events if isinstance(e, TokenEvent)]
        final = next(e for e in events if isinstance(e, FinalEvent))
        assert streamed == list(final.token_ids) and len(streamed) == 60
        together.append(final.token_ids)
    assert engine.room.preempted > 0
    alone_engine = make_engine(model, n_parallel=1)
    try:
        alone = [run(alone_engine, GenerationRequest(p, sampling, n_predict=60))[1].token_ids for p in prompts]
    finally:
        alone_engine.stop()
    assert together == alone
