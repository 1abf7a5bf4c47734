"""`lamplight serve`'s parsed flags -> what they configure: the engine's EngineOptions and the
server's ServerSettings (with its RequestLimits and per-request sampling defaults), each filled
from the flags that name it in lamplight.serve_flags.

Below lamplight.cli and lamplight.distributed, which both build servers from these flags.
"""

from __future__ import annotations

import argparse

from lamplight.serve_flags import add_serve_arguments, settings_from


def serve_parser() -> argparse.ArgumentParser:
    """A parser of the serve flags alone (`serve run lamplight.distributed:build_app ...`)."""
    parser = argparse.ArgumentParser(prog="lamplight serve")
    add_serve_arguments(parser)
    return parser


def engine_options(args: argparse.Namespace):
    from lamplight.server.launcher import EngineOptions

    return EngineOptions(**settings_from(args, "engine"))


def server_settings(args: argparse.Namespace):
    from lamplight.server.settings import RequestLimits, ServerSettings

    return ServerSettings(**settings_from(args, "server"), limits=RequestLimits(**settings_from(args, "limits")),
                          sampling_defaults=settings_from(args, "sampling"))
