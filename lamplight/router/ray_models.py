"""Router mode on Ray Serve (`--models-dir DIR --replicas N [--ray-address ADDR]`): each model the
router loads is a Ray Serve application of N replicas (lamplight/distributed/cluster.py) instead
of a child process, so a cluster serves many models behind the router's one port.

Only the backend changes: the router keeps its statuses, --models-max, idle timers, autoload,
/models/load and /models/unload, the listing and its proxy (models.py, app.py, proxy.py), and
forwards each request to the model's route prefix on Serve's HTTP proxy, where the model's own
ingress sends it to a replica by prompt prefix (lamplight/distributed/routing.py).

A model's status in Ray's terms: loading from the deploy until the application is RUNNING (every
replica started) and its /health answers; loaded; unloaded (or sleeping) once the application is
deleted. An application Ray reports DEPLOY_FAILED (a replica that cannot start) is deleted and
the model unloaded and failed, with Ray's message. A replica that dies is restarted by Ray while
the model stays loaded; GET /models shows each replica's state as Ray reports it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable

import httpx

from .catalog import ModelEntry
from .instance import HEALTH_POLL_SECONDS, LOADED, LOADING, UNLOADED, Failure, ModelInstance, _healthy

APP_POLL_SECONDS = 0.5
MESSAGE_LINES = 20  # of Ray's message on a failed deploy: the failure's log tail


class LoadFailed(Exception):
    """The application did not become ready; the message is the failure's reason."""


class RayModelInstance(ModelInstance):
    def __init__(self, entry: ModelEntry, say: Callable[[str], None], cluster, app_name: str, replicas: int):
        super().__init__(entry, say)
        self.cluster = cluster  # lamplight.distributed.cluster.ServeCluster
        self.app_name = app_name
        self.replicas = replicas
        self.details: dict | None = None  # Ray Serve's details of the application, as last listed
        self._deployed = False
        self._loading: asyncio.Task | None = None
        self._deleting: asyncio.Task | None = None

    @property
    def holds_backend(self) -> bool:
        return self._deployed

    @property
    def base_url(self) -> str:
        return f"{self.cluster.url}/{self.app_name}"

    def listing_extras(self) -> dict:
        from lamplight.distributed.cluster import replicas_json

        return {"replicas": replicas_json(self.details if self._deployed else None, self.replicas)}

    # -- loading ---------------------------------------------------------------------------

    async def start_app(self, serve_argv: list[str], load_timeout: float) -> None:
        """Deploy the application (status loading); loaded once it runs and answers /health."""
        self.args, self.loaded_info, self.details = list(serve_argv), {}, None
        self._stopping, self._deployed = False, True
        self.log.clear()
        self._loading = asyncio.create_task(self._load(serve_argv, load_timeout))

    async def _load(self, serve_argv: list[str], timeout: float) -> None:
        started = time.monotonic()
        self.say(f"model {self.name}: deploying {self.replicas} replica(s) as the Ray Serve application "
                 f"{self.app_name}")
        try:
            await asyncio.to_thread(self.cluster.deploy, self.app_name, serve_argv, self.replicas)
            await self._wait_running(started, timeout)
            async with httpx.AsyncClient(base_url=self.base_url, timeout=5) as client:
                while not await _healthy(client):
                    _check_deadline(started, timeout)
                    await asyncio.sleep(HEALTH_POLL_SECONDS)
                await self._loaded(client, started)
        except asyncio.CancelledError:
            raise  # stop() cancelled the load, and deletes the application
        except Exception as exc:  # LoadFailed, a bad flag or model (ValueError), Ray's own errors
            lines = [line for line in str(exc).strip().splitlines() if line.strip()] or [type(exc).__name__]
            self.failure = Failure(lines[0][:300], None, tuple(lines[-MESSAGE_LINES:]))
            self.say(f"model {self.name}: {self.failure.reason}")
            await self._delete(UNLOADED)

    async def _wait_running(self, started: float, timeout: float) -> None:
        while True:
            status, message = await asyncio.to_thread(self.cluster.app_status, self.app_name)
            if status == "RUNNING":
                return
            if status == "DEPLOY_FAILED":
                raise LoadFailed(f"Ray Serve could not deploy it: {message.strip() or status}")
            _check_deadline(started, timeout)
            await asyncio.sleep(APP_POLL_SECONDS)

    # -- unloading -------------------------------------------------------------------------

    async def stop(self, then: str = UNLOADED) -> None:
        """Delete the application (Ray Serve lets its replicas finish their requests first)."""
        if not self._deployed:
            if self.status != LOADING:
                self._set(then)
            return
        self._stopping = True
        if self._loading is not None and not self._loading.done():
            self._loading.cancel()
        await self._delete(then)

    async def _delete(self, then: str) -> None:
        if self._deleting is None:  # one deletion, whoever else asks for it meanwhile
            self._deleting = asyncio.create_task(self._delete_app(then))
        await asyncio.shield(self._deleting)

    async def _delete_app(self, then: str) -> None:
        try:
            await asyncio.to_thread(self.cluster.delete, self.app_name)
        except Exception as exc:  # the cluster is gone: nothing of ours is left to delete
            self.say(f"model {self.name}: deleting {self.app_name} failed: {exc}")
        self._deployed, self._deleting, self.details = False, None, None
        self.say(f"model {self.name}: {self.app_name} deleted ({then})")
        self._set(then)

    # -- what Ray reports ------------------------------------------------------------------

    def observe(self, details: dict | None) -> None:
        """Ray Serve's details of the application (None: Ray has no such application)."""
        self.details = details
        if self.status == LOADED and not self._stopping and details is None:
            self.failure = Failure(f"its Ray Serve application {self.app_name} was deleted outside the router")
            self._deployed = False
            self.say(f"model {self.name}: {self.failure.reason}")
            self._set(UNLOADED)


def _check_deadline(started: float, timeout: float) -> None:
    if time.monotonic() - started > timeout:
        raise LoadFailed(f"did not load within {timeout:g} seconds (--timeout)")


class RayServeBackend:
    """Models as Ray Serve applications (models.ChildProcesses's calls)."""

    def __init__(self, cluster, serve_argv: Callable[[ModelEntry], list[str]],
                 replicas_of: Callable[[ModelEntry], int], say: Callable[[str], None]):
        self.cluster = cluster
        self._serve_argv = serve_argv
        self._replicas_of = replicas_of
        self._say = say
        self._app_names: set[str] = set()

    def instance(self, entry: ModelEntry) -> RayModelInstance:
        from lamplight.distributed.cluster import app_name_for

        name = app_name_for(entry.name, self._app_names)
        self._app_names.add(name)
        return RayModelInstance(entry, self._say, self.cluster, name, self._replicas_of(entry))

    async def start(self, instance: RayModelInstance, load_timeout: float) -> None:
        await instance.start_app(self._serve_argv(instance.entry), load_timeout)

    async def refresh(self, instances: list[RayModelInstance]) -> None:
        try:
            applications = await asyncio.to_thread(self.cluster.applications)
        except Exception as exc:  # the listing still answers, with what the router knows
            self._say(f"Ray Serve's details could not be read: {exc}")
            return
        for instance in instances:
            instance.observe(applications.get(instance.app_name))

    def connect(self) -> None:
        started = time.monotonic()
        where = self.cluster.options.address or "a local Ray instance"
        self._say(f"starting Ray Serve on {where}")
        self.cluster.connect()
        self._say(f"Ray Serve ready in {time.monotonic() - started:.1f} s; its HTTP proxy: {self.cluster.url}")

    def disconnect(self) -> None:
        self._say("shutting down Ray Serve" if self.cluster.local else "leaving the Ray cluster")
        self.cluster.close()
