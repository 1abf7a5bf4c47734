"""The serve-flag table (lamplight.serve_flags): each flag written once, read by the parser and its
--help, by EngineOptions / EngineConfig / ServerSettings / RequestLimits for their defaults, and
below both the CLI and the replicas (no import of lamplight.cli from lamplight.distributed)."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

import lamplight
from lamplight.cli import build_parser, engine_options, main, server_settings
from lamplight.engine.config import CACHE_TYPES, EngineConfig
from lamplight.serve_flags import CACHE_TYPE_NAMES, SERVE_FLAGS, default_of, sampling_flags
from lamplight.serve_options import serve_parser
from lamplight.server.launcher import EngineOptions
from lamplight.server.settings import RequestLimits, ServerSettings

RECORDS = {"engine": EngineOptions, "server": ServerSettings, "limits": RequestLimits}


def test_help_lists_every_flag_with_its_help_and_default(capsys):
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = capsys.readouterr().out
    words = " ".join(text.split())  # one line: argparse wraps at the terminal's width
    for flag in (*SERVE_FLAGS, *sampling_flags()):
        for name in flag.names:
            assert f"{name} " in words or f"{name}," in words, name
        # Without any white space: argparse may also break a line after a hyphen.
        assert "".join(flag.help_text().replace("%%", "%").split()) in "".join(text.split()), flag.names
    assert "--temp N, --temperature N default temperature (default: 0.8) (env: LLAMA_ARG_TEMPERATURE)" in words
    assert ("-np N, --parallel N number of slots, -1 = auto (4, sharing one KV pool: --kv-unified) (default: -1) "
            "(env: LLAMA_ARG_N_PARALLEL)") in words


def test_every_setting_a_flag_names_exists():
    assert set(CACHE_TYPE_NAMES) == set(CACHE_TYPES)  # -ctk/-ctv offer what the engine stores
    for flag in SERVE_FLAGS:
        if flag.record in RECORDS:
            assert flag.field in {f.name for f in dataclasses.fields(RECORDS[flag.record])}, flag.to


def test_records_take_their_defaults_from_the_flags():
    defaults = build_parser().parse_args(["serve"])
    assert engine_options(defaults) == EngineOptions()
    assert server_settings(defaults) == ServerSettings()
    assert server_settings(defaults).sampling_defaults == {}
    config = EngineConfig()
    for name in ("n_parallel", "n_batch", "n_ubatch", "queue_size", "context_shift"):
        assert getattr(config, name) == default_of(f"engine.{name}") == getattr(EngineOptions(), name)
    assert (EngineOptions().n_parallel, RequestLimits().max_n_probs, ServerSettings().port) == (4, 100, 8080)


def test_sampling_flags_are_checked_by_the_sampling_table(capsys):
    args = build_parser().parse_args(["serve", "--seed", "-1", "--temp", "0", "--top-p", "1", "--top-k", "-5"])
    assert server_settings(args).sampling_defaults == {"seed": -1, "temperature": 0.0, "top_p": 1.0, "top_k": -5}
    for flag, value, reason in (("--temp/--temperature", "-1", "must be a number >= 0, got -1"),
                                ("--top-p", "1.5", "must be a number in [0, 1], got 1.5"),
                                ("-s/--seed", "4294967296", "must be an integer in [-1, 4294967295], got 4294967296"),
                                ("--top-k", "x", "must be an integer, got 'x'")):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["serve", flag.split("/")[-1], value])
        assert capsys.readouterr().err == f"lamplight serve: error: argument {flag}: {reason}\n"


def test_the_replicas_parser_reads_the_same_flags():
    args = serve_parser().parse_args(["--model", "m.gguf", "--ctx-size", "2048", "--replicas", "2", "--metrics"])
    assert engine_options(args) == dataclasses.replace(EngineOptions(), n_ctx=2048)
    assert server_settings(args) == dataclasses.replace(ServerSettings(), metrics=True)
    assert (args.model, args.replicas) == ("m.gguf", 2)


def _imported_modules(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


def test_nothing_below_the_cli_imports_it():
    package = Path(lamplight.__file__).parent
    below = [*package.glob("distributed/*.py"), *package.glob("server/*.py"), package / "serve_flags.py",
             package / "serve_options.py"]
    for path in below:
        assert "lamplight.cli" not in _imported_modules(path), path
    table = _imported_modules(package / "serve_flags.py")
    assert not {name for name in table if name.startswith(("lamplight.server", "lamplight.engine"))}


def test_a_flag_is_implemented_accepted_or_refused_and_never_two():
    for flag in (*SERVE_FLAGS, *sampling_flags()):
        assert not (flag.note and flag.refused), flag.names
        assert not (flag.refused and flag.to), flag.names  # a refused flag fills no setting
        assert not (flag.own and (flag.note or flag.refused or flag.env)), flag.names
