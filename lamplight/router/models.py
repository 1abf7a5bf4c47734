"""The router's models: which are loaded, loading one on demand (and unloading the least recently
used beyond --models-max first), unloading idle ones, and the listing of GET /models.

llama-server's rules (tools/server/server-models.cpp), with one difference: a sleeping model
has no process here (its memory goes back to the OS, as an unloaded one's), so it does not count
towards --models-max; any request that needs it loads it again, even with --no-models-autoload.

Idle timers: each loaded model is unloaded to `sleeping` once it has had no request for its
timer's seconds: --sleep-idle-seconds for every model (-1: never), unless `set_unload_timer`
gave it its own (Ollama's keep_alive: 0 unloads it after the request that set it, -1 never, a
number of seconds otherwise).
"""

from __future__ import annotations

import asyncio
import socket
import time
from dataclasses import dataclass
from typing import Callable

from .catalog import ModelEntry
from .errors import RouterError
from .instance import LOADED, LOADING, SLEEPING, UNLOADED, ModelInstance

IDLE_CHECK_SECONDS = 0.25


@dataclass(frozen=True)
class RouterOptions:
    models_max: int = 4  # 0: no limit
    autoload: bool = True
    sleep_idle_seconds: float = -1  # -1: never
    load_timeout: float = 3600.0  # the server's --timeout: how long a request waits for a load


class ChildProcesses:
    """The backend of router mode: each model a child process, `lamplight serve` on a free port.
    (ray_models.RayServeBackend: each a Ray Serve application; the same calls.)"""

    def __init__(self, child_command: Callable[[ModelEntry, int], list[str]], child_env: dict[str, str],
                 say: Callable[[str], None]):
        self._child_command = child_command
        self._child_env = child_env
        self._say = say

    def instance(self, entry: ModelEntry) -> ModelInstance:
        return ModelInstance(entry, self._say)

    async def start(self, instance: ModelInstance, load_timeout: float) -> None:
        port = free_port()
        await instance.start(self._child_command(instance.entry, port), port, self._child_env, load_timeout)

    async def refresh(self, instances: list[ModelInstance]) -> None:
        """Up to date before a listing (a child's exit is noticed as it happens: nothing to do)."""

    def connect(self) -> None:
        """Before the router listens (nothing to connect to: children start on demand)."""

    def disconnect(self) -> None:
        """After the router stopped, and every model with it."""


class Models:
    def __init__(self, catalog: dict[str, ModelEntry], options: RouterOptions, backend: ChildProcesses,
                 say: Callable[[str], None]):
        self.options = options
        self.backend = backend
        self.instances = {name: backend.instance(entry) for name, entry in sorted(catalog.items())}
        self._aliases = {alias: name for name, entry in catalog.items() for alias in entry.aliases}
        self._say = say
        self._lock = asyncio.Lock()  # one load decision (evict, then start) at a time
        self._idle_task: asyncio.Task | None = None
        self._stops: set[asyncio.Task] = set()  # idle models being unloaded (strong references)

    # -- finding a model -------------------------------------------------------------------

    def find(self, name: str) -> ModelInstance | None:
        """The model a request's `"model"` names (its name or an alias): never a path."""
        return self.instances.get(self._aliases.get(name, name))

    def get(self, name: str, code: int = 400) -> ModelInstance:
        instance = self.find(name) if isinstance(name, str) and name else None
        if instance is None:
            raise RouterError(code, unknown_model_message(name, sorted(self.instances)))
        return instance

    # -- loading and unloading -------------------------------------------------------------

    async def ensure_ready(self, instance: ModelInstance, autoload: bool) -> None:
        """Loaded when this returns; loading first where allowed, waiting for a load under way."""
        if instance.status == LOADED:
            return
        if instance.status == UNLOADED and not autoload:
            raise RouterError(400, f"model '{instance.name}' is not loaded (autoload is off: POST /models/load "
                                   f"loads it, or ?autoload=true on this request)")
        if instance.status in (UNLOADED, SLEEPING):
            await self.load(instance)
        timeout = self.options.load_timeout
        if not await instance.wait_while(lambda: instance.status == LOADING, timeout):
            raise RouterError(503, f"model '{instance.name}' is still loading after {timeout:g} seconds (--timeout)")
        if instance.status != LOADED:
            reason = instance.failure.reason if instance.failure else f"it is {instance.status}"
            raise RouterError(500, f"model '{instance.name}' failed to load: {reason}")

    async def load(self, instance: ModelInstance) -> bool:
        """Start loading `instance` (False: it is already loading or loaded, nothing started)."""
        if instance.entry.problem:
            raise RouterError(500, f"model '{instance.name}' cannot be loaded: {instance.entry.problem}")
        if instance.running:
            return False
        instance.mark_loading()  # before any await: a second load of it now sees it running
        async with self._lock:
            await self._make_room_for(instance)
            await self.backend.start(instance, self.options.load_timeout)
        return True

    async def _make_room_for(self, instance: ModelInstance) -> None:
        """Unload the least recently used models until `instance` fits under --models-max."""
        limit = self.options.models_max
        while limit > 0:
            others = [other for other in self.instances.values() if other.running and other is not instance]
            if len(others) < limit:
                return
            victim = min(others, key=lambda other: other.last_used)
            self._say(f"--models-max {limit} reached: unloading the least recently used model, {victim.name}")
            await victim.stop(UNLOADED)

    async def unload(self, instance: ModelInstance, then: str = UNLOADED) -> None:
        await instance.stop(then)

    def set_unload_timer(self, name: str, seconds: float | None) -> None:
        """Model `name`'s idle timer: unloaded (to sleeping) after `seconds` without requests; 0:
        once its requests under way are done; negative: never; None: back to --sleep-idle-seconds.
        (Ollama's keep_alive maps onto it: the router applies a child's X-Lamplight-Unload-After.)"""
        instance = self.get(name)
        instance.unload_after = seconds
        instance.last_active = time.monotonic()

    def idle_seconds_of(self, instance: ModelInstance) -> float:
        return self.options.sleep_idle_seconds if instance.unload_after is None else instance.unload_after

    # -- the background work ---------------------------------------------------------------

    def start_background(self) -> None:
        self._idle_task = asyncio.create_task(self._sleep_idle_models())

    async def _sleep_idle_models(self) -> None:
        while True:
            await asyncio.sleep(IDLE_CHECK_SECONDS)
            now = time.monotonic()
            for instance in self.instances.values():
                limit = self.idle_seconds_of(instance)
                if (instance.status == LOADED and not instance.stopping and instance.in_flight == 0 and limit >= 0
                        and now - instance.last_active >= limit):
                    self._say(f"model {instance.name}: idle for {limit:g} s, unloading it (sleeping)")
                    task = asyncio.create_task(instance.stop(SLEEPING))
                    self._stops.add(task)
                    task.add_done_callback(self._stops.discard)

    async def close(self) -> None:
        if self._idle_task is not None:
            self._idle_task.cancel()
        await asyncio.gather(*(instance.stop(UNLOADED) for instance in self.instances.values()
                               if instance.holds_backend))

    # -- the listing -----------------------------------------------------------------------

    async def listing(self) -> dict:
        await self.backend.refresh(list(self.instances.values()))
        created = int(time.time())
        return {"object": "list", "data": [model_json(instance, created) for instance in self.instances.values()]}


def model_json(instance: ModelInstance, created: int) -> dict:
    """One model of GET /models, in llama-server's shape (and its child's own /v1/models fields
    while it runs)."""
    entry = instance.entry
    status: dict = {"value": instance.status, "args": instance.args}
    if entry.preset.name:
        status["preset"] = preset_ini(entry)
    if instance.status == UNLOADED and instance.failure is not None:
        status.update(instance.failure.json())
    if instance.load_seconds is not None:
        status["load_seconds"] = round(instance.load_seconds, 3)
    model = {"id": entry.name, "aliases": list(entry.aliases), "tags": [], "object": "model",
             "owned_by": "lamplight", "created": created, "status": status,
             "architecture": {"input_modalities": ["text"], "output_modalities": ["text"]},
             "source": entry.source, "can_remove": False, "path": entry.path}
    if entry.mmproj:
        model["mmproj"] = entry.mmproj
    model.update(instance.listing_extras())
    if instance.running:
        model.update({key: value for key, value in instance.loaded_info.items() if key not in model})
    return model


def preset_ini(entry: ModelEntry) -> str:
    """The model's section, as llama-server shows it (status.preset)."""
    lines = [f"[{entry.preset.name}]"]
    lines += [f"{name} = {value}" for name, value in (("model", entry.preset.model), ("hf-repo", entry.preset.hf_repo))
              if value]
    lines += [f"{tokens[0].lstrip('-')} = {' '.join(tokens[1:]) or 'true'}" for tokens in entry.preset.flags.values()]
    return "\n".join(lines) + "\n"


def unknown_model_message(name, known: list[str]) -> str:
    if not isinstance(name, str) or not name:
        return f"model name is missing from the request; this server's models: {', '.join(known) or 'none'}"
    return f"model '{name}' not found; this server's models: {', '.join(known) or 'none'} (GET /models lists them)"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
