"""`lamplight serve`'s parsed flags -> what they configure: the engine's EngineOptions and the
server's ServerSettings (with its RequestLimits and per-request sampling defaults), each filled
from the flags that name it in lamplight.serve_flags.

Below lamplight.cli and lamplight.distributed, which both build servers from these flags.
"""

from __future__ import annotations

import argparse

from lamplight.serve_flags import FlagError, FlagParser, add_serve_arguments, settings_from
from lamplight.speculative.config import spec_config


def serve_parser() -> argparse.ArgumentParser:
    """A parser of the serve flags alone (`serve run lamplight.distributed:build_app ...`)."""
    parser = FlagParser(prog="lamplight serve", add_help=False)
    add_serve_arguments(parser)
    return parser


def engine_options(args: argparse.Namespace):
    """EngineOptions from the flags; FlagError for flags that contradict each other."""
    from lamplight.server.launcher import EngineOptions

    engine = settings_from(args, "engine")
    if engine["kv_unified"] is None:  # llama-server's rule: one pool when the slots are auto (-np -1)
        engine["kv_unified"] = args.parallel == -1
    try:
        speculative = spec_config(settings_from(args, "spec"))
    except ValueError as exc:
        raise FlagError(str(exc)) from None
    return EngineOptions(**engine, speculative=speculative)


def server_settings(args: argparse.Namespace):
    """ServerSettings from the flags; FlagError for flags that contradict each other."""
    from lamplight.server.settings import RequestLimits, ServerSettings

    server = settings_from(args, "server")
    server["api_keys"] = (*server["api_keys"], *(args.api_key_file or ()))  # llama-server takes both
    if server["grammar"] and server["json_schema"] is not None:
        raise FlagError("--grammar and --json-schema: give one server-wide constraint, not both")
    if bool(server["ssl_keyfile"]) != bool(server["ssl_certfile"]):
        raise FlagError("--ssl-key-file and --ssl-cert-file: HTTPS needs both")
    if args.reasoning == "off" and server["reasoning_budget"] == -1:
        server["reasoning_budget"] = 0  # `-rea off`: no thinking, as --reasoning-budget 0
    return ServerSettings(**server, log_level=log_level(args), limits=RequestLimits(**settings_from(args, "limits")),
                          sampling_defaults=settings_from(args, "sampling"))



def log_level(args: argparse.Namespace) -> str:
    """uvicorn's log level: --log-disable, else -v, else -lv's threshold (llama.cpp's levels)."""
    if args.log_disable:
        return "critical"
    if args.verbose or args.verbosity >= 4:
        return "debug"
    return {0: "error", 1: "error", 2: "warning"}.get(args.verbosity, "info")
