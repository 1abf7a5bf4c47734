"""Stop strings on streamed text: find a match, and hold back text that may be the start of one."""

from __future__ import annotations

from typing import Sequence


class StopMatcher:
    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self.longest = max((len(s) for s in self.stops), default=0)

    def find(self, text: str, search_from: int) -> tuple[int, str] | None:
        """The earliest complete stop string starting at or after `search_from - longest + 1`."""
        if not self.stops:
            return None
        start = max(0, search_from - self.longest + 1)
        best: tuple[int, str] | None = None
        for stop in self.stops:
            at = text.find(stop, start)
            if at != -1 and (best is None or at < best[0]):
                best = (at, stop)
        return best

    def held_back(self, text: str) -> int:
        """How many trailing characters of `text` could begin a stop string."""
        hold = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(text)), hold, -1):
                if text.endswith(stop[:n]):
                    hold = n
                    break
        return hold
