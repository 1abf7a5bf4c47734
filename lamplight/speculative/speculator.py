"""One sequence's drafting: its drafters in the server's (or its request's) order."""

from __future__ import annotations

from .config import SpecConfig, SpecRequest
from .ngram import Drafter, NgramMap, NgramMod, NgramModTable, NgramSimple


class DraftCap:
    """How many tokens a sequence's next draft may have: every verified row costs a share of a
    step whether or not it is accepted, so a sequence whose drafts are rejected drafts little,
    and one whose drafts are accepted whole doubles its cap (up to the kind's own size).
    It reads only the sequence's own results, and drafts never change tokens anyway."""

    START, LEAST, MOST = 8, 2, 1024

    def __init__(self):
        self.value = self.START

    def update(self, drafted: int, accepted: int) -> None:
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

    def draft(self, tokens: list[int], limit: int) -> list[int]:
        """At most `limit` tokens to verify after `tokens` (whose last is not yet computed)."""
        self.last = None
        limit = min(limit, self.cap.value)
        if self.n_max is not None:
            limit = min(limit, self.n_max)
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
        self.cap.update(n_drafted, n_accepted)
        if self.last is not None:
            self.last.accepted(n_accepted)


class SpeculatorFactory:
    """Builds each sequence's Speculator from the server's settings and the request's fields;
    holds what the sequences share (ngram-mod's table)."""

    def __init__(self, config: SpecConfig):
        self.config = config
        self._mod_table: NgramModTable | None = None

    def kinds_for(self, request: SpecRequest | None) -> tuple[str, ...]:
        """The kinds a request with these fields drafts with (none when its n_max is 0)."""
        if request is not None and request.n_max == 0:
            return ()
        if request is not None and request.kinds is not None:
            return request.kinds
        return self.config.kinds

    def build(self, request: SpecRequest | None) -> Speculator | None:
        """None: this request does not speculate."""
        kinds = self.kinds_for(request)
        if not kinds:
            return None
        drafters = [self._drafter(kind) for kind in kinds]
        if request is None:
            return Speculator(drafters)
        return Speculator(drafters, request.n_max, request.n_min)

    def _drafter(self, kind: str) -> Drafter:
        cfg = self.config
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
