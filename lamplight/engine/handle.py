"""RequestHandle: what `Engine.submit` returns, the request's events readable from an asyncio
loop (or, blocking, from a plain thread)."""

from __future__ import annotations

import asyncio
import collections
import threading
from typing import TYPE_CHECKING, AsyncIterator

from .types import ErrorEvent, Event, FinalEvent, GenerationRequest

if TYPE_CHECKING:
    from .sequence import Sequence


class RequestHandle:
    """What `submit` returns: the request's events, readable from an asyncio loop."""

    def __init__(self, engine, request: GenerationRequest, task_id: int, loop: asyncio.AbstractEventLoop | None,
                 group: int | None = None):
        self.engine = engine
        self.request = request
        self.task_id = task_id
        # Handles submitted together (the prompts of one HTTP request) share a group: they are one
        # entry of the waiting queue.
        self.group = task_id if group is None else group
        self._loop = loop
        self._queue: asyncio.Queue[Event] | None = asyncio.Queue() if loop else None
        self._sync_events: collections.deque[Event] = collections.deque()
        self._sync_ready = threading.Condition()
        self.cancelled = False
        self.lora_key: tuple[float, ...] = ()
        self.sequences: list[Sequence] = []
        self.failed = False  # an ErrorEvent was sent: no further events

    def _push(self, event: Event) -> None:
        if self.failed:
            return
        if isinstance(event, ErrorEvent):
            self.failed = True
        if self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(self._queue.put_nowait, event)
            except RuntimeError:  # the loop is closed: nobody is listening any more
                pass
        else:
            with self._sync_ready:
                self._sync_events.append(event)
                self._sync_ready.notify()

    async def events(self) -> AsyncIterator[Event]:
        """Events of all choices; ends after every choice's FinalEvent, or an ErrorEvent."""
        assert self._queue is not None, "submit() was called outside an event loop: use iter_events()"
        left = self.request.n_choices
        while left:
            event = await self._queue.get()
            yield event
            if isinstance(event, ErrorEvent):
                return
            if isinstance(event, FinalEvent):
                left -= 1

    def iter_events(self, timeout: float | None = None):
        """Blocking variant of `events()` for callers without an event loop (tests, scripts)."""
        left = self.request.n_choices
        while left:
            with self._sync_ready:
                if not self._sync_events and not self._sync_ready.wait_for(lambda: self._sync_events, timeout):
                    raise TimeoutError("no event from the engine")
                event = self._sync_events.popleft()
            yield event
            if isinstance(event, ErrorEvent):
                return
            if isinstance(event, FinalEvent):
                left -= 1

    def cancel(self) -> None:
        self.cancelled = True
        self.engine._wake()
