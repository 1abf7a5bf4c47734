"""Every code path of the filters against a plain float64 oracle, on tie-heavy logits.

The filters take different routes depending on how many candidates a row has and whether the
chain knows them (full vocabulary, counted candidates, top_k's candidate list, rows of a batch
split between those); all must keep exactly the same tokens, ties going to the lower id.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lamplight.sampling import SamplingParams, SequenceSampler, run_chain, sample_batch
from lamplight.sampling import draw, reductions, truncation

N_VOCAB = 8192  # more than truncation.SMALL_WIDTH, so the full-vocabulary routes run
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def tie_heavy_logits(rows: int, seed: int, finite: int | None = None) -> np.ndarray:
    generator = np.random.default_rng(seed)
    logits = (np.round(generator.standard_normal((rows, N_VOCAB)) * 2.0 * 4) / 4).astype(np.float32)  # steps of 0.25
    if finite is not None:
        for row in range(rows):
            dropped = generator.permutation(N_VOCAB)[: N_VOCAB - finite]
            logits[row, dropped] = -math.inf
    return logits


def on_device(logits: np.ndarray, device: str):
    """The logits as the sampler gets them: numpy, or a torch tensor on a GPU (a library user's)."""
    return logits if device == "cpu" else torch.from_numpy(logits).to(device)


def order(row: np.ndarray) -> list[int]:
    ids = [i for i in range(len(row)) if np.isfinite(row[i])]
    return sorted(ids, key=lambda i: (-row[i], i))


def probabilities(row: np.ndarray, ids: list[int]) -> np.ndarray:
    values = row[ids].astype(np.float64)
    e = np.exp(values - values.max())
    return e / e.sum()


def oracle_top_k(row, k):
    return set(order(row)[:k])


def oracle_top_p(row, p, min_keep, eps=1e-5):
    """Acceptable results: float32 sums may cross p a few tokens away from the exact crossing."""
    ids = order(row)
    cumulative = np.cumsum(probabilities(row, ids))

    def prefix_length(target):
        for i, total in enumerate(cumulative):
            if total >= target and i + 1 >= min_keep:
                return i + 1
        return len(ids)

    return [set(ids[:length]) for length in range(prefix_length(p - eps), prefix_length(p + eps) + 1)]


def oracle_min_p(row, p, min_keep):
    ids = order(row)
    threshold = np.float32(row[ids[0]]) + np.float32(math.log(np.float32(p)))
    kept = {i for i in ids if row[i] >= threshold}
    return kept if len(kept) >= min_keep else set(ids[:min_keep])


def oracle_typical(row, p, min_keep):
    ids = order(row)
    probs = probabilities(row, ids)
    entropy = -(probs * np.log(probs)).sum()
    by_score = np.argsort(np.abs(-np.log(probs) - entropy), kind="stable")
    total, kept = 0.0, []
    for position in by_score:
        kept.append(ids[position])
        total += probs[position]
        if total > p and len(kept) >= min_keep:
            break
    return set(kept)


def oracle_xtc(row, threshold, min_keep):
    ids = order(row)
    above = int((probabilities(row, ids) >= threshold).sum())
    remove = above - 1 if above >= 2 and len(ids) - (above - 1) >= min_keep else 0
    return set(ids[remove:])


CASES = {
    "top_p small": (dict(samplers=["top_p"], top_p=0.3), lambda r: oracle_top_p(r, 0.3, 0)),
    "top_p large": (dict(samplers=["top_p"], top_p=0.995, min_keep=3), lambda r: oracle_top_p(r, 0.995, 3)),
    "min_p": (dict(samplers=["min_p"], min_p=0.05), lambda r: oracle_min_p(r, 0.05, 0)),
    "min_p min_keep": (dict(samplers=["min_p"], min_p=0.9, min_keep=7), lambda r: oracle_min_p(r, 0.9, 7)),
    "typical": (dict(samplers=["typ_p"], typical_p=0.6), lambda r: oracle_typical(r, 0.6, 0)),
    "typical min_keep": (dict(samplers=["typ_p"], typical_p=0.05, min_keep=5), lambda r: oracle_typical(r, 0.05, 5)),
    "xtc": (dict(samplers=["xtc"], xtc_probability=1.0, xtc_threshold=0.01), lambda r: oracle_xtc(r, 0.01, 0)),
    "xtc min_keep": (
        dict(samplers=["xtc"], xtc_probability=1.0, xtc_threshold=0.001, min_keep=50),
        lambda r: oracle_xtc(r, 0.001, 50),
    ),
    "top_k ties": (dict(samplers=["top_k"], top_k=37), lambda r: oracle_top_k(r, 37)),
}
NEUTRAL = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=0)


def sampler_for(fields: dict, top_k: int | None = None) -> SequenceSampler:
    fields = {**NEUTRAL, **fields}
    if top_k is not None:
        fields["samplers"] = ["top_k", *fields["samplers"]]
        fields["top_k"] = top_k
    return SequenceSampler(SamplingParams(**fields), n_ctx=64)


def kept_ids(row: np.ndarray) -> set[int]:
    return set(np.flatnonzero(np.isfinite(row)).tolist())


def assert_matches(kept: set[int], expected: set[int] | list[set[int]], row: int) -> None:
    acceptable = expected if isinstance(expected, list) else [expected]
    assert kept in acceptable, (row, len(kept), [len(a) for a in acceptable])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("finite", [None, 300], ids=["all-finite", "300-finite"])
def test_filters_without_candidate_list(case: str, finite: int | None, device: str) -> None:
    fields, oracle = CASES[case]
    logits = tie_heavy_logits(3, seed=len(case), finite=finite)
    out = run_chain(on_device(logits, device), [sampler_for(fields) for _ in range(3)])
    for row in range(3):
        assert_matches(kept_ids(out[row]), oracle(logits[row]), row)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", sorted(c for c in CASES if c != "top_k ties"))
def test_filters_after_top_k_and_mixed_batches(case: str, device: str) -> None:
    fields, oracle = CASES[case]
    logits = tie_heavy_logits(4, seed=len(case) + 100)
    # Rows 0 and 2 go through top_k first (so the chain knows their candidates); 1 and 3 do not.
    samplers = [sampler_for(fields, top_k=500), sampler_for(fields), sampler_for(fields, top_k=4000), sampler_for(fields)]
    out = run_chain(on_device(logits, device), samplers)
    for row, k in ((0, 500), (1, None), (2, 4000), (3, None)):
        row_logits = logits[row].copy()
        if k is not None:
            survivors = oracle_top_k(row_logits, k)
            row_logits[[i for i in range(N_VOCAB) if i not in survivors]] = -np.inf
        assert_matches(kept_ids(out[row]), oracle(row_logits), row)


def test_best_k_mask_takes_ties_by_id() -> None:
    logits = np.array([[1.0, 3.0, 2.0, 3.0, 2.0, 2.0, 0.0]], dtype=np.float32)
    mask = truncation.best_k_mask(logits, [3])
    assert np.flatnonzero(mask[0]).tolist() == [1, 2, 3]


@pytest.mark.parametrize("n_vocab", [300, 8192, 49152])
@pytest.mark.parametrize("width", [1, 3, 40, 100, 600, 4096])
def test_best_first_ids_are_a_stable_descending_sorts_first(n_vocab: int, width: int) -> None:
    """The selection without a sort (a threshold from group maxima) on rows full of ties: equal
    values, runs of -inf (a grammar's mask), zeros (removed probabilities), -0.0 next to 0.0."""
    generator = np.random.default_rng(n_vocab + width)
    rows = np.round(generator.standard_normal((6, n_vocab)) * 4).astype(np.float32)
    rows[1, generator.random(n_vocab) < 0.995] = -np.inf  # fewer finite entries than `width`, maybe
    rows[2] = np.where(generator.random(n_vocab) < 0.99, 0.0, generator.random(n_vocab)).astype(np.float32)
    rows[3] = np.where(generator.random(n_vocab) < 0.5, -0.0, 0.0).astype(np.float32)
    rows[4, :] = -np.inf
    rows[5, : n_vocab // 2] = 7.0  # more ties at the top than `width`
    expected = np.argsort(-rows, axis=1, kind="stable")[:, :width]
    assert np.array_equal(truncation.best_first_ids(rows, width), expected)
    for row in range(len(rows)):  # alone, too
        assert np.array_equal(truncation.best_first_ids(rows[row : row + 1], width)[0], expected[row])


def test_padded_sums_are_the_same_bits_whatever_the_padding() -> None:
    """A candidate list summed alone, or padded with zeros to a batch's widest row."""
    generator = np.random.default_rng(4)
    for width in (5, 9, 41, 130, 1000):
        row = np.exp(generator.standard_normal(width) * 3).astype(np.float32)
        alone = reductions.sum_padded_rows(row[None])[0]
        for pad in (1, 7, 100, 3000):
            padded = np.concatenate([row, np.zeros(pad, dtype=np.float32)])
            other = generator.random(width + pad).astype(np.float32)
            assert reductions.sum_padded_rows(np.stack([other, padded]))[1] == alone, (width, pad)


def test_vocabulary_sums_are_the_same_bits_in_any_batch() -> None:
    generator = np.random.default_rng(5)
    rows = np.exp(generator.standard_normal((5, 49157)) * 3).astype(np.float32)
    together = reductions.sum_rows(rows)
    for row in range(5):
        assert reductions.sum_rows(rows[row : row + 1])[0] == together[row]
        assert reductions.sum_rows(rows[[row, (row + 2) % 5]])[0] == together[row]


def test_a_row_draws_the_same_as_a_padded_list_or_as_a_whole_vocabulary_row() -> None:
    """The two forms of a row with few candidates: its weights in a list padded to a batch's width
    (beside another row), or at their ids in a row of the vocabulary."""
    generator = np.random.default_rng(6)
    n_vocab, width = 8192, truncation.SMALL_WIDTH
    for n in (1, 2, 37, 1000, width):
        ids = np.sort(generator.choice(n_vocab, n, replace=False))
        weights = np.exp(generator.standard_normal(n) * 3).astype(np.float32)
        weights[generator.random(n) < 0.2] = 0.0  # candidates whose weight underflowed
        weights[0] = 1.0
        whole = np.zeros(n_vocab, dtype=np.float32)
        whole[ids] = weights
        lists = generator.random((2, width)).astype(np.float32)
        lists[1] = 0.0
        lists[1, :n] = weights
        for u in [0.0, 1 - 2**-53, *generator.random(30)]:
            positions, totals = draw.draw_from_lists(lists, np.array([0.5, u]))
            token, total = draw.draw_from_row(whole, u, many=False)
            assert (ids[positions[1]], totals[1]) == (token, total), (n, u)
            assert weights[positions[1]] > 0


def test_the_draw_over_many_candidates_is_the_inverse_cdf() -> None:
    generator = np.random.default_rng(7)
    weights = np.exp(generator.standard_normal(49157) * 2).astype(np.float32)
    weights[generator.random(weights.size) < 0.3] = 0.0
    cdf = np.cumsum(weights.astype(np.float64))
    for u in generator.random(200):
        token, total = draw.draw_from_row(weights, u, many=True)
        assert total == pytest.approx(cdf[-1], rel=1e-12)
        assert token == int(np.searchsorted(cdf, u * cdf[-1], side="right"))
    assert draw.draw_from_row(weights, 1 - 2**-53, many=True)[0] == int(np.flatnonzero(weights)[-1])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "fields",
    [dict(top_k=0, min_p=0.0, top_p=1.0), dict(top_k=50, min_p=0.0, top_p=1.0)],
    ids=["whole-vocabulary", "candidate-list"],
)
def test_draw_is_the_inverse_cdf_in_vocabulary_order(fields: dict, device: str) -> None:
    logits = on_device(tie_heavy_logits(8, seed=7), device)
    samplers = []
    for row in range(8):
        params = SamplingParams(**{**NEUTRAL, **fields, "seed": row, "n_probs": 4, "post_sampling_probs": True})
        sampler = SequenceSampler(params, n_ctx=64)
        sampler.n_generated = 3 * row
        samplers.append(sampler)
    result = sample_batch(logits, samplers)
    final = run_chain(logits, samplers).astype(np.float64)
    for row, sampler in enumerate(samplers):
        weights = np.exp(final[row] - final[row].max())
        probs = weights / weights.sum()
        cdf = np.cumsum(probs)
        expected = int(np.searchsorted(cdf, sampler.draw_uniform() * cdf[-1], side="right"))
        assert result.token_ids[row] == expected
        top = result.probs[row].top
        assert [entry.token_id for entry in top] == order(np.where(probs > 0, probs, -np.inf))[:4]
        assert [entry.prob for entry in top] == pytest.approx(sorted(probs, reverse=True)[:4], rel=1e-5)
        assert result.probs[row].chosen.prob == pytest.approx(probs[expected], rel=1e-5)
