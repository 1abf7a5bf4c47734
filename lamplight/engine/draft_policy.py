"""Whether a step's sequences draft at all: speculation only where it pays.

A draft's rows are verified in the step whether they are accepted or not, and a draft model's
forwards come on top. With one or two sequences a step is bound by reading the weights and a few
more rows cost little; with many sequences the rows are bound by compute, and each costs about
as much as the tokens it can save (measured: SmolLM2 F16 drafted by its Q4_1, 4 requests at a
time, 190 tok/s drafting every step against 250 without).

So the engine measures both: for each number of decoding sequences (two or more: one sequence
always drafts, its rows cost next to nothing, and a draft model that disagrees pauses itself,
speculative.speculator.DraftCap), the tokens a second of its steps that drafted (the tokens kept,
over the step and the draft model's forwards) and of those that did not, as decayed sums of
tokens and of seconds (a step's acceptance varies; the sums average it). A step drafts when
drafting has been the faster. Every so often a step does the other thing, so that both stay
measured: after EXPLORE_EVERY steps, then twice as many each time the decision stays the same,
up to EXPLORE_MOST. A draft model reads every
token it has not seen when it drafts again after a pause, a cost of switching rather than of
drafting: such a step is not measured, and an exploring draft lasts two steps for that.

Drafts never change tokens (lamplight.engine.speculation), so this changes speed alone; the
reproducibility rule holds whatever it decides.
"""

from __future__ import annotations

DECAY = 0.7  # weight of the past in each side's sums, per step measured (one side may be measured once in 256 steps)
EXPLORE_EVERY = 16  # steps before the first step that does the other thing
EXPLORE_MOST = 256  # steps between such steps, at most
EXPLORE_DRAFT_STEPS = 2  # an exploring draft: the first step catches up, the second is measured


class DraftPolicy:
    """`allow(n)` before a step's drafts, `observe_step` after the step."""

    def __init__(self):
        self._sums: dict[tuple[int, bool], tuple[float, float]] = {}  # (sequences, drafted) -> tokens, seconds
        self._decision: bool | None = None
        self._gap = EXPLORE_EVERY
        self._since = 0
        self._exploring = 0  # steps left of an exploring draft
        self._drafted_last = False

    def rate(self, n_decode: int, drafted: bool) -> float | None:
        """Tokens a second of the steps of `n_decode` sequences that drafted (or not); None: none seen."""
        sums = self._sums.get((n_decode, drafted))
        return sums[0] / sums[1] if sums is not None else None

    def pays(self, n_decode: int) -> bool | None:
        """Whether drafting has been the faster with `n_decode` sequences; None: not measured yet."""
        with_draft, without = self.rate(n_decode, True), self.rate(n_decode, False)
        if with_draft is None or without is None:
            return None
        return with_draft >= without

    def allow(self, n_decode: int) -> bool:
        """Whether this step's `n_decode` decoding sequences draft."""
        if n_decode < 2:
            return True
        if self._exploring:
            self._exploring -= 1
            return True
        decision = self.pays(n_decode)
        if decision is None:  # measure the side not measured yet, drafting first
            if self.rate(n_decode, True) is None:
                self._exploring = EXPLORE_DRAFT_STEPS - 1
                return True
            return False
        if decision != self._decision:
            self._decision, self._gap, self._since = decision, EXPLORE_EVERY, 0
        self._since += 1
        if self._since < self._gap:
            return decision
        self._since, self._gap = 0, min(2 * self._gap, EXPLORE_MOST)
        if decision:
            return False
        self._exploring = EXPLORE_DRAFT_STEPS - 1
        return True

    def observe_step(self, n_decode: int, drafted: bool, tokens: int, seconds: float) -> None:
        """A step of `n_decode` decoding sequences (no prompt rows) kept `tokens` tokens in
        `seconds` (a draft model's forwards included); `drafted`: whether any of them drafted."""
        switched = drafted and not self._drafted_last
        self._drafted_last = drafted
        if switched or seconds <= 0 or n_decode <= 0:
            return
        key = (n_decode, drafted)
        old_tokens, old_seconds = self._sums.get(key, (0.0, 0.0))
        self._sums[key] = (DECAY * old_tokens + tokens, DECAY * old_seconds + seconds)
