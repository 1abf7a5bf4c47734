"""`lamplight serve --models-dir DIR | --models-preset FILE.ini`: the router, from the parsed
serve flags (lamplight.serve_flags's "router" and "server" settings) and the command line it was
given (whose model flags every child gets: `-c 4096 -np 2` applies to every model).

Parsing the serve flags imports what the command line's other uses need (the sampling table on
numpy, the grammar, the bench), and a router has no use for it: `run_router` writes what it needs
(`RouterSpec`: the settings, the command line, the flag table) to a file and replaces its process
with `python -m lamplight.router.launch FILE`, a fresh one that imports only the router (a
serving router of 49 MiB resident instead of 66).

With `--replicas N` / `--ray-address ADDR` the models are Ray Serve applications (ray_models.py);
that router stays in this process (it builds the applications), connects to
Ray before its port is bound, and shuts Ray down (or leaves the cluster) when it stops.

Everything that can be wrong with the command line, the preset file or the models folder is
found before the port is bound, and answered with one line naming it and exit status 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

import uvicorn

from lamplight.serve_flags import settings_from

from .app import HttpOptions, create_app
from .catalog import CatalogError, ModelEntry, build_catalog, cached_models, scan_models_dir
from .flag_table import MODEL_CHOICE, ROUTER_ONLY, FlagTable, describe_flags, table_from_rows
from .instance import CHILD_HOST
from .models import ChildProcesses, Models, RouterOptions
from .presets import GLOBAL_SECTION, Flags, Preset, PresetError, flags_from_argv, merged_flags, read_preset_file

# The router's settings where lamplight.serve_flags has no "router" record (their defaults).
ROUTER_DEFAULTS = {"models_dir": None, "models_preset": None, "models_max": 4, "models_autoload": True,
                   "sleep_idle_seconds": -1}


class RouterStartupError(ValueError):
    """The router cannot start as asked; the message names the flag."""


STARTUP_ERRORS = (RouterStartupError, PresetError, CatalogError)


def say(message: str) -> None:
    print(f"lamplight: router: {message}", file=sys.stderr, flush=True)


def run_router(args: argparse.Namespace) -> int:
    try:
        spec = router_spec(args)
        # On Ray, the router builds each model's application (its replicas' settings), so it
        # keeps this process.
        if os.name == "posix" and spec.ray is None:
            _become_lean_router(spec)  # does not return
        router = build_router(spec)
    except STARTUP_ERRORS as exc:
        print(f"lamplight: error: {exc}", file=sys.stderr, flush=True)
        return 1
    return router.serve()


@dataclass(frozen=True)
class RouterSpec:
    """Everything the router is built from, JSON-able (it crosses an exec)."""

    argv: list[str]  # the serve flags as given: the model flags every child gets
    router: dict  # lamplight.serve_flags's "router" settings
    host: str
    port: int
    api_keys: list[str]
    cors_origins: list[str]
    timeout: float
    idle_timeout: float
    max_body_bytes: int
    log_level: str
    flags: list[dict]  # flag_table.describe_flags()
    ray: dict | None = None  # with --replicas / --ray-address: ray_options()


def router_spec(args: argparse.Namespace, argv: list[str] | None = None) -> RouterSpec:
    """The spec for parsed serve flags; `argv`: the command line they came from, by default the
    process's own."""
    server = settings_from(args, "server")
    _check_combination(args, server)
    from lamplight.serve_options import log_level  # --log-disable, -v, -lv: uvicorn's level

    return RouterSpec(argv=serve_argv(args) if argv is None else list(argv),
                      router={**ROUTER_DEFAULTS, **settings_from(args, "router")}, host=server["host"],
                      port=server["port"], api_keys=[*server["api_keys"], *(getattr(args, "api_key_file", None) or ())],
                      cors_origins=list(server["cors_origins"]), timeout=server["timeout"],
                      idle_timeout=server["idle_timeout"], max_body_bytes=settings_from(args, "limits")["max_body_bytes"],
                      log_level=log_level(args), flags=describe_flags(), ray=ray_options(args))


def ray_options(args: argparse.Namespace) -> dict | None:
    """The Ray Serve settings, where --replicas or --ray-address asks for Ray (None: child processes)."""
    if not (getattr(args, "replicas", 0) or getattr(args, "ray_address", None)):
        return None
    if args.replicas < 0:
        raise RouterStartupError("--replicas must be at least 1")
    return {"replicas": args.replicas or 1, "address": args.ray_address, "route": args.route,
            "route_imbalance": args.route_imbalance, "block_chars": args.route_block_chars}


def _become_lean_router(spec: RouterSpec) -> None:
    with tempfile.NamedTemporaryFile("w", prefix="lamplight-router-", suffix=".json", delete=False) as f:
        json.dump(dataclasses.asdict(spec), f)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "lamplight.router.launch", f.name])


def main(spec_path: str) -> int:
    """`python -m lamplight.router.launch SPEC.json` (run_router's exec): the router alone."""
    with open(spec_path, encoding="utf-8") as f:
        spec = RouterSpec(**json.load(f))
    os.unlink(spec_path)
    try:
        router = build_router(spec)
    except STARTUP_ERRORS as exc:
        print(f"lamplight: error: {exc}", file=sys.stderr, flush=True)
        return 1
    return router.serve()


@dataclass
class Router:
    models: Models
    app: Any
    host: str
    port: int
    log_level: str
    idle_timeout: float

    def uvicorn_server(self) -> uvicorn.Server:
        config = uvicorn.Config(self.app, host=self.host, port=self.port, log_level=self.log_level,
                                timeout_keep_alive=self.idle_timeout, server_header=False)
        return uvicorn.Server(config)

    def serve(self) -> int:
        names = ", ".join(f"{i.name} ({i.entry.source}{', ' + i.entry.problem if i.entry.problem else ''})"
                          for i in self.models.instances.values())
        say(f"{len(self.models.instances)} models: {names or 'none'}")
        backend = self.models.backend
        previous = signal.getsignal(signal.SIGTERM)
        try:
            backend.connect()  # before the port is bound: /health answers once models can load
            # After ray.init, which installs its own (an exit with status 15); uvicorn re-raises the
            # signal once it has stopped, and this one lets the backend disconnect.
            signal.signal(signal.SIGTERM, _interrupt)
            say(f"listening on http://{self.host}:{self.port}")
            self.uvicorn_server().run()
        except KeyboardInterrupt:
            pass  # uvicorn re-raises Ctrl-C (and SIGTERM) after its graceful shutdown (the models are stopped)
        except Exception as exc:  # Ray that cannot start, or a cluster that cannot be joined
            say(f"error: {exc}")
            return 1
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the shutdown short
            try:
                backend.disconnect()
            finally:
                signal.signal(signal.SIGTERM, previous)
        return 0


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def build_router(spec: RouterSpec) -> Router:
    settings, table = spec.router, table_from_rows(spec.flags)
    cli_flags = flags_from_argv(spec.argv, table)
    global_preset, presets = (read_preset_file(settings["models_preset"], table) if settings["models_preset"]
                              else (Preset(GLOBAL_SECTION), {}))
    local = scan_models_dir(settings["models_dir"]) if settings["models_dir"] else []
    catalog = build_catalog(cached_models(), local, presets, global_preset)
    _check_startup_loads(catalog, settings["models_max"])
    options = RouterOptions(models_max=settings["models_max"], autoload=settings["models_autoload"],
                            sleep_idle_seconds=settings["sleep_idle_seconds"], load_timeout=spec.timeout)

    def flags_of(entry: ModelEntry) -> Flags:
        return merged_flags(global_preset.flags, entry.preset.flags, cli_flags)

    if spec.ray is None:
        _check_no_replicas_keys(global_preset, catalog)
        backend = ChildProcesses(lambda entry, port: child_command(entry, port, flags_of(entry)),
                                 child_env(os.environ, table), say)
    else:
        backend = ray_backend(spec.ray, catalog, settings["models_max"], spec.idle_timeout, global_preset, flags_of)
    models = Models(catalog, options, backend, say)
    http = HttpOptions(api_keys=tuple(spec.api_keys), cors_origins=tuple(spec.cors_origins), timeout=spec.timeout,
                       max_body_bytes=spec.max_body_bytes)
    return Router(models, create_app(models, http), spec.host, spec.port, spec.log_level, spec.idle_timeout)


def ray_backend(ray: dict, catalog: dict[str, ModelEntry], models_max: int, idle_timeout: float,
                global_preset: Preset, flags_of):
    """Each model a Ray Serve application of its replicas (ray_models.py)."""
    try:
        from lamplight.distributed.cluster import ClusterOptions, ServeCluster
    except ImportError:
        raise RouterStartupError("--replicas / --ray-address need Ray Serve: pip install -c constraints.txt "
                                 "-e '.[ray]'") from None
    from .ray_models import RayServeBackend

    cluster = ServeCluster(ClusterOptions(
        address=ray["address"], route=ray["route"], route_imbalance=ray["route_imbalance"],
        block_chars=ray["block_chars"], models_at_once=models_max if models_max > 0 else max(1, len(catalog)),
        idle_timeout=idle_timeout))

    def replicas_of(entry: ModelEntry) -> int:  # the model's section, then [*], then --replicas
        return entry.preset.replicas or global_preset.replicas or ray["replicas"]

    return RayServeBackend(cluster, lambda entry: serve_argv_of(entry, flags_of(entry)), replicas_of, say)


def _check_no_replicas_keys(global_preset: Preset, catalog: dict[str, ModelEntry]) -> None:
    for preset in (global_preset, *(entry.preset for entry in catalog.values())):
        if preset.replicas is not None:
            raise RouterStartupError(f"preset [{preset.name}]: key 'replicas' needs Ray Serve: start the router "
                                     f"with --replicas N (or --ray-address ADDR)")


def _check_combination(args: argparse.Namespace, server: dict) -> None:
    refused = [("--ssl-key-file / --ssl-cert-file", server.get("ssl_certfile") or server.get("ssl_keyfile")),
               ("--api-prefix", server.get("api_prefix")),
               ("--host ending in .sock (a UNIX socket)", str(server.get("host", "")).endswith(".sock"))]
    for flag, given in refused:
        if given:
            raise RouterStartupError(f"{flag}: not yet in router mode (--models-dir, --models-preset)")


def _check_startup_loads(catalog: dict[str, ModelEntry], models_max: int) -> None:
    wanted = [name for name, entry in catalog.items() if entry.preset.load_on_startup]
    if models_max > 0 and len(wanted) > models_max:
        raise RouterStartupError(f"{len(wanted)} models have load-on-startup ({', '.join(wanted)}), more than "
                                 f"--models-max {models_max}")


def serve_argv(args: argparse.Namespace) -> list[str]:
    """The serve flags as given: the namespace's `serve_argv` where the command line put it there,
    else this process's own `lamplight serve ...`."""
    given = getattr(args, "serve_argv", None)
    if given is not None:
        return list(given)
    if sys.argv[1:2] == ["serve"]:
        return sys.argv[2:]
    say("the command line is not `lamplight serve ...`: no model flags are passed on to the models")
    return []


def child_command(entry: ModelEntry, port: int, flags: Flags) -> list[str]:
    """`python -m lamplight.cli serve --host 127.0.0.1 --port P -m FILE --alias NAME <flags>`."""
    return [sys.executable, "-m", "lamplight.cli", "serve", "--host", CHILD_HOST, "--port", str(port),
            *serve_argv_of(entry, flags)]


def serve_argv_of(entry: ModelEntry, flags: Flags) -> list[str]:
    """The serve flags of the model's server: `-m FILE [--mmproj PROJECTOR] --alias NAME <flags>`
    (on Ray, its replicas'). The projector found beside the model in its folder is loaded, as
    llama-server's router does, unless the flags name one or say --no-mmproj."""
    source = ["-m", entry.path] if entry.path else ["-hf", entry.hf_repo]
    if entry.mmproj and not {"mmproj", "no_mmproj"} & flags.keys():
        source += ["--mmproj", entry.mmproj]
    return [*source, "--alias", entry.name, *(token for setting in flags.values() for token in setting)]


def child_env(environ: dict[str, str], table: FlagTable) -> dict[str, str]:
    """The router's environment, less the variables of the flags the router decides (a child
    must not become a router itself, nor listen where the router does)."""
    reserved = table.env_names(ROUTER_ONLY | MODEL_CHOICE)
    return {**{key: value for key, value in environ.items() if key not in reserved}, "PYTHONUNBUFFERED": "1"}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
