"""Speculative decoding with a draft model (-md, draft-simple): its drafts change how many tokens
a step keeps, never which; it reads only what each slot's sequence gained since its last draft;
its pool gives way between slots; a draft model that does not fit the model is refused."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from model_helpers import runner_for
from test_server_support import serve
from tiny_gguf import write_tiny_llama

from lamplight.engine.config import EngineConfig
from lamplight.engine.draft_model import TOP_K, DraftModel, _share_among_the_best
from lamplight.engine.engine import Engine
from lamplight.engine.types import FinalEvent, GenerationRequest, InvalidRequestError
from lamplight.gguf.file import GGUFFile
from lamplight.native import runtime
from lamplight.sampling import SamplingParams
from lamplight.speculative import SpecConfig, SpecRequest
from lamplight.speculative.config import DraftModelSizes
from lamplight.tokenizer import Tokenizer

GREEDY = SamplingParams(temperature=0.0, ignore_eos=True, n_probs=2)
SEEDED = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=5, ignore_eos=True, n_probs=2)
DRAFT = SpecConfig(kinds=("draft-simple",), draft_model="draft.gguf", adaptive=False)  # drafts every step
PROMPT = [3 + (i * 17) % 23 for i in range(40)]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The model; itself as a draft (it always agrees); a draft of its first layer (agrees at times);
    another random model (seldom agrees)."""
    folder = tmp_path_factory.mktemp("draft")
    return {"model": GGUFFile(write_tiny_llama(folder / "model.gguf", n_ctx=512)),
            "one_layer": GGUFFile(write_tiny_llama(folder / "one_layer.gguf", n_ctx=512, n_layers=1)),
            "other": GGUFFile(write_tiny_llama(folder / "other.gguf", seed=3, n_ctx=512))}


@pytest.fixture(scope="module", params=["reference", "native"])
def backend(request):
    if request.param == "native" and runtime.library() is None:
        pytest.skip(f"no native library: {runtime.unavailable_reason()}")
    return request.param


def make_engine(files, backend: str, draft: str | None, spec: SpecConfig = DRAFT, **cfg) -> Engine:
    model = files["model"]
    engine = Engine(runner_for(model, backend), Tokenizer.from_gguf(model),
                    EngineConfig(**{"n_ctx": 1024, "n_parallel": 4, "kv_unified": True, "n_ubatch": 64,
                                    "speculative": spec if draft else SpecConfig(), **cfg}),
                    draft_runner=runner_for(files[draft], backend) if draft else None)
    engine.start()
    return engine


def final_of(engine: Engine, request: GenerationRequest) -> FinalEvent:
    return next(e for e in engine.submit(request).iter_events(timeout=300) if isinstance(e, FinalEvent))


@pytest.fixture(scope="module")
def plain(files, backend):
    engine = make_engine(files, backend, None)
    yield engine
    engine.stop()


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
@pytest.mark.parametrize("draft", ["model", "one_layer", "other"])
def test_tokens_are_those_without_a_draft_model(files, backend, plain, draft, sampling):
    request = GenerationRequest(PROMPT, sampling, n_predict=48)
    expected = final_of(plain, request)
    engine = make_engine(files, backend, draft)
    try:
        got = final_of(engine, request)
        assert got.token_ids == expected.token_ids and got.probs == expected.probs
        assert got.content == expected.content
        assert 0 < got.timings.draft_n and got.timings.draft_n_accepted <= got.timings.draft_n
        if draft == "model" and sampling is GREEDY:  # it drafts the model's own tokens, n_max (3) a step
            assert got.timings.draft_n_accepted == got.timings.draft_n
            assert engine.stats["steps"] <= 1 + -(-48 // 4)
        for slot in engine.slots:  # no rejected draft's K/V left behind
            assert slot.table.num_tokens == len(slot.cached_tokens)
    finally:
        engine.stop()


def test_several_sequences_draft_together(files, backend, plain):
    """Requests of different lengths and samplings at once (their drafts in the same draft forwards),
    and n = 2 choices: each gets its tokens alone, without a draft model."""
    requests = [GenerationRequest(PROMPT, GREEDY, n_predict=30),
                GenerationRequest(PROMPT[7:], SEEDED, n_predict=25),
                GenerationRequest(PROMPT[:11], SEEDED, n_predict=30, n_choices=2)]
    expected = [[e for e in plain.submit(r).iter_events(timeout=300) if isinstance(e, FinalEvent)] for r in requests]
    engine = make_engine(files, backend, "one_layer")
    try:
        handles = [engine.submit(r) for r in requests]
        for handle, want in zip(handles, expected):
            got = [e for e in handle.iter_events(timeout=300) if isinstance(e, FinalEvent)]
            assert sorted((f.choice, f.token_ids) for f in got) == sorted((f.choice, f.token_ids) for f in want)
        assert engine.spec_stats.draft_tokens > 0
    finally:
        engine.stop()


class CountingRunner:
    """A runner that counts the rows it computes (the draft model's reads)."""

    def __init__(self, runner):
        self.runner, self.rows = runner, 0

    def __getattr__(self, name):
        return getattr(self.runner, name)

    def run(self, chunks, state):
        self.rows += sum(len(c.token_ids) for c in chunks)
        return self.runner.run(chunks, state)


def test_a_follow_up_in_the_slot_reads_only_what_is_new(files, backend):
    model = files["model"]
    counting = CountingRunner(runner_for(files["model"], backend))
    engine = Engine(runner_for(model, backend), Tokenizer.from_gguf(model),
                    EngineConfig(n_ctx=512, n_parallel=1, n_ubatch=64, speculative=DRAFT), draft_runner=counting)
    engine.start()
    try:
        first = final_of(engine, GenerationRequest(PROMPT, GREEDY, n_predict=12))
        after_first = counting.rows
        # the whole prompt, then per step the model's own token and the 3 drafted before it (the last unread)
        assert after_first <= len(PROMPT) + 4 * 12
        follow_up = [*PROMPT, *first.token_ids, 7, 8, 9]
        final_of(engine, GenerationRequest(follow_up, GREEDY, n_predict=4))
        assert counting.rows - after_first <= 3 + 4 * 4 + 3  # not the prompt again
    finally:
        engine.stop()


def test_the_draft_pool_gives_way_between_slots(files, backend):
    """A pool of 4 blocks: one slot's read is dropped (least recently used) for another's, and a
    sequence longer than the pool drafts nothing rather than failing."""
    runner = runner_for(files["model"], backend)
    model = DraftModel(runner, 64, *EngineConfig().cache_dtypes, DraftModelSizes(n_max=3), runner.config.vocab_size,
                       max_rows=32, block_size=16)
    a, b, c = model.drafter(0), model.drafter(1), model.drafter(2)
    assert len(a.draft(PROMPT, 3)) == 3  # 40 tokens + 2 drafted: 3 blocks
    assert model.reads[0].tokens == [*PROMPT, *model.reads[0].tokens[40:]] and len(model.reads[0].tokens) == 42
    assert len(b.draft(PROMPT[:20], 3)) == 3  # 2 blocks: slot 0's read gives way
    assert model.reads[0].tokens == [] and len(model.reads[1].tokens) == 22
    assert c.draft(list(range(3, 70)), 3) == []  # 69 positions do not fit 64
    assert model.cache.allocator.num_free + sum(len(r.table.blocks) for r in model.reads.values()) == 4


def test_p_min_and_n_min_hold_drafts_back(files, backend, plain):
    request = GenerationRequest(PROMPT, GREEDY, n_predict=16)
    expected = final_of(plain, request)
    for sizes in (DraftModelSizes(n_max=3, p_min=1.0), DraftModelSizes(n_max=3, n_min=4)):
        engine = make_engine(files, backend, "model", SpecConfig(kinds=("draft-simple",), draft=sizes, draft_model="d", adaptive=False))
        try:
            got = final_of(engine, request)
            assert got.token_ids == expected.token_ids and got.timings.draft_n == 0
        finally:
            engine.stop()


def test_p_min_weighs_the_likeliest_token_among_the_ten_likeliest():
    logits = np.random.default_rng(3).standard_normal(1000).astype(np.float32)
    best = np.sort(logits.astype(np.float64))[::-1][:TOP_K]
    expected = 1 / np.exp(best - best[0]).sum()  # the float64 softmax of the ten, at the first
    assert _share_among_the_best(logits, int(logits.argmax())) == pytest.approx(expected, rel=1e-6)
    logits[:5] = logits.max() + 30.0  # five equal leaders: a fifth each, whatever follows
    assert _share_among_the_best(logits, 0) == pytest.approx(0.2, rel=1e-6)


def test_a_request_asking_for_a_draft_model_the_server_lacks_is_refused(plain):
    with pytest.raises(InvalidRequestError, match="speculative.type: draft-simple drafts with a draft model"):
        plain.submit(GenerationRequest(PROMPT, GREEDY, n_predict=4, speculative=SpecRequest(kinds=("draft-simple",))))


def test_the_server_loads_a_draft_model_that_fits_and_refuses_one_that_does_not(files, tmp_path):
    from lamplight.server.launcher import EngineOptions, StartupError, build_engine, load_model
    from lamplight.server.settings import ServerSettings

    options = EngineOptions(n_ctx=1024, n_parallel=2, n_ubatch=64,
                            speculative=SpecConfig(kinds=("draft-simple",), draft_model=str(files["one_layer"].path)))
    loaded = load_model(str(files["model"].path), options)
    assert loaded.draft is not None and loaded.draft.runner is not loaded.runner
    engine = build_engine(loaded, options)
    running = serve(loaded, engine, ServerSettings())
    try:
        body = {"prompt": "the cat sat on the mat", "n_predict": 16, "temperature": 0, "ignore_eos": True}
        on = httpx.post(f"{running.url}/completion", json=body, timeout=120).json()
        off = httpx.post(f"{running.url}/completion", json={**body, "speculative.type": "none"}, timeout=120).json()
        assert on["content"] == off["content"] and on["timings"]["draft_n"] > 0
        assert on["generation_settings"]["speculative.types"] == "draft-simple"
        memory = httpx.get(f"{running.url}/props", timeout=30).json()["lamplight"]["memory_mib"]
        assert memory["draft_weights"] > 0 and memory["draft_kv_cache"] > 0
    finally:
        running.stop()
        engine.stop()
    for missing in (tmp_path / "none.gguf", tmp_path):  # no file, a folder: named as the draft model's problem
        options = EngineOptions(speculative=SpecConfig(kinds=("draft-simple",), draft_model=str(missing)))
        with pytest.raises(StartupError, match=f"-md {missing}: "):
            load_model(str(files["model"].path), options)
    n_vocab = len(Tokenizer.from_gguf(files["model"]).vocab.tokens)
    other_vocab = write_tiny_llama(tmp_path / "other_vocab.gguf", controls=[f"<|x{i}|>" for i in range(200)])
    options = EngineOptions(speculative=SpecConfig(kinds=("draft-simple",), draft_model=str(other_vocab)))
    with pytest.raises(StartupError, match=f"vocabulary must be the model's: the draft model has {n_vocab + 200} "
                                           f"tokens, the model {n_vocab}"):
        load_model(str(files["model"].path), options)
