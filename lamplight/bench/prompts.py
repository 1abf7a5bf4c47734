"""Deterministic English-like prompts of a target token length, without a local tokenizer.

Each prompt is built from seeded random common words, so the same seed gives the same prompts
for every server in a run. Every request gets its own key, and different keys diverge from the
first word on: a server's prefix cache cannot make one request look faster thanks to another
(except in the prefix-cache scenario, where sharing is the point).

Lengths are calibrated with a server's /tokenize endpoint when one is available; otherwise we
assume one token per word, which is close for common English words with BPE vocabularies.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Awaitable, Callable

WORDS = tuple("""
time year people way day man thing woman life child world school state family student group
country problem hand part place case week company system program question work government
number night point home water room mother area money story fact month right study book eye job
word business issue side kind head house service friend father power hour game line end member
law car city community name team minute idea body information back parent face level office
door health person art war history party result change morning reason research girl moment air
teacher force education river garden window kitchen table letter music market field
light voice paper church summer winter forest island bridge train station doctor engine
small large early young important public bad same able green quiet bright simple strong warm
open ready happy careful gentle heavy final modern natural local certain clear whole recent
make know take see come think look want give use find tell ask seem feel try leave call keep
begin help show hear play run move live believe bring happen write provide sit stand lose pay
meet include continue learn lead understand watch follow stop create speak read spend grow
walk carry build stay fall cut reach remember consider appear buy wait serve send expect
""".split())

SENTENCE_LENGTHS = (7, 9, 11, 13)

TokenCounter = Callable[[str], Awaitable[int | None]]


@dataclass(frozen=True)
class Prompt:
    """A user turn, optionally after a shared system prompt."""

    user: str
    system: str = ""
    target_tokens: int = 0
    # As counted by the calibrating server's tokenizer; None when none was available.
    counted_tokens: int | None = None

    def text(self) -> str:
        """The prompt as one string, for /v1/completions."""
        return f"{self.system}\n\n{self.user}" if self.system else self.user

    def messages(self) -> list[dict]:
        """The prompt as chat messages, for /v1/chat/completions."""
        messages = [{"role": "system", "content": self.system}] if self.system else []
        return messages + [{"role": "user", "content": self.user}]

    @property
    def tokens(self) -> int:
        return self.counted_tokens if self.counted_tokens is not None else self.target_tokens


def render_words(seed: int, key: str, count: int) -> str:
    """`count` words as sentences; a longer count extends the same text (a shared prefix)."""
    rng = random.Random(f"{seed}/{key}")
    sentences: list[str] = []
    remaining = count
    while remaining > 0:
        size = min(remaining, rng.choice(SENTENCE_LENGTHS))
        words = [rng.choice(WORDS) for _ in range(size)]
        sentences.append(" ".join([words[0].capitalize(), *words[1:]]) + ".")
        remaining -= size
    return " ".join(sentences)


class PromptFactory:
    """Makes prompts of a given token length; `calibrate` first when a tokenizer is at hand."""

    MAX_FIT_STEPS = 4

    def __init__(self, seed: int, count_tokens: TokenCounter | None = None):
        self.seed = seed
        self.tokens_per_word = 1.0
        self._count_tokens = count_tokens
        self._cache: dict[tuple[int, str], tuple[str, int | None]] = {}

    async def calibrate(self, sample_words: int = 600) -> None:
        if self._count_tokens is None:
            return
        tokens = await self._count_tokens(render_words(self.seed, "calibration", sample_words))
        if tokens:
            self.tokens_per_word = tokens / sample_words

    async def prompt(self, n_tokens: int, key: str, system: Prompt | None = None) -> Prompt:
        """A prompt with a user turn of about n_tokens; `system` supplies a shared system text."""
        text, counted = await self.fitted_text(n_tokens, key)
        if system is None:
            return Prompt(user=text, target_tokens=n_tokens, counted_tokens=counted)
        total_counted = None if counted is None else counted + system.tokens
        return Prompt(user=text, system=system.user, target_tokens=n_tokens + system.target_tokens,
                      counted_tokens=total_counted)

    async def fitted_text(self, n_tokens: int, key: str) -> tuple[str, int | None]:
        """Text of about n_tokens tokens and its measured count (None without a tokenizer)."""
        if (n_tokens, key) not in self._cache:
            self._cache[(n_tokens, key)] = await self._fit(n_tokens, key)
        return self._cache[(n_tokens, key)]

    async def _fit(self, n_tokens: int, key: str) -> tuple[str, int | None]:
        words = max(1, round(n_tokens / self.tokens_per_word))
        if self._count_tokens is None:
            return render_words(self.seed, key, words), None
        best: tuple[str, int] | None = None
        for _ in range(self.MAX_FIT_STEPS):
            text = render_words(self.seed, key, words)
            counted = await self._count_tokens(text)
            if counted is None:
                return text, None
            if best is None or abs(counted - n_tokens) < abs(best[1] - n_tokens):
                best = (text, counted)
            if counted == n_tokens:
                break
            step = round((n_tokens - counted) / self.tokens_per_word)
            words = max(1, words + (step or (1 if counted < n_tokens else -1)))
        return best
