"""llama.cpp's model presets (`--models-preset FILE.ini`) and the router's own command line, both
turned into the flags each child is started with.

The file's format is llama-server's (common/preset.cpp): `version = 1`, then sections; `[*]`
holds the flags of every model, any other section one model's: the name of a model another source
lists (its flags are then that model's), or a new model with `model = PATH` or `hf-repo =
USER/REPO[:QUANT]`. Keys are flag names without their dashes (`ctx-size`), short names (`c`) or
`LLAMA_ARG_*` names; a switch takes true/false (1/0, on/off, enabled/disabled). Three keys are
the preset's own: `load-on-startup`, `stop-timeout` (seconds before an unloading child is killed,
default 10), `dedup-cache-models`. Comments start with `;` or `#`.

Precedence, as llama-server's: the router's command line > the model's section > `[*]`. The flags
the router decides (host, port, API key, the router's own; flag_table.ROUTER_ONLY) are dropped
from both, as llama-server drops them. An unknown key, a refused flag, a switch that is not a
boolean: PresetError naming the key and the section, before the port is bound.

One router flag is also a preset key: with `--replicas N` (Ray Serve, ray_models.py), `replicas = M`
gives a model M replicas instead (under `[*]`: every model without its own).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from lamplight.serve_flags import FlagError, parse_bool

from .flag_table import MODEL_CHOICE, ROUTER_ONLY, FlagInfo, FlagTable

GLOBAL_SECTION = "*"
DEFAULT_STOP_TIMEOUT = 10.0  # seconds, llama-server's DEFAULT_STOP_TIMEOUT
PRESET_ONLY_KEYS = ("load-on-startup", "stop-timeout", "dedup-cache-models")

_SECTION = re.compile(r"^\[\s*([^\]]+?)\s*\]$")
_KEY_VALUE = re.compile(r"^([A-Za-z_][A-Za-z0-9_.-]*)\s*=\s*(.*)$")

# A model's flags for its child: setting (argparse dest) -> the command-line tokens that give it.
Flags = dict[str, list[str]]


class PresetError(ValueError):
    """A preset file, or the router's command line, that cannot be used; the message names the place."""


@dataclass
class Preset:
    """One section of the file: a model's flags, or every model's (`[*]`)."""

    name: str
    flags: Flags = field(default_factory=dict)
    model: str | None = None  # `model = PATH` (absolute), or an alias lamplight pulls
    hf_repo: str | None = None
    aliases: tuple[str, ...] = ()
    load_on_startup: bool = False
    stop_timeout: float | None = None
    dedup_cache_models: bool | None = None
    replicas: int | None = None  # `replicas = N`: this model's (or [*]: every model's) Ray Serve replicas

    @property
    def names_a_model(self) -> bool:
        return bool(self.model or self.hf_repo)


def read_preset_file(path: str, table: FlagTable) -> tuple[Preset, dict[str, Preset]]:
    """(the `[*]` section, the other sections by name) of an INI file."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise PresetError(f"--models-preset {path}: {exc.strerror or exc}") from None
    presets = {name: preset_from_section(name, entries, table) for name, entries in parse_ini(text, path).items()}
    return presets.pop(GLOBAL_SECTION, Preset(GLOBAL_SECTION)), presets


def parse_ini(text: str, path: str) -> dict[str, dict[str, str]]:
    """Sections -> their keys and values, in the file's order."""
    sections: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for number, raw in enumerate(text.splitlines(), 1):
        line = _without_comment(raw).strip()
        if not line:
            continue
        where = f"{path} line {number}"
        if header := _SECTION.match(line):
            current = sections.setdefault(header.group(1), {})
        elif pair := _KEY_VALUE.match(line):
            key, value = pair.group(1), pair.group(2).strip()
            if current is None:
                if key != "version":
                    raise PresetError(f"{where}: '{key}' is outside any section (every model's flags go under [*])")
                continue
            current[key] = value
        else:
            raise PresetError(f"{where}: not a [section] header nor a key = value line: {raw.strip()!r}")
    return sections


def _without_comment(line: str) -> str:
    """llama.cpp's INI: a value ends at the first ';' or '#' (common/preset.cpp)."""
    cut = min((i for i in (line.find(";"), line.find("#")) if i >= 0), default=len(line))
    return line[:cut]


def preset_from_section(name: str, entries: dict[str, str], table: FlagTable) -> Preset:
    preset = Preset(name)
    for key, value in entries.items():
        where = f"preset [{name}]: key '{key}'"
        if key == "version":
            continue
        if key in PRESET_ONLY_KEYS:
            _set_preset_key(preset, key, value, where)
            continue
        flag = table.by_key(key)
        if flag is None:
            raise PresetError(f"{where} is not a lamplight serve flag (keys are flag names such as ctx-size or c, "
                              f"or LLAMA_ARG_* names; the preset's own: {', '.join(PRESET_ONLY_KEYS)})")
        if flag.refused:
            raise PresetError(f"{where}: {flag.refused}")
        if flag.dest in MODEL_CHOICE:
            _set_model_choice(preset, flag.dest, value)
        elif flag.dest == "replicas":  # the router's own flag, which a section refines for its model
            preset.replicas = _replicas(value, where)
        elif flag.dest not in ROUTER_ONLY:  # the router's own: dropped, as llama-server drops them
            tokens = flag_tokens(table, flag, key, value, where)
            if tokens:
                preset.flags[flag.dest] = tokens
    return preset


def _set_preset_key(preset: Preset, key: str, value: str, where: str) -> None:
    if key == "stop-timeout":
        try:
            preset.stop_timeout = float(value)
        except ValueError:
            raise PresetError(f"{where}: must be a number of seconds, got {value!r}") from None
    elif key == "load-on-startup":
        preset.load_on_startup = boolean(value, where)
    else:
        preset.dedup_cache_models = boolean(value, where)


def _replicas(value: str, where: str) -> int:
    try:
        replicas = int(value)
    except ValueError:
        replicas = 0
    if replicas < 1:
        raise PresetError(f"{where}: must be a whole number of replicas, at least 1, got {value!r}")
    return replicas


def _set_model_choice(preset: Preset, dest: str, value: str) -> None:
    if dest == "alias":
        preset.aliases = tuple(part.strip() for part in value.split(",") if part.strip())
    elif dest == "hf_repo":
        preset.hf_repo = value
    else:  # a path is the router's working directory's, as llama-server reads it; an alias stays one
        preset.model = os.path.abspath(os.path.expanduser(value)) if _looks_like_path(value) else value


def _looks_like_path(value: str) -> bool:
    return value.lower().endswith(".gguf") or os.sep in value or value.startswith(("~", "."))


def boolean(value: str, where: str) -> bool:
    """A switch's value, spelled as llama.cpp reads booleans (serve_flags.parse_bool)."""
    try:
        return parse_bool(value, where)
    except FlagError as exc:
        raise PresetError(str(exc)) from None


def flag_tokens(table: FlagTable, flag: FlagInfo, key: str, value: str, where: str) -> list[str]:
    """`key = value` as the tokens a child's command line gives it."""
    if flag.switch:
        on = boolean(value, where)
        spelling = next((name for name in flag.names if name.lstrip("-") == key), flag.long_name)
        if on:
            return [spelling]
        negative = table.spelling_for(flag, on=False)
        return [negative] if negative else []  # a switch with no "off" spelling: left out, as llama.cpp
    if isinstance(flag.nargs, int) and flag.nargs > 1:
        return [flag.long_name, *value.split()]
    if flag.nargs == "?" and not value:
        return [flag.long_name]
    return [flag.long_name, value]


def flags_from_argv(argv: list[str], table: FlagTable) -> Flags:
    """The router's command line as every child's flags, less the ones the router decides."""
    flags: Flags = {}
    i = 0
    while i < len(argv):
        token = argv[i]
        name, has_inline, inline = token.partition("=") if token.startswith("--") else (token, "", "")
        flag = table.by_key(name) if name.startswith("-") else None
        if flag is None:
            raise PresetError(f"the router's command line: {token!r} is not a serve flag")
        taken = _values_taken(flag, argv, i, bool(has_inline))
        if flag.dest not in ROUTER_ONLY and flag.dest not in MODEL_CHOICE:
            flags.setdefault(flag.dest, []).extend(argv[i:i + 1 + taken])
        i += 1 + taken
    return flags


def _values_taken(flag: FlagInfo, argv: list[str], i: int, inline: bool) -> int:
    """How many tokens after argv[i] are its values (as argparse takes them)."""
    if flag.switch or inline:
        return 0
    if flag.nargs == "?":
        following = argv[i + 1] if i + 1 < len(argv) else "-"
        return 0 if following.startswith("-") else 1
    return flag.nargs if isinstance(flag.nargs, int) else 1


def merged_flags(*layers: Flags) -> Flags:
    """Later layers win, setting by setting (the command line over a model's section over `[*]`)."""
    merged: Flags = {}
    for layer in layers:
        merged.update(layer)
    return merged
