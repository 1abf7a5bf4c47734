"""One model's child process: started, watched until its /health answers 200, stopped; its status
as llama-server's router reports it (unloaded, loading, loaded, sleeping; a child that exited on
its own is unloaded and failed, with its exit code, the reason and its last log lines).

Everything runs on the router's event loop; status changes wake the requests waiting for them.
The child's output goes to the router's stderr, each line prefixed with the model's name.
"""

from __future__ import annotations

import asyncio
import collections
import signal
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

import httpx

from .catalog import ModelEntry
from .presets import DEFAULT_STOP_TIMEOUT

UNLOADED, LOADING, LOADED, SLEEPING = "unloaded", "loading", "loaded", "sleeping"
CHILD_HOST = "127.0.0.1"  # children listen on loopback only, whatever the router's --host (as llama-server's)
LOG_TAIL_LINES = 20
HEALTH_POLL_SECONDS = 0.05


@dataclass(frozen=True)
class Failure:
    """Why a child stopped without being asked to (or a model that cannot be started)."""

    reason: str
    exit_code: int | None = None
    log_tail: tuple[str, ...] = ()

    def json(self) -> dict:
        fields: dict[str, Any] = {"failed": True, "exit_reason": self.reason, "log_tail": list(self.log_tail)}
        if self.exit_code is not None:
            fields["exit_code"] = self.exit_code
        return fields


class ModelInstance:
    def __init__(self, entry: ModelEntry, say: Callable[[str], None]):
        self.entry = entry
        self.say = say
        self.status = UNLOADED
        self.failure: Failure | None = Failure(entry.problem) if entry.problem else None
        self.process: asyncio.subprocess.Process | None = None
        self.port = 0
        self.args: list[str] = []  # the last child's command line (the listing's status.args)
        self.loaded_info: dict = {}  # the child's own /v1/models entry, merged into the listing
        self.props: dict | None = None  # the child's /props, answered while it sleeps
        self.log: collections.deque[str] = collections.deque(maxlen=LOG_TAIL_LINES)
        self.last_used = 0.0  # monotonic time of the last POST: least recently used goes first
        self.last_active = time.monotonic()  # the last request's end: the idle timer's start
        self.in_flight = 0
        self.unload_after: float | None = None  # this model's idle timer (keep_alive); None: the router's
        self.loaded_at = 0.0
        self.load_seconds: float | None = None  # start of the child to /health 200, last load
        self._exit_status = UNLOADED  # what an asked-for exit leaves: unloaded, or sleeping
        self._stopping = False
        self._exited: asyncio.Event | None = None
        self._tasks: list[asyncio.Task] = []
        self._changed = asyncio.Event()

    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def running(self) -> bool:
        """Holds, or is getting, a process (llama-server's is_running, less sleeping: a sleeping
        model has no process here)."""
        return self.status in (LOADING, LOADED)

    @property
    def holds_backend(self) -> bool:
        """Has something to stop: a process (ray_models.py: a Ray Serve application)."""
        return self.process is not None

    @property
    def stopping(self) -> bool:
        """Asked to exit, and not gone yet."""
        return self._stopping and self.holds_backend

    def listing_extras(self) -> dict:
        """Fields of its own in GET /models (ray_models.py: its replicas)."""
        return {}

    @property
    def stop_timeout(self) -> float:
        return self.entry.preset.stop_timeout if self.entry.preset.stop_timeout is not None else DEFAULT_STOP_TIMEOUT

    # -- status changes --------------------------------------------------------------------

    def _set(self, status: str) -> None:
        self.status = status
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def wait_while(self, condition: Callable[[], bool], timeout: float) -> bool:
        """Wait until `condition()` is false; False if `timeout` seconds passed first."""
        deadline = time.monotonic() + timeout
        while condition():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except asyncio.TimeoutError:
                return False
        return True

    def mark_loading(self) -> None:
        """Loading from now on (before the process exists): a second load sees it is running."""
        self.failure = None
        self._set(LOADING)

    # -- the child's life ------------------------------------------------------------------

    async def start(self, command: list[str], port: int, env: dict[str, str], load_timeout: float) -> None:
        """Start the child (status loading); it becomes loaded when its /health answers 200."""
        self.port, self.args, self.loaded_info = port, command, {}
        self._stopping, self._exit_status = False, UNLOADED
        self.log.clear()
        started = time.monotonic()
        try:
            self.process = await asyncio.create_subprocess_exec(
                *command, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT, env=env, limit=2**20, preexec_fn=_die_with_parent)
        except OSError as exc:
            self.failure = Failure(f"could not start {command[0]}: {exc.strerror or exc}")
            self._set(UNLOADED)
            return
        self._exited = asyncio.Event()
        self.say(f"model {self.name}: starting on port {port} (pid {self.process.pid})")
        reader = asyncio.create_task(self._read_output(self.process))
        # held here: the event loop keeps only weak references to tasks
        self._tasks = [reader, asyncio.create_task(self._watch_exit(self.process, reader)),
                       asyncio.create_task(self._watch_health(self.process, started, load_timeout))]

    async def stop(self, then: str = UNLOADED) -> None:
        """Ask the child to exit (SIGTERM: uvicorn finishes its requests first), killed after the preset's
        stop-timeout; `then`: unloaded, or sleeping (the next request loads it again)."""
        process = self.process
        if process is None or process.returncode is not None:
            if self.status != LOADING:
                self._set(then)
            return
        self._stopping, self._exit_status = True, then
        if self.status == LOADING:
            process.kill()  # nothing to finish yet (llama-server kills a loading child too)
        else:
            process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), self.stop_timeout)
        except asyncio.TimeoutError:
            self.say(f"model {self.name}: still running {self.stop_timeout:g} s after the stop request, killing it")
            process.kill()
        await self._exited.wait()

    async def _read_output(self, process: asyncio.subprocess.Process) -> None:
        while True:
            try:
                line = await process.stdout.readline()
            except ValueError:  # a line longer than the buffer: take what there is
                line = await process.stdout.read(2**16)
            if not line:
                return
            text = line.decode("utf-8", "replace").rstrip()
            self.log.append(text)
            print(f"[{self.name}] {text}", file=sys.stderr, flush=True)

    async def _watch_exit(self, process: asyncio.subprocess.Process, reader: asyncio.Task) -> None:
        code = await process.wait()
        await asyncio.wait([reader], timeout=2)  # its last lines first: the failure's log tail
        if process is not self.process:
            return
        if self._stopping:
            self.say(f"model {self.name}: stopped ({self._exit_status})")
            self._set(self._exit_status)
        else:  # on its own: a crash, or a load that failed (status 0: it just ended, not a failure)
            if code != 0:
                self.failure = self.failure or Failure(_exit_reason(code), _exit_code(code), tuple(self.log))
            self.say(f"model {self.name}: {self.failure.reason if self.failure else 'exited'}")
            self._set(UNLOADED)
        self.process = None
        self._exited.set()

    async def _watch_health(self, process: asyncio.subprocess.Process, started: float, timeout: float) -> None:
        async with httpx.AsyncClient(base_url=self.base_url, timeout=5) as client:
            while process.returncode is None:
                if time.monotonic() - started > timeout:
                    self.failure = Failure(f"did not load within {timeout:g} seconds (--timeout)", None, tuple(self.log))
                    process.kill()
                    return
                if await _healthy(client):
                    await self._loaded(client, started)
                    return
                await asyncio.sleep(HEALTH_POLL_SECONDS)

    async def _loaded(self, client: httpx.AsyncClient, started: float) -> None:
        self.loaded_info = await _json_of(client, "/v1/models", lambda body: body["data"][0])
        self.props = await _json_of(client, "/props", lambda body: body) or self.props
        self.load_seconds = time.monotonic() - started
        self.loaded_at = self.last_active = time.monotonic()
        self.say(f"model {self.name}: loaded in {self.load_seconds:.2f} s")
        self._set(LOADED)

    @property
    def base_url(self) -> str:
        return f"http://{CHILD_HOST}:{self.port}"

    # -- requests --------------------------------------------------------------------------

    def begin_request(self, counts_as_use: bool) -> None:
        self.in_flight += 1
        if counts_as_use:
            self.last_used = time.monotonic()

    def end_request(self) -> None:
        self.in_flight -= 1
        self.last_active = time.monotonic()


async def _healthy(client: httpx.AsyncClient) -> bool:
    try:
        return (await client.get("/health")).status_code == 200
    except httpx.TransportError:
        return False  # not listening yet


async def _json_of(client: httpx.AsyncClient, path: str, pick: Callable[[Any], Any]) -> Any:
    try:
        return pick((await client.get(path)).json())
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
        return {}


def _exit_code(code: int) -> int:
    return 128 - code if code < 0 else code  # killed by signal N: 128 + N, as a shell reports it


def _exit_reason(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"the model's process was killed by {name}"
    return f"the model's process exited with status {code}"


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM it if the router dies (Linux), so no child outlives it."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
