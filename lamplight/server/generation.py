"""Running one HTTP request on the engine: submit its prompts, read their events as one stream,
cancel everything when the client goes away."""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

from starlette.requests import Request

from lamplight.engine.types import EngineError, ErrorEvent, Event, FinalEvent, Timings

from .errors import ApiError, from_engine_error
from .params import GenerationParams

_PUMP_DONE = object()


class ClientDisconnected(Exception):
    """The client closed the connection before the answer was ready."""


class EmptyPromptHandle:
    """Stands in for an engine handle when a prompt tokenizes to nothing: llama-server answers
    such a prompt with an empty final result instead of an error."""

    def __init__(self, n_choices: int):
        self.n_choices = n_choices

    async def events(self) -> AsyncIterator[Event]:
        for choice in range(self.n_choices):
            yield FinalEvent(choice=choice, content="", token_ids=(), stop_type="none", stopping_word="",
                             truncated=False, n_prompt=0, n_cached=0, n_decoded=0, tokens_cached=0,
                             id_slot=-1, timings=Timings(0, 0, 0.0, 0, 0.0), has_new_line=False)

    def cancel(self) -> None:
        pass


class GenerationRun:
    """The engine handles of one HTTP request (one per prompt), their events merged in arrival order.

    Events come out as (result index, event) with result index = prompt index * n_choices + choice.
    """

    def __init__(self, handles: list[Any], n_choices: int, observer: Any = None):
        self.handles = handles
        self.n_choices = n_choices
        self.observer = observer  # told about every FinalEvent (metrics)
        self.finished = False
        self._queue: asyncio.Queue = asyncio.Queue()
        self._open = len(handles)
        self._pumps = [asyncio.create_task(self._pump(i, h)) for i, h in enumerate(handles)]

    @classmethod
    def submit(cls, engine: Any, params: GenerationParams, prompts: list[list[int]],
               observer: Any = None) -> "GenerationRun":
        """Submit every prompt (on the event loop thread: handles deliver events to this loop), as
        one entry of the engine's queue: all of them are queued, or none (an EngineError)."""
        requests = [params.request_for(prompt) for prompt in prompts if prompt]
        try:
            if hasattr(engine, "submit_group"):
                queued = iter(engine.submit_group(requests) if requests else [])
            else:  # an engine stand-in without groups
                queued = iter(_submit_each(engine, requests))
        except EngineError as exc:
            raise from_engine_error(exc) from None
        handles = [next(queued) if prompt else EmptyPromptHandle(params.n_choices) for prompt in prompts]
        return cls(handles, params.n_choices, observer)

    async def _pump(self, prompt_index: int, handle: Any) -> None:
        try:
            async for event in handle.events():
                if isinstance(event, FinalEvent) and self.observer is not None:
                    self.observer.on_final(event)
                self._queue.put_nowait((prompt_index * self.n_choices + event.choice, event))
        finally:
            self._queue.put_nowait(_PUMP_DONE)

    async def next_event(self, timeout: float | None = None) -> tuple[int, Event] | None:
        """The next (index, event); None once every handle has ended. TimeoutError if silent too long."""
        while self._open:
            item = await asyncio.wait_for(self._queue.get(), timeout)
            if item is _PUMP_DONE:
                self._open -= 1
                continue
            return item
        self.finished = True
        return None

    async def collect(self) -> dict[int, FinalEvent]:
        """Every choice's FinalEvent by result index; an engine error becomes an ApiError."""
        finals: dict[int, FinalEvent] = {}
        while (item := await self.next_event()) is not None:
            index, event = item
            if isinstance(event, ErrorEvent):
                self.cancel()
                raise ApiError(event.code, event.message, event.type)
            if isinstance(event, FinalEvent):
                finals[index] = event
        return finals

    def cancel(self) -> None:
        """Stop generating (client gone, or an error in a sibling): frees the slots."""
        if self.finished:
            return
        self.finished = True
        for handle in self.handles:
            handle.cancel()
        for pump in self._pumps:
            pump.cancel()


def _submit_each(engine: Any, requests: list) -> list[Any]:
    handles: list[Any] = []
    try:
        for request in requests:
            handles.append(engine.submit(request))
    except EngineError:
        for handle in handles:
            handle.cancel()
        raise
    return handles


async def wait_for_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def collect_unless_disconnected(request: Request, run: GenerationRun) -> dict[int, FinalEvent]:
    """run.collect(), but cancel the generation as soon as the client hangs up."""
    work = asyncio.ensure_future(run.collect())
    gone = asyncio.ensure_future(wait_for_disconnect(request))
    try:
        done, _ = await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        if work in done:
            return work.result()
        raise ClientDisconnected()
    finally:
        gone.cancel()
        if not work.done():
            work.cancel()
            run.cancel()
