"""One sequence's drafting: its drafters in the server's (or its request's) order."""

from __future__ import annotations

from typing import Callable

from .config import DRAFT_MODEL_KIND, NO_DRAFT_MODEL, SpecConfig, SpecRequest
from .ngram import Drafter, NgramMap, NgramMod, NgramModTable, NgramSimple


class DraftCap:
    """How many tokens a sequence's next draft may have: every verified row costs a share of a
    step whether or not it is accepted, so a sequence whose drafts are rejected drafts little,
    and one whose drafts are accepted whole doubles its cap (up to the kind's own size). A draft
    model's draft rejected whole (each costs the draft model's forwards, not only rows) pauses
    drafting for 1 step, then 2, 4, ... up to PAUSE_MOST while they keep failing, so a draft model
    that never agrees costs little; an accepted token ends that. It reads only the sequence's own
    results, and drafts never change tokens anyway."""

    START, LEAST, MOST = 8, 2, 1024
    PAUSE_MOST = 64

    def __init__(self):
        self.value = self.START
        self.pause = 0  # steps left without a draft
        self._pause_length = 0

    @property
    def paused(self) -> bool:
        return self.pause > 0

    def tick(self) -> None:
        """A step passed without a draft."""
        self.pause = max(0, self.pause - 1)

    def update(self, drafted: int, accepted: int, may_pause: bool = False) -> None:
        if may_pause and drafted > 0 and accepted == 0:
            self._pause_length = min(max(1, 2 * self._pause_length), self.PAUSE_MOST)
            self.pause = self._pause_length
        elif accepted > 0:
            self._pause_length = 0
        if accepted == drafted:
            self.value = min(self.value * 2, self.MOST) if drafted >= self.value else self.value
        else:
            self.value = max(self.LEAST, accepted + self.LEAST)


class Speculator:
    """Drafts for one sequence: the first of its drafters that proposes something wins (as
    llama.cpp tries its kinds in order); the winner hears how much of it was accepted. A draft
    is cut to the request's n_max and to the sequence's DraftCap."""

    def __init__(self, drafters: list[Drafter], n_max: int | None = None, n_min: int = 0):
        self.drafters = drafters
        self.n_max, self.n_min = n_max, n_min
        self.cap = DraftCap()
        self.last: Drafter | None = None

    def begin(self, tokens: list[int]) -> None:
        for drafter in self.drafters:
            drafter.begin(tokens)

    def reset(self, tokens: list[int]) -> None:
        for drafter in self.drafters:
            drafter.reset(tokens)

    def limit(self, limit: int) -> int:
        """The most tokens the next draft may have, within `limit`: the cap and the request's n_max
        (0 while the cap pauses drafting)."""
        if self.cap.paused:
            return 0
        limit = min(limit, self.cap.value)
        return limit if self.n_max is None else min(limit, self.n_max)

    def model_drafter(self) -> Drafter | None:
        """This sequence's draft-model drafter, if it drafts with one (the engine drafts for all
        such sequences together before asking each for its draft)."""
        return next((drafter for drafter in self.drafters if drafter.kind == DRAFT_MODEL_KIND), None)

    def draft(self, tokens: list[int], limit: int) -> list[int]:
        """At most `limit` tokens to verify after `tokens` (whose last is not yet computed)."""
        self.last = None
        if self.cap.paused:
            self.cap.tick()
            return []
        limit = self.limit(limit)
        if limit <= 0:
            return []
        for drafter in self.drafters:
            draft = drafter.draft(tokens, limit)
            if draft:
                if len(draft) < self.n_min:
                    return []
                self.last = drafter
                return draft
        return []

    def accepted(self, n_drafted: int, n_accepted: int) -> None:
        """The last draft's `n_drafted` tokens were verified, the first `n_accepted` accepted."""
        self.cap.update(n_drafted, n_accepted, may_pause=self.last is not None and self.last.kind == DRAFT_MODEL_KIND)
        if self.last is not None:
            self.last.accepted(n_accepted)


class SpeculatorFactory:
    """Builds each sequence's Speculator from the server's settings and the request's fields;
    holds what the sequences share (ngram-mod's table). `model_drafter(slot_id)`: the draft
    model's drafter for a slot's sequence (kind draft-simple); None: the server has no draft model."""

    def __init__(self, config: SpecConfig, model_drafter: Callable[[int], Drafter] | None = None):
        self.config = config
        self.model_drafter = model_drafter
        self._mod_table: NgramModTable | None = None

    def check(self, request: SpecRequest | None) -> None:
        """ValueError if a request asks for a kind this server cannot draft with."""
        if DRAFT_MODEL_KIND in self.kinds_for(request) and self.model_drafter is None:
            raise ValueError(NO_DRAFT_MODEL)

    def kinds_for(self, request: SpecRequest | None) -> tuple[str, ...]:
        """The kinds a request with these fields drafts with (none when its n_max is 0)."""
        if request is not None and request.n_max == 0:
            return ()
        if request is not None and request.kinds is not None:
            return request.kinds
        return self.config.kinds

    def build(self, request: SpecRequest | None, slot_id: int = 0) -> Speculator | None:
        """The Speculator of a sequence in slot `slot_id`; None: this request does not speculate."""
        kinds = self.kinds_for(request)
        if not kinds:
            return None
        drafters = [self._drafter(kind, slot_id) for kind in kinds]
        if request is None:
            return Speculator(drafters)
        return Speculator(drafters, request.n_max, request.n_min)

    def _drafter(self, kind: str, slot_id: int = 0) -> Drafter:
        cfg = self.config
        if kind == DRAFT_MODEL_KIND:
            if self.model_drafter is None:
                raise ValueError(NO_DRAFT_MODEL)
            return self.model_drafter(slot_id)
        if kind == "ngram-simple":
            return NgramSimple(cfg.ngram_simple)
        if kind == "ngram-map-k":
            return NgramMap(cfg.ngram_map_k, values=False)
        if kind == "ngram-map-k4v":
            return NgramMap(cfg.ngram_map_k4v, values=True)
        if kind == "ngram-mod":
            if self._mod_table is None:
                self._mod_table = NgramModTable(cfg.ngram_mod.n_match)
            return NgramMod(cfg.ngram_mod, self._mod_table)
        raise ValueError(f"no drafter for speculative decoding type {kind!r}")
