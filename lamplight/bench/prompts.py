"""Deterministic English-like prompts of a target token length, without a local tokenizer.

Each prompt is built from seeded random common words, so the same seed gives the same prompts
for every server in a run. Every request gets its own key, and different keys diverge from the
first word on: a server's prefix cache cannot make one request look faster thanks to another
(except in the prefix-cache scenario, where sharing is the point).

Lengths are calibrated with a server's /tokenize endpoint when one is available; otherwise we
assume one token per word, which is close for common English words with BPE vocabularies.

Copy-edit prompts hold a generated Python listing instead (seeded the same way, plain ASCII) and
ask for it back with one rename: an answer that repeats its prompt, as code edits do.
"""

from __future__ import annotations

import difflib
import random
import re
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

COPY_EDIT_INSTRUCTION = ("Rewrite the following Python code, renaming the variable `total` to `subtotal`. "
                         "Reply with the whole code only.")

CODE_VERBS = ("sum", "scale", "merge", "filter", "measure", "clamp", "collect", "weigh", "rank", "trim",
              "blend", "check", "score", "pack", "split", "shift")
CODE_NOUNS = ("prices", "weights", "scores", "orders", "samples", "readings", "votes", "heights", "loads",
              "ticks", "rates", "steps", "points", "sizes", "costs", "hours")
CONSTANT_KINDS = ("MAX", "MIN", "LIMIT", "STEP", "OFFSET", "BATCH", "SCALE", "RETRIES")
# The variable a function accumulates into; the first function always uses `total`, so that the
# instruction's rename changes a few lines, not all of them.
ACCUMULATORS = ("total", "total", "running", "amount", "tally")

# Small functions of different shapes: {name}, {acc} and the numbers vary with the seed.
FUNCTION_TEMPLATES = (
    """def {name}(values, factor={a}):
    # Add up the {noun} above {b}, each scaled by factor.
    {acc} = 0
    for value in values:
        if value > {b}:
            {acc} += value * factor
    return {acc}
""",
    """def {name}(items, limit={c}):
    # How many {noun} are multiples of {a} below the limit.
    {acc} = 0
    for item in items:
        if item % {a} == 0 and item < limit:
            {acc} += 1
    return {acc}
""",
    """def {name}({noun}):
    # The mean of the {noun}, or {b} when there are none.
    if not {noun}:
        return {b}
    {acc} = sum({noun})
    return {acc} / len({noun})
""",
    """def {name}(start={a}, step={b}):
    # Double the start and add the step until it passes {c}.
    {acc} = start
    while {acc} < {c}:
        {acc} = {acc} * 2 + step
    return {acc}
""",
    """def {name}(labels, prefix="{word}_"):
    # Every {a}th label of the {noun}, upper-cased after the prefix.
    {acc} = []
    for index, label in enumerate(labels):
        if index % {a} == 0:
            {acc}.append(prefix + label.upper())
    return {acc}
""",
)

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


def render_code(seed: int, key: str, functions: int, constants: int = 0) -> str:
    """A Python module of `constants` assignments and `functions` small functions; more of either
    extends the same listing, so a count can be tuned one line or one function at a time."""
    noun = random.Random(f"{seed}/{key}/module").choice(CODE_NOUNS)
    lines = [f"# Helpers for the {noun} report."]
    rng = random.Random(f"{seed}/{key}/constants")
    lines += [f"{rng.choice(CONSTANT_KINDS)}_{rng.choice(CODE_NOUNS).upper()} = {rng.randint(2, 999)}"
              for _ in range(constants)]
    rng = random.Random(f"{seed}/{key}/functions")
    names: set[str] = set()
    for index in range(functions):
        lines += ["", "", _render_function(rng, index, names)]
    return "\n".join(lines)


def _render_function(rng: random.Random, index: int, names: set[str]) -> str:
    noun = rng.choice(CODE_NOUNS)
    name = f"{rng.choice(CODE_VERBS)}_{noun}"
    if name in names:
        name = f"{name}_{index}"
    names.add(name)
    acc = "total" if index == 0 else rng.choice(ACCUMULATORS)
    return rng.choice(FUNCTION_TEMPLATES).format(
        name=name, acc=acc, noun=noun, word=rng.choice(WORDS),
        a=rng.randint(2, 9), b=rng.randint(10, 99), c=rng.randint(100, 999)).rstrip("\n")


def repeated_share(source: str, text: str, run: int = 20) -> float | None:
    """The share of text's characters that repeat source, in order, in runs of at least `run`
    characters (difflib's matching blocks: each part of source counts once): how much of an
    answer repeats its prompt, as a copy/edit answer should (a rename leaves the runs between
    the renamed words; an answer that loops on one copied line repeats it once). None for an
    empty text."""
    if not text:
        return None
    blocks = difflib.SequenceMatcher(None, source, text, autojunk=False).get_matching_blocks()
    return sum(block.size for block in blocks if block.size >= run) / len(text)


def estimate_code_tokens(text: str) -> int:
    """Without a tokenizer: one token per identifier, number, run of symbols or line break."""
    return len(re.findall(r"\w+|[^\w\s]+|\n", text))


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

    async def copy_edit_prompt(self, n_tokens: int, key: str) -> Prompt:
        """COPY_EDIT_INSTRUCTION and a listing of about n_tokens tokens (its answer repeats it)."""
        code = await self._fit_code(n_tokens, key)
        head = f"{COPY_EDIT_INSTRUCTION}\n\n"
        counted = None if self._count_tokens is None else await self._count_tokens(head + code)
        return Prompt(user=head + code, target_tokens=n_tokens + await self._code_tokens(head),
                      counted_tokens=counted)

    async def _fit_code(self, n_tokens: int, key: str) -> str:
        """Whole functions while they fit, then the constants that come closest to n_tokens."""
        sample = await self._code_tokens(render_code(self.seed, key, 8))
        functions, base = await self._largest(
            n_tokens, lambda k: render_code(self.seed, key, k), n_tokens * 8 // max(1, sample))
        per_8 = await self._code_tokens(render_code(self.seed, key, functions, 8)) - base
        constants, size = await self._largest(
            n_tokens, lambda k: render_code(self.seed, key, functions, k),
            (n_tokens - base) * 8 // max(1, per_8), lowest=0)
        over = render_code(self.seed, key, functions, constants + 1)
        if abs(await self._code_tokens(over) - n_tokens) < abs(size - n_tokens):
            return over
        return render_code(self.seed, key, functions, constants)

    async def _largest(self, n_tokens: int, build: Callable[[int], str], guess: int,
                       lowest: int = 1) -> tuple[int, int]:
        """The largest k from `lowest` whose build(k) holds at most n_tokens (else `lowest`), and
        its size; searched from a guess, which is close, so a few tokenizer calls suffice."""
        k = max(lowest, guess)
        size = await self._code_tokens(build(k))
        while size > n_tokens and k > lowest:
            k -= 1
            size = await self._code_tokens(build(k))
        while size <= n_tokens:
            bigger = await self._code_tokens(build(k + 1))
            if bigger > n_tokens:
                break
            k, size = k + 1, bigger
        return k, size

    async def _code_tokens(self, text: str) -> int:
        counted = None if self._count_tokens is None else await self._count_tokens(text)
        return counted if counted is not None else estimate_code_tokens(text)
