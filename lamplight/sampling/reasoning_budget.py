"""The reasoning budget: llama.cpp's `--reasoning-budget N` (common/reasoning-budget.cpp).

One state machine per generated sequence (each choice of each request) limits the tokens of its
first thinking block to N, then closes the block by forcing tokens:

    IDLE          watches the generated tokens for the start marker's token sequence
    COUNTING      each generated token inside the thinking counts; the end marker -> DONE
    WAITING_UTF8  the budget is used up, but the text stops inside a UTF-8 character: tokens
                  go through until it is complete (the end marker -> DONE)
    FORCING       one token per step: the budget message's tokens (if any), then the end
                  marker's (and the answer prefix of families that have one); then DONE
    DONE          pass-through forever: only the first thinking block is limited

A prompt whose generation prompt already opened the thinking (Qwen3's `<think>\\n`, templates
that always think) starts in COUNTING: llama.cpp feeds the generation prompt through the
sampler, so it sees the start marker there. A budget of 0 forces as soon as thinking starts.

The engine asks `forced_token()` before each step and `accept(token)` after it; the sampler
chain (lamplight.sampling.chain.sample_batch `forced`) then leaves the forced token as the row's
only candidate, over logit_bias and ignore_eos's bans. The step is otherwise an ordinary one:
the row still takes its counter-based uniform numbers (which depend only on the request's seed
and the number of tokens it generated, never on the batch), the forced token is recorded by
penalties/DRY/mirostat as any generated token, counts toward max_tokens and shows in the text.

Where this differs from llama.cpp on purpose:
* the matchers recognise a marker at any offset (llama.cpp's matcher restarts only on the
  marker's first token, so it misses e.g. `aab` in `aaab`);
* the UTF-8 check follows the text across tokens (a character split over three tokens is
  complete only after the third), where llama.cpp looks at each token's piece alone;
* a forced token the request's grammar forbids is not forced: the grammar wins, and the
  forcing ends (DONE) as soon as a token other than the forced one is accepted (llama.cpp
  would sample from an all -inf row);
* whether the prompt opened the thinking is read from the prompt's text (the same rule as the
  reasoning parser, lamplight.chat.reasoning), not by matching tokens of the generation prompt.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass


class BudgetState(enum.Enum):
    IDLE = "idle"
    COUNTING = "counting"
    WAITING_UTF8 = "waiting_utf8"
    FORCING = "forcing"
    DONE = "done"


@dataclass(frozen=True)
class ReasoningBudgetSpec:
    """What one request's reasoning budget needs (token ids of the model's tokenizer)."""

    budget: int  # tokens of thinking allowed, >= 0
    start: tuple[int, ...]  # the thinking start marker
    end: tuple[int, ...]  # the thinking end marker (its natural end)
    forced: tuple[int, ...]  # forced once the budget is used up: message, end marker[, answer prefix]
    opened: bool = False  # the prompt already opened the thinking: start in COUNTING

    def validate(self) -> None:
        """ValueError("reasoning_budget_tokens: <reason>") for an unusable spec."""
        if isinstance(self.budget, bool) or not isinstance(self.budget, int) or self.budget < 0:
            raise ValueError(f"reasoning_budget_tokens: must be an integer >= 0, got {self.budget!r}")
        if not self.end or not self.forced:
            raise ValueError("reasoning_budget_tokens: the end marker and the forced tokens must not be empty")
        if not self.start and not self.opened:
            raise ValueError("reasoning_budget_tokens: a start marker is needed unless the prompt opened thinking")


class _Matcher:
    """Whether the tokens seen so far end with `tokens` (any offset, overlaps included)."""

    def __init__(self, tokens: Sequence[int]) -> None:
        self.tokens = tuple(tokens)
        self._recent: deque[int] = deque(maxlen=max(len(self.tokens), 1))

    def feed(self, token: int) -> bool:
        self._recent.append(token)
        return bool(self.tokens) and len(self._recent) == len(self.tokens) and tuple(self._recent) == self.tokens

    def reset(self) -> None:
        self._recent.clear()


def utf8_missing(missing: int, data: bytes) -> int:
    """Continuation bytes the text still lacks after `data`, `missing` being what it lacked before.

    0 means the text ends at a character boundary. A byte that cannot continue the current
    character ends it (the decoder shows U+FFFD for it) and starts over, as a decoder does.
    """
    for byte in data:
        if missing and 0x80 <= byte < 0xC0:
            missing -= 1
        elif 0xC2 <= byte < 0xE0:
            missing = 1
        elif 0xE0 <= byte < 0xF0:
            missing = 2
        elif 0xF0 <= byte < 0xF5:
            missing = 3
        else:  # ASCII, a stray continuation byte or a byte UTF-8 never uses: a boundary
            missing = 0
    return missing


class ReasoningBudget:
    """One sequence's budget state; deterministic, a function of the spec and the accepted tokens."""

    def __init__(self, spec: ReasoningBudgetSpec, token_bytes: Callable[[int], bytes] | None = None) -> None:
        """`token_bytes`: a token's text as bytes (the tokenizer's), for the UTF-8 check; without
        it every token ends at a character boundary."""
        spec.validate()
        self.spec = spec
        self._token_bytes = token_bytes
        self._start = _Matcher(spec.start)
        self._end = _Matcher(spec.end)
        self.state = BudgetState.IDLE
        self.remaining = spec.budget
        self._missing = 0  # UTF-8 continuation bytes the thinking text lacks
        self._force_pos = 0
        if spec.opened:
            self._begin_thinking()

    def forced_token(self) -> int | None:
        """The token the next step must produce, or None to sample freely."""
        if self.state is BudgetState.FORCING:
            return self.spec.forced[self._force_pos]
        return None

    def accept(self, token: int) -> None:
        """Record a generated token (forced or not)."""
        state = self.state
        if state is BudgetState.IDLE:
            if self._start.feed(token):
                self._begin_thinking()
        elif state is BudgetState.COUNTING or state is BudgetState.WAITING_UTF8:
            self._accept_thinking(token)
        elif state is BudgetState.FORCING:
            self._accept_forced(token)

    def _begin_thinking(self) -> None:
        self.remaining = self.spec.budget
        self._end.reset()
        self._missing = 0
        if self.remaining <= 0:
            self._start_forcing()
        else:
            self.state = BudgetState.COUNTING

    def _accept_thinking(self, token: int) -> None:
        if self._end.feed(token):
            self.state = BudgetState.DONE  # the model closed its thinking itself
            return
        if self._token_bytes is not None:
            self._missing = utf8_missing(self._missing, self._token_bytes(token))
        at_boundary = self._missing == 0
        if self.state is BudgetState.COUNTING:
            self.remaining -= 1
            if self.remaining <= 0:
                if at_boundary:
                    self._start_forcing()
                else:
                    self.state = BudgetState.WAITING_UTF8
        elif at_boundary:
            self._start_forcing()

    def _start_forcing(self) -> None:
        self.state = BudgetState.FORCING
        self._force_pos = 0
        self._end.reset()

    def _accept_forced(self, token: int) -> None:
        if token != self.spec.forced[self._force_pos]:
            self.state = BudgetState.DONE  # something stronger (the request's grammar) chose otherwise
            return
        self._force_pos += 1
        if self._force_pos >= len(self.spec.forced):
            self.state = BudgetState.DONE
