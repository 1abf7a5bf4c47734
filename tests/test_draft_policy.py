"""Speculation only where it pays (lamplight.engine.draft_policy): the step cost fitted from the
engine's own steps, the rule comparing tokens a second with and without the draft, the exploring
steps; and the engine asking it each step (drafts only on the steps it allows, the tokens the
same either way)."""

from __future__ import annotations

import pytest
from model_helpers import runner_for
from tiny_gguf import write_tiny_llama

from lamplight.engine.config import EngineConfig
from lamplight.engine.draft_policy import EXPLORE_EVERY, EXPLORE_MOST, DraftPolicy
from lamplight.engine.engine import Engine
from lamplight.engine.types import FinalEvent, GenerationRequest
from lamplight.gguf.file import GGUFFile
from lamplight.sampling import SamplingParams
from lamplight.speculative import SpecConfig
from lamplight.tokenizer import Tokenizer


def decisions(policy: DraftPolicy, n: int, steps: int, rate: dict[bool, float]) -> list[bool]:
    """`steps` steps of `n` sequences, each measured at rate[drafted] tokens a second."""
    out = []
    for _ in range(steps):
        drafted = policy.allow(n)
        policy.observe_step(n, drafted, 10, 10 / rate[drafted])
        out.append(drafted)
    return out


def test_both_sides_are_measured_first_then_the_faster_wins():
    policy = DraftPolicy()
    assert policy.pays(4) is None
    first = decisions(policy, 4, 3, {True: 150.0, False: 250.0})
    # a draft of two steps (the first is a switch: not measured), then a step without
    assert first == [True, True, False] and policy.pays(4) is False
    assert (policy.rate(4, True), policy.rate(4, False)) == (150.0, 250.0)
    later = decisions(policy, 4, 100, {True: 150.0, False: 250.0})
    assert later.count(True) < 10  # the exploring drafts alone
    two = decisions(policy, 2, 40, {True: 120.0, False: 80.0})  # another count of sequences: its own figures
    assert two.count(False) <= 4 and policy.pays(2) and not policy.pays(4)
    assert all(decisions(policy, 1, 20, {True: 50.0, False: 80.0}))  # one sequence always drafts


def test_exploring_steps_come_at_growing_gaps_and_keep_the_figures_current():
    policy = DraftPolicy()
    decisions(policy, 2, 3, {True: 100.0, False: 200.0})
    steps = decisions(policy, 2, EXPLORE_EVERY * 15, {True: 100.0, False: 200.0})
    starts = [i for i, d in enumerate(steps) if d and (i == 0 or not steps[i - 1])]
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert gaps == sorted(gaps) and gaps[0] >= EXPLORE_EVERY and all(g <= EXPLORE_MOST + 2 for g in gaps)
    assert all(steps[i + 1] for i in starts)  # each exploring draft lasts two steps
    # drafting becomes the faster (say the model now agrees): the next exploring draft finds it
    later = decisions(policy, 2, 3 * EXPLORE_MOST, {True: 400.0, False: 200.0})
    assert policy.pays(2) and later[-EXPLORE_MOST:].count(True) > 0.9 * EXPLORE_MOST


def test_a_switch_to_drafting_is_not_measured():
    """The first drafting step after steps without: the draft model catches up on every token it
    has not read, a cost of switching, not of drafting."""
    policy = DraftPolicy()
    policy.observe_step(3, False, 3, 0.01)
    policy.observe_step(3, True, 9, 1.0)  # slow: it caught up
    assert policy.rate(3, True) is None
    policy.observe_step(3, True, 9, 0.03)
    assert policy.rate(3, True) == pytest.approx(300.0)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny model, and itself as its draft model (it drafts every step it may, all accepted)."""
    path = write_tiny_llama(tmp_path_factory.mktemp("policy") / "tiny.gguf", n_ctx=512)
    gguf = GGUFFile(path)
    return runner_for(gguf, "reference"), runner_for(GGUFFile(path), "reference"), Tokenizer.from_gguf(gguf)


PROMPT = [3 + (i * 17) % 23 for i in range(40)]


def _outputs(model, pays: bool | None, monkeypatch) -> list[FinalEvent]:
    """Two requests decoding together; `pays`: what the policy's rule says (None: no policy)."""
    if pays is not None:
        monkeypatch.setattr(DraftPolicy, "pays", lambda self, n: pays)
    runner, draft, tokenizer = model
    spec = SpecConfig(kinds=("draft-simple",), draft_model="self", adaptive=pays is not None)
    engine = Engine(runner, tokenizer, EngineConfig(n_ctx=1024, n_parallel=2, kv_unified=True, n_ubatch=64,
                                                    speculative=spec), draft_runner=draft)
    engine.start()
    try:
        assert (engine.draft_policy is not None) == (pays is not None)
        handles = [engine.submit(GenerationRequest(PROMPT[i:], SamplingParams(temperature=0.0, ignore_eos=True),
                                                   n_predict=40)) for i in (0, 3)]
        return [next(e for e in h.iter_events(timeout=300) if isinstance(e, FinalEvent)) for h in handles]
    finally:
        engine.stop()


def test_the_engine_drafts_only_on_the_steps_the_policy_allows(tiny, monkeypatch):
    always = _outputs(tiny, None, monkeypatch)  # adaptive off: every step drafts
    allowed = _outputs(tiny, True, monkeypatch)
    declined = _outputs(tiny, False, monkeypatch)
    assert all(f.timings.draft_n > 0 for f in always + allowed)
    for a, b, c in zip(always, allowed, declined):
        assert a.token_ids == b.token_ids == c.token_ids
    # declined: only the exploring drafts (two steps at a gap of EXPLORE_EVERY or more), n-max (3) tokens each
    assert all(0 < f.timings.draft_n <= 3 * 2 * (40 // EXPLORE_EVERY + 1) for f in declined)
    assert sum(f.timings.draft_n for f in declined) < sum(f.timings.draft_n for f in always)
