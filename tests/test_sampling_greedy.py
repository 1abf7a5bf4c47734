"""The greedy shortcut of sample_batch (SequenceSampler.plain_greedy): rows whose chain can only
keep the best candidate get it without running the chain, and get exactly the chain's token."""

from __future__ import annotations

import random

import numpy as np
import pytest

from lamplight.sampling import SamplingParams, SequenceSampler, sample_batch

VOCAB = 300


def sampler(**params) -> SequenceSampler:
    return SequenceSampler(SamplingParams(**params), n_ctx=512, eog_ids=frozenset({0, 1}))


def chain_tokens(logits, samplers, **kwargs) -> list[int]:
    """The tokens of the full chain, the shortcut turned off."""
    saved = [s.plain_greedy for s in samplers]
    for s in samplers:
        s.plain_greedy = False
    try:
        return sample_batch(logits, samplers, **kwargs).token_ids
    finally:
        for s, value in zip(samplers, saved):
            s.plain_greedy = value


@pytest.mark.parametrize("params, shortcut", [
    ({"temperature": 0.0}, True),
    ({"temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}, True),
    ({"temperature": 0.0, "top_k": 3, "top_p": 0.5, "min_p": 0.2, "top_n_sigma": 1.0}, True),
    ({"temperature": 0.0, "ignore_eos": True, "logit_bias": [(5, 30.0), (7, float("-inf"))]}, True),
    ({"temperature": 0.0, "typical_p": 0.5}, False),  # typical may drop the best token
    ({"temperature": 0.0, "xtc_probability": 1.0, "xtc_threshold": 0.1}, False),
    ({"temperature": 0.0, "repeat_penalty": 1.3}, False),
    ({"temperature": 0.0, "n_probs": 2}, False),
    ({"temperature": 0.0, "dynatemp_range": 0.5}, False),
    ({"temperature": 0.0, "mirostat": 2}, False),
    ({"temperature": 0.7}, False),
    ({"temperature": 0.0, "samplers": "km"}, False),  # no temperature step: not greedy
])
def test_the_shortcut_gives_the_chains_token(params, shortcut):
    rng = random.Random(3)
    rows = [sampler(**params) for _ in range(4)]
    assert all(s.plain_greedy == shortcut for s in rows)
    for s in rows:
        s.accept_many([rng.randrange(VOCAB) for _ in range(20)])
    for trial in range(20):
        logits = np.random.default_rng(trial).standard_normal((4, VOCAB)).astype(np.float32)
        logits[1, 10] = logits[1, 20] = logits[1].max() + 1.0  # equal maxima: the lower id wins
        logits[2] = np.round(logits[2])  # many ties
        mask = np.random.default_rng(100 + trial).random((4, VOCAB)) > 0.3
        mask[3] = True
        for kwargs in ({}, {"allowed_mask": mask}, {"forced": [None, 9, None, None]}):
            assert sample_batch(logits, rows, **kwargs).token_ids == chain_tokens(logits, rows, **kwargs)


def test_a_batch_mixing_greedy_and_sampled_rows_takes_the_chain_alike():
    rows = [sampler(temperature=0.0), sampler(temperature=0.9, seed=4), sampler(temperature=0.0)]
    logits = np.random.default_rng(1).standard_normal((3, VOCAB)).astype(np.float32)
    together = sample_batch(logits, rows).token_ids
    alone = [sample_batch(logits[i:i + 1], [rows[i]]).token_ids[0] for i in range(3)]
    assert together == alone
    assert together[0] == int(logits[0].argmax()) and together[2] == int(logits[2].argmax())


def test_a_row_left_without_candidates_falls_back_as_the_chain_does():
    row = sampler(temperature=0.0)
    logits = np.random.default_rng(2).standard_normal((1, VOCAB)).astype(np.float32)
    mask = np.zeros((1, VOCAB), dtype=bool)
    assert sample_batch(logits, [row], allowed_mask=mask).token_ids == chain_tokens(logits, [row], allowed_mask=mask)


BIASES = [
    [(5, 30.0), (7, float("-inf"))],
    [(5, 2.5), (5, 2.5), (9, -1e-3)],  # a repeated id adds up
    [(VOCAB - 1, 1e30), (0, -1e30)],
    [(3, float("-inf"))],
]


@pytest.mark.parametrize("writeable", [True, False])
def test_a_biased_greedy_batch_gets_the_chains_tokens_and_leaves_the_logits_as_they_were(writeable):
    """The shortcut adds logit_bias to the logits in place and takes the entries back after the
    argmax (no copy of the array); a read-only array takes the copy. Either way the tokens are
    the chain's and the logits come back bit for bit."""
    rows = [sampler(temperature=0.0, logit_bias=bias) for bias in BIASES] + [sampler(temperature=0.0)]
    for trial in range(30):
        logits = np.random.default_rng(trial).standard_normal((len(rows), VOCAB)).astype(np.float32)
        logits[0, 5] = logits[0].max()  # the biased id ties with the best before its bias
        logits[1, 9] = logits[1].max() + 1e-3 * (trial % 3)  # a small negative bias decides
        logits[3, 3] = logits[3].max() + 1.0  # the banned id was the best
        logits.setflags(write=writeable)
        before = logits.copy()
        tokens = sample_batch(logits, rows).token_ids
        assert logits.tobytes() == before.tobytes()
        assert tokens == chain_tokens(logits, rows)
        assert tokens[3] != 3


def test_a_bias_that_bans_every_candidate_falls_back_as_the_chain_does_and_restores_the_logits():
    row = sampler(temperature=0.0, logit_bias=[(token, float("-inf")) for token in range(VOCAB)])
    logits = np.random.default_rng(5).standard_normal((1, VOCAB)).astype(np.float32)
    before = logits.copy()
    assert sample_batch(logits, [row]).token_ids == chain_tokens(logits, [row])
    assert logits.tobytes() == before.tobytes()
