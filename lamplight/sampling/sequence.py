"""SequenceSampler: one request's (one choice's) sampling parameters and state between tokens."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from .dry import BreakerTable, DryState
from .mirostat import updated_mu
from .params import SamplingParams, effective_seed, parse_samplers
from .penalties import PenaltyWindow
from .rng import PURPOSE_DRAW, PURPOSE_XTC, counter_uniform


class SequenceSampler:
    """Holds what sampling one sequence needs across steps: the seed and the number of generated
    tokens (which together pick the random numbers), mirostat's mu, the penalty window and the
    DRY state. The engine feeds every prompt token (`accept_many` or `accept(..., False)`) and,
    after its own checks, every generated token (`accept`). `sample_batch` never calls accept.
    """

    def __init__(
        self,
        params: SamplingParams,
        *,
        tokenizer: Any = None,
        n_ctx: int,
        choice_index: int = 0,
        eog_ids: frozenset[int] = frozenset(),
        breakers: BreakerTable | None = None,
    ) -> None:
        """`breakers`: DRY's breaker table when the caller built it already (it walks the
        vocabulary, so a server builds it before the request reaches the engine thread)."""
        params.validate()
        self.params = params
        self.seed = effective_seed(params.seed)
        self.choice_index = choice_index
        self.n_generated = 0
        self.mu = float(np.float32(2.0 * params.mirostat_tau))
        self._pending_mu: tuple[int, float] | None = None
        self.logit_bias: list[tuple[int, float]] = list(params.logit_bias)
        if params.ignore_eos:
            self.logit_bias += [(token, -math.inf) for token in sorted(eog_ids)]
        self.program: tuple[str | None, ...] = _program(params)
        self.plain_greedy = _plain_greedy(params, self.program)
        self.penalty_window = _penalty_window(params, n_ctx) if "penalties" in self.program else None
        self.dry = _dry_state(params, tokenizer, n_ctx, breakers) if "dry" in self.program else None

    def accept(self, token_id: int, is_generated: bool = True) -> None:
        """Record a token of the sequence: a prompt token (is_generated=False) or a generated one."""
        if self.penalty_window is not None:
            self.penalty_window.accept(token_id)
        if self.dry is not None:
            self.dry.accept(token_id)
        if is_generated:
            if self._pending_mu is not None and self._pending_mu[0] == token_id:
                self.mu = self._pending_mu[1]
            self._pending_mu = None
            self.n_generated += 1

    def accept_many(self, token_ids: Iterable[int], is_generated: bool = False) -> None:
        """Record many tokens at once (the prompt); cheaper than accept() one by one."""
        token_ids = list(token_ids)
        if is_generated:
            for token_id in token_ids:
                self.accept(token_id, True)
            return
        if self.penalty_window is not None:
            for token_id in token_ids:
                self.penalty_window.accept(token_id)
        if self.dry is not None:
            self.dry.accept_many(token_ids)

    @property
    def mirostat(self) -> int:
        return self.params.mirostat

    def uniform(self, purpose: int) -> float:
        return counter_uniform(self.seed, self.n_generated, self.choice_index, purpose)

    def draw_uniform(self) -> float:
        return self.uniform(PURPOSE_DRAW)

    def xtc_triggered(self) -> bool:
        return self.uniform(PURPOSE_XTC) < self.params.xtc_probability

    def propose_mu(self, token_id: int, probability: float) -> None:
        """Mirostat: the mu that takes effect if `token_id` is accepted next."""
        p = self.params
        self._pending_mu = (token_id, updated_mu(self.mu, p.mirostat_tau, p.mirostat_eta, probability))


def uses_dry(params: SamplingParams) -> bool:
    """Whether DRY runs for these parameters (then it needs a breaker table)."""
    return "dry" in _program(params)


def _program(params: SamplingParams) -> tuple[str | None, ...]:
    """The row's chain after logit_bias; a sampler its parameters disable is None (identity)."""
    if params.mirostat:
        temperature = "temperature" if params.temperature != 1.0 else None
        return (temperature, f"mirostat_v{params.mirostat}")
    return tuple(name if _enabled(name, params) else None for name in parse_samplers(params.samplers))


# Samplers that always keep the best candidate: before a greedy temperature step they change nothing.
_KEEP_THE_BEST = frozenset({"top_k", "top_p", "min_p", "top_n_sigma", "temperature"})


def _plain_greedy(params: SamplingParams, program: tuple[str | None, ...]) -> bool:
    """Whether the row's token is the best logit after logit_bias (and a grammar mask or forced
    token): a greedy temperature step, no sampler that can drop the best token or change the
    logits, no probabilities to report. sample_batch then skips the chain."""
    return (not params.mirostat and params.temperature <= 0.0 and params.dynatemp_range == 0.0
            and params.n_probs == 0 and "temperature" in program
            and all(step is None or step in _KEEP_THE_BEST for step in program))


def _enabled(name: str, p: SamplingParams) -> bool:
    if name == "penalties":
        neutral = p.repeat_penalty == 1.0 and p.frequency_penalty == 0.0 and p.presence_penalty == 0.0
        return p.repeat_last_n != 0 and not neutral
    if name == "dry":
        return p.dry_multiplier != 0.0 and p.dry_penalty_last_n != 0
    if name == "top_n_sigma":
        return p.top_n_sigma > 0
    if name == "top_k":
        return p.top_k > 0
    if name == "typ_p":
        return p.typical_p < 1.0
    if name == "top_p":
        return p.top_p < 1.0
    if name == "min_p":
        return p.min_p > 0.0
    if name == "xtc":
        return p.xtc_probability > 0.0 and p.xtc_threshold <= 0.5
    if name == "temperature":
        return p.dynatemp_range > 0.0 or p.temperature != 1.0
    raise ValueError(f"samplers: unknown sampler {name!r}")


def _window_size(last_n: int, n_ctx: int) -> int:
    return n_ctx if last_n == -1 else last_n


def _penalty_window(params: SamplingParams, n_ctx: int) -> PenaltyWindow:
    return PenaltyWindow(_window_size(params.repeat_last_n, n_ctx))


def _dry_state(params: SamplingParams, tokenizer: Any, n_ctx: int, breakers: BreakerTable | None) -> DryState:
    if breakers is None:
        if tokenizer is None:
            raise ValueError("dry_multiplier: DRY needs the model's tokenizer for its sequence breakers")
        breakers = BreakerTable.for_tokenizer(tokenizer, params.dry_sequence_breakers)
    return DryState(
        breakers,
        multiplier=params.dry_multiplier,
        base=params.dry_base,
        allowed_length=params.dry_allowed_length,
        window=_window_size(params.dry_penalty_last_n, n_ctx),
    )
