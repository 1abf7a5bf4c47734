"""A one-line progress counter on stderr, so stdout stays clean for the result table."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """Redraws one line on a terminal; elsewhere (logs, CI) prints one line per task."""

    def __init__(self, stream: TextIO | None = None, enabled: bool = True,
                 live: bool | None = None):
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.live = self.stream.isatty() if live is None else live
        self.task = ""
        self.total = 0
        self.done = 0
        self.failed = 0
        self.started = time.perf_counter()

    def note(self, message: str) -> None:
        if self.enabled:
            self._write(message + "\n")

    def start(self, task: str, total: int) -> None:
        self.task, self.total, self.done, self.failed = task, total, 0, 0
        self.started = time.perf_counter()
        self._redraw()

    def tick(self, failed: bool = False) -> None:
        self.done += 1
        self.failed += failed
        self._redraw()

    def finish(self) -> None:
        if not self.enabled:
            return
        if self.live:
            self._write("\r\x1b[K")
        self._write(self._line() + "\n")

    def _redraw(self) -> None:
        if self.enabled and self.live:
            self._write("\r\x1b[K" + self._line())

    def _line(self) -> str:
        failed = f", {self.failed} failed" if self.failed else ""
        elapsed = time.perf_counter() - self.started
        return f"[bench] {self.task}: {self.done}/{self.total} requests{failed} ({elapsed:.1f}s)"

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()
