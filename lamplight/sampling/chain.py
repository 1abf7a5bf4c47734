"""The batched chain: grammar mask -> logit_bias -> forced tokens -> each row's samplers -> the draw."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import mirostat, temperature, truncation
from .arrays import as_logits, as_mask
from .draw import draw_from_lists, draw_from_row
from .dry import apply_dry
from .logit_bias import add_entries, apply_logit_bias, bias_entries
from .penalties import apply_penalties
from .probs import TokenProbs, final_token_probs, raw_token_probs
from .sequence import SequenceSampler
from .truncation import SMALL_WIDTH, count_candidates
from .xtc import xtc

logger = logging.getLogger(__name__)

NEG_INF = float("-inf")

# Called after each step with the step's name, the rows it ran on and the whole logits array.
StepObserver = Callable[[str, list[int], np.ndarray], None]


def _quiet_float_errors() -> np.errstate:
    """-inf - -inf, log(0) and 0/0 are expected on rows without candidates: no warnings."""
    return np.errstate(invalid="ignore", divide="ignore", over="ignore")


@dataclass
class SampleResult:
    token_ids: list[int]
    probs: list[TokenProbs | None]  # per row; None where the row asked for no n_probs


def sample_batch(
    logits: Any,
    samplers: Sequence[SequenceSampler],
    allowed_mask: Any = None,
    forced: Sequence[int | None] | None = None,
) -> SampleResult:
    """Sample one token per row of `logits` [B, V], row i with `samplers[i]`.

    `logits`: a numpy float array (a torch tensor is converted, see arrays.as_logits).
    `allowed_mask` [B, V] (bool, optional) comes from a grammar: False entries are removed before
    the chain. `forced` (optional, one entry per row): a token the row must produce (the
    reasoning budget closing a thinking block, lamplight.sampling.reasoning_budget), or None.
    A forced token is the row's only candidate whatever logit_bias says; a grammar that forbids
    it wins (the row is sampled as usual). A forced row is otherwise an ordinary step: it takes
    its uniform numbers as any step does. The samplers' state is not advanced: the engine calls
    `accept(token)` on each row's SequenceSampler once it keeps the token.
    """
    logits, allowed_mask = as_logits(logits), as_mask(allowed_mask)
    if logits.ndim != 2 or logits.shape[0] != len(samplers):
        raise ValueError(f"logits must be [len(samplers), n_vocab], got {tuple(logits.shape)}")
    if not samplers:
        return SampleResult([], [])
    forced_rows = _forced_rows(forced, allowed_mask, len(samplers))
    with _quiet_float_errors():
        if all(sampler.plain_greedy for sampler in samplers):
            tokens = _best_tokens(logits, samplers, allowed_mask, forced_rows)
            if tokens is not None:
                return SampleResult(tokens, [None] * len(samplers))
        state = _run_chain(logits, samplers, allowed_mask, forced=forced_rows)
        distribution = _FinalDistribution.drawn(state, [s.draw_uniform() for s in samplers])
        tokens = _fallback_for_empty_rows(distribution.tokens, distribution, logits, allowed_mask)
        for row, token in forced_rows.items():
            tokens[row] = token  # the chain keeps it as the only candidate; this makes it certain
        _propose_mirostat_mu(distribution, tokens, samplers)
        return SampleResult(tokens, _token_probs(logits, distribution, tokens, samplers))


def _best_tokens(logits: np.ndarray, samplers: Sequence[SequenceSampler], allowed_mask: np.ndarray | None,
                 forced: dict[int, int]) -> list[int] | None:
    """Rows that are all plain greedy (SequenceSampler.plain_greedy): the chain would keep each
    row's best candidate after the mask, logit_bias and forced tokens, and the draw would pick it
    (the lowest id among equal maxima, as the greedy step keeps), so that is computed directly.
    None if a row has no candidate left (the chain's fallback decides)."""
    if allowed_mask is None and not forced and logits.dtype == np.float32:
        if not any(sampler.logit_bias for sampler in samplers):
            return _argmax_tokens(logits)  # nothing to apply: no copy (a 16-row step's was 3 MiB)
        if logits.flags.writeable:
            with _biased_in_place(logits, samplers) as work:
                return _argmax_tokens(work)
    return _argmax_tokens(_constrained(logits, samplers, allowed_mask, forced))


def _argmax_tokens(work: np.ndarray) -> list[int] | None:
    tokens = work.argmax(axis=1)  # the first of equal maxima; a NaN wins, and is caught below
    best = work[np.arange(len(tokens)), tokens]
    if bool(np.isneginf(best).any()) or bool(np.isnan(best).any()):
        return None
    return tokens.tolist()


@contextmanager
def _biased_in_place(logits: np.ndarray, samplers: Sequence[SequenceSampler]) -> Iterator[np.ndarray]:
    """The logits with the rows' logit_bias added in place (apply_logit_bias's entries and float32
    sums, as on _constrained's copy), the entries it touched restored on exit. A bias touches a
    few entries where the copy moved the whole array: 0.24 ms of a 16-row step of the 1B file
    with the bench's ignore_eos (a bias), as much as the argmax itself."""
    rows = [row for row, sampler in enumerate(samplers) if sampler.logit_bias]
    index, values = bias_entries(logits.shape[1], rows, [samplers[row].logit_bias for row in rows])
    saved = logits[index]
    try:
        add_entries(logits, index, values)
        yield logits
    finally:
        logits[index] = saved


def run_chain(
    logits: Any,
    samplers: Sequence[SequenceSampler],
    allowed_mask: Any = None,
    on_step: StepObserver | None = None,
    forced: Sequence[int | None] | None = None,
) -> np.ndarray:
    """The logits the draw samples from: a new float32 array, removed candidates at -inf."""
    logits, allowed_mask = as_logits(logits), as_mask(allowed_mask)
    forced_rows = _forced_rows(forced, allowed_mask, len(samplers))
    with _quiet_float_errors():
        return _run_chain(logits, samplers, allowed_mask, on_step, forced_rows).work


def _forced_rows(
    forced: Sequence[int | None] | None, allowed_mask: np.ndarray | None, n_rows: int
) -> dict[int, int]:
    """{row: token} of the rows that produce a forced token (those whose grammar allows it)."""
    if forced is None:
        return {}
    if len(forced) != n_rows:
        raise ValueError(f"forced must have one entry per row ({n_rows}), got {len(forced)}")
    rows = {row: int(token) for row, token in enumerate(forced) if token is not None}
    if rows and allowed_mask is not None:
        allowed = allowed_mask[list(rows), list(rows.values())].tolist()
        rows = {row: token for (row, token), ok in zip(rows.items(), allowed) if ok}
    return rows


def _run_chain(
    logits: np.ndarray,
    samplers: Sequence[SequenceSampler],
    allowed_mask: np.ndarray | None,
    on_step: StepObserver | None = None,
    forced: dict[int, int] | None = None,
) -> _ChainState:
    work = _constrained(logits, samplers, allowed_mask, forced, on_step)
    state = _ChainState(work, len(samplers))
    for position in range(max(len(sampler.program) for sampler in samplers)):
        for name, rows in _rows_by_step(samplers, position).items():
            _STEPS[name](_Group(state, rows, [samplers[row] for row in rows]))
            if on_step is not None:
                on_step(name, rows, work)
    return state


def _constrained(logits: np.ndarray, samplers: Sequence[SequenceSampler], allowed_mask: np.ndarray | None,
                 forced: dict[int, int] | None, on_step: StepObserver | None = None) -> np.ndarray:
    """What every row's samplers start from: a float32 copy of the logits (C order: every row
    contiguous) with the grammar mask, logit_bias and forced tokens applied."""
    work = np.array(logits, dtype=np.float32, order="C")
    if allowed_mask is not None:
        truncation.keep_only(work, allowed_mask)
    biased = [row for row, sampler in enumerate(samplers) if sampler.logit_bias]
    if biased:
        apply_logit_bias(work, biased, [samplers[row].logit_bias for row in biased])
        if on_step is not None:
            on_step("logit_bias", biased, work)
    if forced:
        _keep_only_forced(work, forced)
        if on_step is not None:
            on_step("reasoning_budget", list(forced), work)
    return work


def _keep_only_forced(work: np.ndarray, forced: dict[int, int]) -> None:
    """Each forced row keeps its token alone, at logit 0 (whatever its logit or bias was), so
    every later sampler keeps it and the draw picks it."""
    rows = np.asarray(list(forced))
    work[rows] = NEG_INF
    work[rows, np.asarray(list(forced.values()))] = 0.0


def _rows_by_step(samplers: Sequence[SequenceSampler], position: int) -> dict[str, list[int]]:
    """Rows grouped by the sampler at `position` of their program; rows where it is off are left out."""
    groups: dict[str, list[int]] = {}
    for row, sampler in enumerate(samplers):
        if position < len(sampler.program) and sampler.program[position] is not None:
            groups.setdefault(sampler.program[position], []).append(row)
    return groups


class _ChainState:
    """What the steps learn about the rows' candidates: an upper bound on how many each row has
    and, after a top_k, a list of ids per row that covers all of them."""

    def __init__(self, work: np.ndarray, n_rows: int) -> None:
        self.work = work
        self.bounds = [work.shape[1]] * n_rows
        self.candidate_ids: np.ndarray | None = None  # [n_rows, w]; valid for covered rows
        self.covered = [False] * n_rows

    def cover(self, rows: list[int], ids: np.ndarray) -> None:
        if self.candidate_ids is None or self.candidate_ids.shape[1] != ids.shape[1]:
            self.candidate_ids = np.zeros((len(self.covered), ids.shape[1]), dtype=ids.dtype)
            self.covered = [False] * len(self.covered)
        self.candidate_ids[rows] = ids
        for row in rows:
            self.covered[row] = True

    def candidates_for(self, rows: list[int]) -> np.ndarray | None:
        if self.candidate_ids is None or not all(self.covered[row] for row in rows):
            return None
        if len(rows) == len(self.covered):
            return self.candidate_ids
        return self.candidate_ids[rows]


@dataclass
class _Group:
    """The rows one step runs on, with their samplers."""

    state: _ChainState
    rows: list[int]
    samplers: list[SequenceSampler]

    @property
    def work(self) -> np.ndarray:
        return self.state.work

    def params(self, name: str) -> list:
        return [getattr(s.params, name) for s in self.samplers]

    def subset(self, keep: list[bool]) -> _Group:
        rows = [row for row, k in zip(self.rows, keep) if k]
        return _Group(self.state, rows, [s for s, k in zip(self.samplers, keep) if k])

    def routes(self) -> list[tuple[_Group, truncation.Hint]]:
        """These rows split by how a filter handles them, each part with where its candidates
        are. Rows with a candidate list (top_k's ids) and rows with at most SMALL_WIDTH
        candidates (a bound on them) work on sorted candidate lists; rows with more, on the
        whole vocabulary. Which of the two a row takes depends on the row alone, never on the
        rows beside it, so its sums are the ones it gets alone (see reductions). Empty parts are
        left out."""
        covered = [self.state.covered[row] for row in self.rows]
        listed, rest = self.subset(covered), self.subset([not c for c in covered])
        parts = []
        if listed.rows:
            parts.append((listed, truncation.Hint(ids=self.state.candidates_for(listed.rows))))
        rest.count_wide_rows()
        few = [self.state.bounds[row] <= SMALL_WIDTH for row in rest.rows]
        for part in (rest.subset(few), rest.subset([not f for f in few])):
            if part.rows:
                parts.append((part, truncation.Hint(width=max(self.state.bounds[row] for row in part.rows))))
        return parts

    def count_wide_rows(self) -> None:
        """A bound above SMALL_WIDTH becomes the row's exact number of candidates (one pass)."""
        wide = [row for row in self.rows if self.state.bounds[row] > SMALL_WIDTH]
        if wide:
            rows = self.work if len(wide) == self.work.shape[0] else self.work[wide]
            for row, count in zip(wide, count_candidates(rows).tolist()):
                self.state.bounds[row] = max(min(self.state.bounds[row], count), 1)

    def limit(self, bounds: Sequence[int]) -> None:
        for row, bound in zip(self.rows, bounds):
            self.state.bounds[row] = min(self.state.bounds[row], max(bound, 1))

    def apply(self, operation: Callable[[np.ndarray], object]) -> object:
        """Run an in-place [rows, V] operation on these rows (no copy when they are all rows)."""
        if len(self.rows) == self.work.shape[0]:
            return operation(self.work)
        sub = self.work[self.rows]  # a contiguous copy
        result = operation(sub)
        self.work[self.rows] = sub
        return result


def _step_penalties(group: _Group) -> None:
    apply_penalties(
        group.work,
        group.rows,
        [s.penalty_window for s in group.samplers],
        group.params("repeat_penalty"),
        group.params("frequency_penalty"),
        group.params("presence_penalty"),
    )


def _step_dry(group: _Group) -> None:
    apply_dry(group.work, group.rows, [s.dry for s in group.samplers])


def _step_top_n_sigma(group: _Group) -> None:
    group.apply(lambda sub: truncation.top_n_sigma(sub, group.params("top_n_sigma")))


def _step_top_k(group: _Group) -> None:
    k = group.params("top_k")
    group.state.cover(group.rows, group.apply(lambda sub: truncation.top_k(sub, k)))
    group.limit(k)


def _per_route(step: Callable[[_Group, truncation.Hint], None]) -> Callable[[_Group], None]:
    """Run `step` separately on each part of _Group.routes."""

    def run(group: _Group) -> None:
        for part, hint in group.routes():
            step(part, hint)

    return run


@_per_route
def _step_typical(group: _Group, hint: truncation.Hint) -> None:
    p, min_keep = group.params("typical_p"), group.params("min_keep")
    group.apply(lambda sub: truncation.typical(sub, p, min_keep, hint))


@_per_route
def _step_top_p(group: _Group, hint: truncation.Hint) -> None:
    p, min_keep = group.params("top_p"), group.params("min_keep")
    group.apply(lambda sub: truncation.top_p(sub, p, min_keep, hint))


@_per_route
def _step_min_p(group: _Group, hint: truncation.Hint) -> None:
    p, min_keep = group.params("min_p"), group.params("min_keep")
    group.apply(lambda sub: truncation.min_p(sub, p, min_keep, hint))


def _step_xtc(group: _Group) -> None:
    _xtc_triggered(group.subset([s.xtc_triggered() for s in group.samplers]))


@_per_route
def _xtc_triggered(group: _Group, hint: truncation.Hint) -> None:
    threshold, min_keep = group.params("xtc_threshold"), group.params("min_keep")
    group.apply(lambda sub: xtc(sub, threshold, min_keep, hint))


def _step_temperature(group: _Group) -> None:
    # Mirostat uses plain temperature: dynatemp is part of the sampler list it replaces.
    dynamic = [s.params.dynatemp_range > 0 and not s.mirostat for s in group.samplers]
    temperatures = group.params("temperature")
    _greedy(group.subset([not d and t <= 0 for d, t in zip(dynamic, temperatures)]))
    _scale(group.subset([not d and t > 0 and t != 1.0 for d, t in zip(dynamic, temperatures)]))
    _dynamic_temperature(group.subset(dynamic))


@_per_route
def _greedy(group: _Group, hint: truncation.Hint) -> None:
    group.apply(lambda sub: temperature.greedy(sub, hint))
    group.limit([1] * len(group.rows))


@_per_route
def _scale(group: _Group, hint: truncation.Hint) -> None:
    group.apply(lambda sub: temperature.scale(sub, group.params("temperature"), hint))


@_per_route
def _dynamic_temperature(group: _Group, hint: truncation.Hint) -> None:
    args = [group.params(name) for name in ("temperature", "dynatemp_range", "dynatemp_exponent")]
    group.apply(lambda sub: temperature.dynamic_temperature(sub, *args, hint=hint))


def _step_mirostat_v1(group: _Group) -> None:
    group.apply(lambda sub: mirostat.mirostat_v1(sub, [s.mu for s in group.samplers]))


def _step_mirostat_v2(group: _Group) -> None:
    group.apply(lambda sub: mirostat.mirostat_v2(sub, [s.mu for s in group.samplers]))


_STEPS: dict[str, Callable[[_Group], None]] = {
    "penalties": _step_penalties,
    "dry": _step_dry,
    "top_n_sigma": _step_top_n_sigma,
    "top_k": _step_top_k,
    "typ_p": _step_typical,
    "top_p": _step_top_p,
    "min_p": _step_min_p,
    "xtc": _step_xtc,
    "temperature": _step_temperature,
    "mirostat_v1": _step_mirostat_v1,
    "mirostat_v2": _step_mirostat_v2,
}


@dataclass
class _FinalDistribution:
    """Each row's final distribution, in vocabulary order, and the token drawn from it: over
    compact lists of candidate ids (ascending) when every row has few candidates, else over whole
    vocabulary rows. The totals and the draw (lamplight.sampling.draw) give a row the same bits
    in either form and whatever else is in the batch."""

    weights: np.ndarray  # float32 exp(logit - max): [B, V], or [B, width] aligned with `ids`
    totals: np.ndarray  # float64 [B]; NaN on a row without candidates
    ids: np.ndarray | None  # [B, width] ascending token ids, or None for the whole vocabulary
    tokens: list[int]  # the draw

    @classmethod
    def drawn(cls, state: _ChainState, uniforms: list[float]) -> _FinalDistribution:
        final = state.work
        ids = state.candidates_for(list(range(final.shape[0])))
        width = max(state.bounds) if ids is None else ids.shape[1]
        counts = count_candidates(final) if width > SMALL_WIDTH else None
        if counts is not None and int(counts.max()) > SMALL_WIDTH:
            weights = _weights(final)
            draws = [draw_from_row(row, u, count > SMALL_WIDTH) for row, u, count in zip(weights, uniforms, counts)]
            return cls(weights, np.array([total for _, total in draws]), None, [token for token, _ in draws])
        if ids is None:
            ids = _finite_ids(final, width if counts is None else int(counts.max()))
        ids = np.sort(ids, axis=1)
        weights = _weights(np.take_along_axis(final, ids, axis=1))
        positions, totals = draw_from_lists(weights, np.asarray(uniforms, dtype=np.float64))
        return cls(weights, totals, ids, np.take_along_axis(ids, positions[:, None], axis=1)[:, 0].tolist())

    def empty_rows(self) -> list[int]:
        # A row without any finite logit has NaN weights.
        return np.flatnonzero(np.isnan(self.totals)).tolist()

    def probability(self, rows: list[int], tokens: list[int]) -> list[float]:
        probs, ids = self.rows(rows)
        chosen = np.asarray(tokens, dtype=np.int64)[:, None]
        if ids is None:
            return np.take_along_axis(probs, chosen, axis=1)[:, 0].tolist()
        return np.where(ids == chosen, probs, np.float32(0.0)).sum(axis=1).tolist()

    def rows(self, rows: list[int]) -> tuple[np.ndarray, np.ndarray | None]:
        """(probs, ids) of some rows: float32 probabilities, NaN on a row without candidates."""
        probs = (self.weights[rows] / self.totals[rows, None]).astype(np.float32)
        return probs, None if self.ids is None else self.ids[rows]


def _weights(logits: np.ndarray) -> np.ndarray:
    return np.exp(logits - logits.max(axis=1, keepdims=True))


def _finite_ids(logits: np.ndarray, width: int) -> np.ndarray:
    """[rows, width]: each row's ids of finite logits (at most `width`), then the id of one of its
    -inf entries as often as needed: ids to read the candidates at (never to write through)."""
    width = max(width, 1)
    ids = np.empty((logits.shape[0], width), dtype=np.int64)
    for row, values in enumerate(logits):
        finite = np.flatnonzero(values > NEG_INF)
        ids[row, : finite.size] = finite
        ids[row, finite.size :] = values.argmin()  # -inf wherever the row has fewer than `width`
    return ids


def _fallback_for_empty_rows(
    tokens: list[int], distribution: _FinalDistribution, logits: np.ndarray, allowed_mask: np.ndarray | None
) -> list[int]:
    """A row whose biases or grammar removed every token gets the best allowed (else best) raw token."""
    empty = distribution.empty_rows()
    if not empty:
        return tokens
    tokens = list(tokens)
    for row in empty:
        row_logits = logits[row].astype(np.float32)
        if allowed_mask is not None and bool(allowed_mask[row].any()):
            row_logits = np.where(allowed_mask[row], row_logits, np.float32(NEG_INF))
        tokens[row] = int(row_logits.argmax())
        logger.warning("sampling: every token of row %d was removed; falling back to token %d", row, tokens[row])
    return tokens


def _propose_mirostat_mu(
    distribution: _FinalDistribution, tokens: list[int], samplers: Sequence[SequenceSampler]
) -> None:
    rows = [row for row, s in enumerate(samplers) if s.mirostat]
    if rows:
        probabilities = distribution.probability(rows, [tokens[row] for row in rows])
        for row, probability in zip(rows, probabilities):
            samplers[row].propose_mu(tokens[row], probability)


def _token_probs(
    logits: np.ndarray, distribution: _FinalDistribution, tokens: list[int], samplers: Sequence[SequenceSampler]
) -> list[TokenProbs | None]:
    result: list[TokenProbs | None] = [None] * len(samplers)
    for post_sampling in (False, True):
        rows = [
            row
            for row, s in enumerate(samplers)
            if s.params.n_probs > 0 and s.params.post_sampling_probs == post_sampling
        ]
        if not rows:
            continue
        chosen = [tokens[row] for row in rows]
        n_probs = [samplers[row].params.n_probs for row in rows]
        if post_sampling:
            probs, ids = distribution.rows(rows)
            found = final_token_probs(probs, chosen, n_probs, ids)
        else:
            found = raw_token_probs(logits[rows], chosen, n_probs)
        for row, entry in zip(rows, found):
            result[row] = entry
    return result
