"""The serve flags as the router needs them: every spelling a preset key or a command-line token
can take (long and short names without their dashes, `LLAMA_ARG_*` names), which flags are
switches, and which ones the router keeps for itself.

The flags are lamplight.serve_flags's table (`all_flags`), whose sampling flags come from the
sampling table (numpy). The process that parsed `lamplight serve`'s command line has it already:
it describes the table as JSON rows (`describe_flags`), which the router's own lean process
(launch.py) reads back (`table_from_rows`) without importing the flags' modules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

# Flags the router decides for every child (or reads itself): never passed on from the router's
# command line or a preset. llama-server drops the same ones (server-models.cpp unset_reserved_args).
ROUTER_ONLY = frozenset({
    "host", "port", "api_key", "api_key_file", "api_prefix", "ssl_key_file", "ssl_cert_file",
    "models_dir", "models_preset", "models_max", "models_autoload", "sleep_idle_seconds",
    "replicas", "ray_address", "route", "route_imbalance", "route_block_chars", "help", "version",
    "cache_list", "list_devices",
})
# Flags that say which model a child serves: a preset's `model` / `hf-repo` / `alias`, never
# the router's own (which has no model).
MODEL_CHOICE = frozenset({"model", "hf_repo", "alias"})


@dataclass(frozen=True)
class FlagInfo:
    names: tuple[str, ...]  # as llama-server spells them: ("-c", "--ctx-size")
    dest: str  # the setting's name (argparse's dest); an on/off pair shares one
    switch: bool  # takes no value
    value: Any = None  # what giving a switch stores (True, False, a constant)
    env: str | None = None
    nargs: Any = None  # argparse's: None (one value), "?", 2 ...
    refused: str | None = None

    @property
    def long_name(self) -> str:
        """The spelling a child is given: the last one, llama-server's main name (`--ctx-size`)."""
        return self.names[-1]

    @property
    def keys(self) -> tuple[str, ...]:
        """A preset's spellings of it: each name without its dashes, and its environment variable."""
        return tuple(name.lstrip("-") for name in self.names) + ((self.env,) if self.env else ())


class FlagTable:
    def __init__(self, flags: Iterable[FlagInfo]):
        self.flags = tuple(flags)
        self._by_key: dict[str, FlagInfo] = {}
        for flag in self.flags:
            for key in flag.keys:
                self._by_key.setdefault(key, flag)

    def by_key(self, key: str) -> FlagInfo | None:
        """The flag a preset key (`ctx-size`, `c`, `LLAMA_ARG_CTX_SIZE`) or a token (`--ctx-size`) names."""
        return self._by_key.get(key.lstrip("-") if key.startswith("-") else key)

    def spelling_for(self, flag: FlagInfo, on: bool) -> str | None:
        """The switch spelling that sets `flag`'s setting on or off (`--context-shift` /
        `--no-context-shift`); None where the setting has no such spelling."""
        wanted = flag.value if on else _opposite(flag.value)
        for other in self.flags:
            if other.dest == flag.dest and other.switch and other.value == wanted:
                return other.long_name
        negatives = [name for name in flag.names if name.lstrip("-").startswith("no-")]
        if not on and negatives and flag.value is True:  # one entry holding both: --mmap / --no-mmap
            return negatives[-1]
        return None

    def env_names(self, dests: Iterable[str]) -> set[str]:
        wanted = set(dests)
        return {flag.env for flag in self.flags if flag.dest in wanted and flag.env}


def _opposite(value: Any) -> Any:
    return (not value) if isinstance(value, bool) else None


def describe_flags() -> list[dict]:
    """The serve flags as JSON-able rows (this imports lamplight.serve_flags and its sampling table)."""
    from lamplight.serve_flags import all_flags

    return [{"names": list(flag.names), "dest": flag.attribute, "switch": flag.is_switch,
             "value": _json_or_none(flag.switch_value) if flag.is_switch else None, "env": flag.env,
             "nargs": flag.nargs, "refused": flag.refused} for flag in all_flags()]


def _json_or_none(value: Any) -> Any:
    return value if isinstance(value, (bool, int, float, str)) or value is None else None


def table_from_rows(rows: list[dict]) -> FlagTable:
    return FlagTable(FlagInfo(names=tuple(row["names"]), dest=row["dest"], switch=row["switch"], value=row["value"],
                              env=row["env"], nargs=row["nargs"], refused=row["refused"]) for row in rows)


def load_flag_table() -> FlagTable:
    """The table, read in this process (which then holds the flags' modules: tests, and the parsing process)."""
    return table_from_rows(describe_flags())
