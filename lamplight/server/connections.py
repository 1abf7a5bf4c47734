"""Connection timeouts uvicorn lacks, so that silent or slow clients hold no connection forever.

uvicorn arms its keep-alive timer only after a response, and never limits how long a request's
head may take. Here, as in llama-server (cpp-httplib): a connection that sends nothing for
`idle_timeout` seconds before a request (fresh or kept alive) is closed, and a request's head
must arrive within `read_timeout` (`-to/--timeout`). The body's deadline is the middleware's
(middleware.py); a slow client only ever holds its own connection, never the event loop.
"""

from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol


def timed_protocol(read_timeout: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol with these timeouts (its `timeout_keep_alive` is the idle timeout)."""
    return type("TimedH11Protocol", (TimedH11Protocol,), {"read_timeout": read_timeout})


class TimedH11Protocol(H11Protocol):
    read_timeout: float = 3600.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_deadline: asyncio.TimerHandle | None = None
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            if self._head_deadline is None:  # part of a request's head: it has read_timeout to complete
                self._head_deadline = self.loop.call_later(self.read_timeout, self._head_too_slow)
        else:
            self._cancel_head_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_deadline()
        super().connection_lost(exc)

    def _head_too_slow(self) -> None:
        self._head_deadline = None
        if self.conn.their_state is h11.IDLE:
            self.timeout_keep_alive_handler()

    def _cancel_head_deadline(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None
