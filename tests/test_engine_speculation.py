"""Speculative decoding (lamplight.speculative drafts, lamplight.engine.speculation verifies):
a request's tokens, probabilities and text are those it gets without speculation, greedy and
seeded, alone or beside others, on every backend; only the number of steps changes."""

from __future__ import annotations

import pytest
import torch
from conftest import reference_path
from model_helpers import paged_state, runner_for
from tiny_gguf import write_tiny_llama

from lamplight.engine.config import EngineConfig
from lamplight.engine.engine import Engine
from lamplight.engine.kv_cache import BlockTable
from lamplight.engine.types import FinalEvent, GenerationRequest, InvalidRequestError, TokenEvent
from lamplight.gguf.file import GGUFFile
from lamplight.models.batch import SequenceChunk
from lamplight.native import runtime
from lamplight.sampling import SamplingParams
from lamplight.speculative import SpecConfig, SpecRequest
from lamplight.speculative.config import NgramMapSizes, NgramModSizes
from lamplight.tokenizer import Tokenizer

GREEDY = SamplingParams(temperature=0.0, ignore_eos=True, n_probs=3)
SEEDED = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=5, ignore_eos=True, n_probs=3)
# Small sizes, so that the tiny random model's short histories draft often.
SMALL = NgramMapSizes(size_n=2, size_m=8, min_hits=1)
SPEC = SpecConfig(kinds=("ngram-simple",), ngram_simple=SMALL, ngram_map_k=SMALL, ngram_map_k4v=SMALL,
                  ngram_mod=NgramModSizes(n_match=2, n_max=8, n_min=1), adaptive=False)  # drafts every step
KINDS = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod")
PROMPT = [3 + (i * 17) % 23 for i in range(40)]  # repeats every 23 tokens: n-grams to find


@pytest.fixture(scope="module", params=["reference", "pytorch", "native"])
def tiny(request, tmp_path_factory):
    if request.param == "native" and runtime.library() is None:
        pytest.skip(f"no native library: {runtime.unavailable_reason()}")
    gguf = GGUFFile(write_tiny_llama(tmp_path_factory.mktemp("spec") / "tiny.gguf", n_ctx=512))
    return runner_for(gguf, request.param), Tokenizer.from_gguf(gguf)


def make_engine(model, **cfg) -> Engine:
    runner, tokenizer = model
    engine = Engine(runner, tokenizer, EngineConfig(**{"n_ctx": 1024, "n_parallel": 4, "kv_unified": True,
                                                       "n_ubatch": 64, **cfg}))
    engine.start()
    return engine


@pytest.fixture(scope="module")
def engines(tiny):
    plain, speculating = make_engine(tiny), make_engine(tiny, speculative=SPEC)
    yield plain, speculating
    plain.stop()
    speculating.stop()


def final_of(engine: Engine, request: GenerationRequest) -> tuple[FinalEvent, list[TokenEvent]]:
    events = list(engine.submit(request).iter_events(timeout=300))
    return next(e for e in events if isinstance(e, FinalEvent)), [e for e in events if isinstance(e, TokenEvent)]


def same_output(a: FinalEvent, b: FinalEvent) -> None:
    assert b.token_ids == a.token_ids
    assert b.content == a.content and b.stop_type == a.stop_type
    assert b.probs == a.probs


def assert_blocks_match_tokens(engine: Engine) -> None:
    """No draft's K/V block is left behind: each slot holds the blocks of its tokens."""
    bs = engine.cache.block_size
    for slot in engine.slots:
        assert slot.table.num_tokens == len(slot.cached_tokens)
        assert len(slot.table.blocks) == -(-slot.table.num_tokens // bs)


def test_a_draft_as_one_chunk_is_computed_as_decode_rows(tiny):
    """Where the runner says so (native), a draft is verified as one chunk: each of its rows gives
    the bits of that position's decode step."""
    runner, _ = tiny
    if not runner.chunk_rows_are_decode_rows:
        pytest.skip("this backend verifies drafts as one-token chunks")
    state, cache = paged_state(runner, num_blocks=8, block_size=16)
    table = BlockTable(cache)
    table.fill_to(60)
    runner.run([SequenceChunk(PROMPT, 0, table.slots(0, 40))], state)
    tokens = [5, 9, 11, 13, 20, 30, 40, 50, 60, 70, 80, 90]
    one_by_one = torch.cat([runner.run([SequenceChunk([t], 40 + i, table.slots(0, 41 + i))], state)
                            for i, t in enumerate(tokens)])
    chunk = SequenceChunk(tokens, 40, table.slots(0, 40 + len(tokens)), all_logits=True)
    assert torch.equal(runner.run([chunk], state), one_by_one)


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
@pytest.mark.parametrize("kind", KINDS)
def test_tokens_are_those_without_speculation(engines, kind, sampling):
    plain, speculating = engines
    request = GenerationRequest(PROMPT, sampling, n_predict=48, speculative=SpecRequest(kinds=(kind,)))
    expected, _ = final_of(plain, request)
    steps = speculating.stats["steps"]
    got, events = final_of(speculating, request)
    same_output(expected, got)
    assert [e.token_id for e in events] == list(expected.token_ids)  # each token streamed once, in order
    assert got.timings.draft_n >= got.timings.draft_n_accepted
    assert speculating.stats["steps"] - steps <= len(got.token_ids)
    assert_blocks_match_tokens(speculating)


def test_drafts_are_made_and_rejected_drafts_cost_nothing(engines):
    """Across the kinds the small sizes draft; tokens after a rejected one are dropped."""
    plain, speculating = engines
    drafted = accepted = 0
    for kind in KINDS:
        request = GenerationRequest(PROMPT, GREEDY, n_predict=48, speculative=SpecRequest(kinds=(kind,)))
        got, _ = final_of(speculating, request)
        drafted += got.timings.draft_n
        accepted += got.timings.draft_n_accepted
    assert drafted > 0 and accepted < drafted
    stats = speculating.spec_stats
    assert stats.draft_tokens >= drafted and stats.drafts > 0
    assert sum(stats.accepted_per_position[:1]) <= stats.drafts


def test_several_requests_at_once_get_their_own_tokens(engines):
    """Speculating sequences beside each other and beside a plain one: each gets its alone-tokens."""
    plain, speculating = engines
    requests = [GenerationRequest(PROMPT, GREEDY, n_predict=40),
                GenerationRequest(PROMPT[5:], SEEDED, n_predict=40, speculative=SpecRequest(kinds=("ngram-map-k",))),
                GenerationRequest(PROMPT[:30], SEEDED, n_predict=40, speculative=SpecRequest(kinds=())),
                GenerationRequest(PROMPT[3:], GREEDY, n_predict=40, speculative=SpecRequest(kinds=("ngram-mod",)))]
    alone = [final_of(plain, r)[0] for r in requests]
    handles = [speculating.submit(r) for r in requests]
    together = [next(e for e in h.iter_events(timeout=300) if isinstance(e, FinalEvent)) for h in handles]
    for a, b in zip(alone, together):
        same_output(a, b)
    assert together[2].timings.draft_n == 0  # speculative.type "none": this request does not draft
    assert_blocks_match_tokens(speculating)


@pytest.mark.parametrize("n_predict", [1, 2, 5, 13])
def test_n_predict_ends_inside_a_draft(engines, n_predict):
    plain, speculating = engines
    request = GenerationRequest(PROMPT, GREEDY, n_predict=n_predict)
    expected, _ = final_of(plain, request)
    got, _ = final_of(speculating, request)
    same_output(expected, got)
    assert len(got.token_ids) == n_predict


def test_a_stop_string_inside_a_draft(engines, tiny):
    """The stop word is found whether its tokens came in one step or several."""
    plain, speculating = engines
    _, tokenizer = tiny
    free, _ = final_of(plain, GenerationRequest(PROMPT, GREEDY, n_predict=40))
    word = free.content[len(free.content) // 2:][:3]
    assert word
    request = GenerationRequest(PROMPT, GREEDY, n_predict=40, stop=[word])
    expected, _ = final_of(plain, request)
    got, _ = final_of(speculating, request)
    same_output(expected, got)
    assert got.stop_type == "word"


def test_request_fields_cap_and_turn_off_drafts(engines):
    _, speculating = engines
    capped, _ = final_of(speculating, GenerationRequest(PROMPT, GREEDY, n_predict=48,
                                                        speculative=SpecRequest(n_max=1)))
    assert capped.timings.draft_n <= len(capped.token_ids)
    off, _ = final_of(speculating, GenerationRequest(PROMPT, GREEDY, n_predict=48, speculative=SpecRequest(n_max=0)))
    assert off.timings.draft_n == 0 and off.token_ids == capped.token_ids
    assert speculating.speculative_types(SpecRequest(n_max=0)) == "none"
    assert speculating.speculative_types() == "ngram-simple"
    assert speculating.speculative_types(SpecRequest(kinds=("ngram-mod", "ngram-simple"))) == "ngram-mod,ngram-simple"


def test_a_full_context_stops_as_without_speculation(tiny):
    """Drafts never reach past the slot's context: the request ends at the same token."""
    plain, speculating = make_engine(tiny, n_ctx=96, kv_unified=False, n_parallel=1), \
        make_engine(tiny, n_ctx=96, kv_unified=False, n_parallel=1, speculative=SPEC)
    try:
        request = GenerationRequest(PROMPT, GREEDY, n_predict=-1)
        expected, _ = final_of(plain, request)
        got, _ = final_of(speculating, request)
        same_output(expected, got)
        assert got.truncated and got.tokens_cached == expected.tokens_cached
    finally:
        plain.stop()
        speculating.stop()


def test_a_model_with_recurrent_layers_decodes_without_speculation():
    if runtime.library() is None:
        pytest.skip(f"no native library: {runtime.unavailable_reason()}")
    gguf = GGUFFile(reference_path("archs2/qwen35.gguf"))
    engine = make_engine((runner_for(gguf, "native"), Tokenizer.from_gguf(gguf)), speculative=SPEC)
    try:
        assert engine.speculation is None and engine.speculative_types() == "none"
        got, _ = final_of(engine, GenerationRequest(PROMPT, GREEDY, n_predict=8))
        assert len(got.token_ids) == 8 and got.timings.draft_n == 0
        with pytest.raises(InvalidRequestError, match="speculative.type: this model has recurrent layers"):
            engine.submit(GenerationRequest(PROMPT, GREEDY, n_predict=8, speculative=SpecRequest(kinds=("ngram-mod",))))
    finally:
        engine.stop()


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    if runtime.library() is None:
        pytest.skip(f"no native library: {runtime.unavailable_reason()}")
    gguf = GGUFFile(smollm2_path)
    return runner_for(gguf, "native"), Tokenizer.from_gguf(gguf)


def test_a_real_model_copying_text_accepts_long_drafts(smollm2):
    """SmolLM2 asked to repeat a passage: most tokens come from accepted drafts, in far fewer
    steps, and they are exactly the tokens of plain decoding (greedy and seeded)."""
    _, tokenizer = smollm2
    passage = ("The lighthouse keeper climbed the spiral stairs every evening at dusk, trimmed the wick, "
               "polished the great lens and wrote the weather in a small leather book. ") * 2
    text = (f"<|im_start|>user\nRepeat this text exactly:\n{passage}<|im_end|>\n<|im_start|>assistant\n{passage[:60]}")
    prompt = tokenizer.encode(text, add_special=False, parse_special=True)
    spec = SpecConfig(kinds=("ngram-simple", "ngram-mod"), ngram_simple=NgramMapSizes(size_n=3, size_m=16), adaptive=False)
    plain, speculating = make_engine(smollm2), make_engine(smollm2, speculative=spec)
    try:
        for sampling in (SamplingParams(temperature=0.0), SamplingParams(temperature=0.7, seed=11)):
            request = GenerationRequest(prompt, sampling, n_predict=40)
            expected, _ = final_of(plain, request)
            steps = speculating.stats["steps"]
            got, _ = final_of(speculating, request)
            same_output(expected, got)
            if sampling.temperature == 0.0:
                assert got.timings.draft_n_accepted >= len(got.token_ids) // 2
                assert speculating.stats["steps"] - steps <= len(got.token_ids) // 2
    finally:
        plain.stop()
        speculating.stop()
