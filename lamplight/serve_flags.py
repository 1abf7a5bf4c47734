"""Every `lamplight serve` flag, written once: its names (llama-server's), type, default, help, its
`LLAMA_ARG_*` environment variable, and the setting it fills. Adding a flag is one entry in
FLAG_GROUPS (or, for a sampling default, in SAMPLING_SPELLINGS).

`to` names the setting: "engine.FIELD" (lamplight.server.launcher.EngineOptions), "server.FIELD"
(lamplight.server.settings.ServerSettings), "limits.FIELD" (its RequestLimits),
"sampling.FIELD" (a per-request sampling default), "routing.FIELD" (lamplight.distributed's
router) or "router.FIELD" (router mode, lamplight.router); flags without one are read by the
command itself (the model, threads, replicas).

Every llama-server flag parses, with one of three statuses (`Flag.status`, the README's table):
implemented; accepted with a note (hardware or features lamplight does not drive: one log line at
start-up says what lamplight does instead); refused (exit status 2, one line naming the flag and
why). Flags marked `own` are lamplight's alone. A flag given neither on the command line nor in
its environment variable takes its default (command line > environment > default, as llama.cpp).

Read by `lamplight serve`'s parser and --help (add_serve_arguments), by lamplight.serve_options
(parsed flags -> EngineOptions / ServerSettings), and for their defaults (`default_of`) by
EngineOptions, EngineConfig, ServerSettings, RequestLimits and the router's block size. So this
module stays low: nothing of lamplight's at import time (the sampling table only once the
parser is built).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

from lamplight.speculative.config import (DRAFT_MODEL_KIND, NGRAM_KINDS, NGRAM_SIZE_LIMIT, DraftModelSizes,
                                          NgramMapSizes, NgramModSizes, parse_kinds)

DEFAULT_MODEL = "smollm2-135m-instruct"
MAX_DEFAULT_CTX = 4096  # the context of an engine built without one (the library's EngineConfig)
# `-c 0` (the default) takes the model's training context, the KV cache of which may take at most
# this share of the memory available at start-up (the start-up log says which).
CTX_MEMORY_SHARE = 0.5
AUTO_PARALLEL = 4  # `-np -1` (llama-server's default, "auto"): 4 slots, as llama-server picks
CACHE_TYPE_NAMES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")  # `-ctk/-ctv` values (lamplight.engine.config.CACHE_TYPES)
# llama.cpp's spellings of a boolean environment variable (common/arg.cpp is_truthy / is_falsey).
TRUTHY = ("1", "true", "on", "enabled")
FALSY = ("0", "false", "off", "disabled")

IMPLEMENTED, ACCEPTED, REFUSED = "implemented", "accepted with a note", "refused"


class FlagError(ValueError):
    """A flag or environment variable that cannot be used; the message names it."""


class _Unset:
    """argparse's default for every flag: not on the command line (the environment or the
    flag's default fills it after parsing)."""

    def __repr__(self) -> str:
        return "UNSET"

    def __bool__(self) -> bool:
        return False


UNSET = _Unset()


def comma_list(value: str | None) -> tuple[str, ...]:
    return tuple(part.strip() for part in (value or "").split(",") if part.strip())


def _same(value: Any) -> Any:
    return value


# -- value types (argparse's `type`, also applied to environment values) ----------------------

def _checked(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """A parser whose ValueError / OSError becomes argparse's message for the flag."""

    @functools.wraps(parse)
    def value(text: str) -> Any:
        try:
            return parse(text)
        except (ValueError, OSError) as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return value


@_checked
def slot_count(text: str) -> int:
    """`-np`: a number of slots >= 1, or -1 for auto (AUTO_PARALLEL)."""
    value = int(text)
    if value != -1 and value < 1:
        raise ValueError(f"must be -1 (auto) or a number of slots >= 1, got {value}")
    return value


def _auto_parallel(value: int) -> int:
    return AUTO_PARALLEL if value == -1 else value


@_checked
def speculative_kinds(text: str) -> tuple[str, ...]:
    return parse_kinds(text)


def int_in(low: int, high: int | None = None) -> Callable[[str], int]:
    """An integer flag value of at least `low` (and at most `high` where given)."""

    def int_value(text: str) -> int:
        value = int(text)
        if value < low or (high is not None and value > high):
            bound = f"between {low} and {high}" if high is not None else f"at least {low}"
            raise ValueError(f"must be {bound}, got {value}")
        return value

    return _checked(int_value)


_ngram_size, _ngram_count = int_in(1, NGRAM_SIZE_LIMIT), int_in(0, NGRAM_SIZE_LIMIT)

_min_hits, _non_negative = int_in(1), int_in(0)


@_checked
def _probability(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"must be between 0 and 1, got {value:g}")
    return value


@_checked
def file_text(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


@_checked
def api_key_file(path: str) -> tuple[str, ...]:
    """llama-server's key file: one key per line; blank lines and lines starting with # skipped."""
    with open(path, encoding="utf-8") as f:
        keys = tuple(line.strip() for line in f if line.strip() and not line.lstrip().startswith("#"))
    if not keys:
        raise ValueError(f"no API key in {path}")
    return keys


def _json_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None


@_checked
def json_object(text: str) -> dict:
    value = _json_value(text)
    if not isinstance(value, dict):
        raise ValueError(f"must be a JSON object, got {type(value).__name__}")
    return value


@_checked
def json_schema(text: str) -> Any:
    value = _json_value(text)
    if not isinstance(value, (dict, bool)):
        raise ValueError(f"must be a JSON schema object, got {type(value).__name__}")
    return value


def json_schema_file(path: str) -> Any:
    return json_schema(file_text(path))


_LOGIT_BIAS = re.compile(r"^\s*(\d+)\s*([+-])\s*(inf|infinity|[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*$", re.I)


@_checked
def logit_bias_entry(text: str) -> tuple[int, float]:
    """`-l TOKEN_ID(+/-)BIAS`, as llama.cpp reads it: `15043+1`, `15043-1`, `2-inf` (a ban)."""
    match = _LOGIT_BIAS.match(text)
    if match is None:
        raise ValueError(f"expects TOKEN_ID+BIAS or TOKEN_ID-BIAS (e.g. 15043+1, 2-inf), got {text!r}")
    token, sign, number = match.groups()
    bias = float(number)
    if sign == "+" and math.isinf(bias):
        raise ValueError(f"a bias of +inf is not allowed, got {text!r}")
    return int(token), -bias if sign == "-" else bias


@_checked
def dry_breaker(text: str) -> str:
    if text == "none":
        raise ValueError("'none' (DRY without sequence breakers) is not supported by lamplight: give at least "
                         "one breaker")
    return text


@_checked
def reasoning_format(text: str) -> str:
    from lamplight.chat.reasoning import REASONING_FORMATS  # read when parsing: this module imports nothing

    if text not in REASONING_FORMATS:
        raise ValueError(f"must be one of {', '.join(REASONING_FORMATS)}, got {text!r}")
    return text


@_checked
def reasoning_mode(text: str) -> str:
    if text not in ("on", "off", "auto"):
        raise ValueError(f"must be on, off or auto, got {text!r}")
    return text


def parse_bool(text: str, name: str) -> bool:
    """A boolean environment value as llama.cpp reads it."""
    lowered = text.strip().lower()
    if lowered in TRUTHY:
        return True
    if lowered in FALSY:
        return False
    raise FlagError(f"{name}={text!r}: not a boolean (use one of {', '.join(TRUTHY)} or {', '.join(FALSY)})")


# -- argparse actions --------------------------------------------------------------------------

class AppendAction(argparse.Action):
    """A repeatable flag: each use appends its value (UNSET counts as empty)."""

    def __call__(self, parser, namespace, values, option_string=None):
        items = list(getattr(namespace, self.dest, None) or [])
        items.append(values)
        setattr(namespace, self.dest, items)


class LoraAction(argparse.Action):
    """`--lora FNAME[,FNAME...]` and `--lora-scaled FNAME:SCALE[,...]` append to one list, so the
    adapters get their ids in the order the flags were given (as llama-server)."""

    def __call__(self, parser, namespace, values, option_string=None):
        adapters = list(getattr(namespace, self.dest, None) or [])
        for item in comma_list(values):
            if option_string == "--lora-scaled":
                path, sep, scale = item.rpartition(":")
                try:
                    adapters.append((path, float(scale)))
                except ValueError:
                    sep = ""
                if not sep or not path:
                    parser.error(f"--lora-scaled expects FNAME:SCALE, got {item!r}")
            else:
                adapters.append((item, 1.0))
        setattr(namespace, self.dest, adapters)


class AcceptedAction(argparse.Action):
    """A flag lamplight has no use for: stores how it was given ("-ngl 99"), for its start-up note."""

    def __call__(self, parser, namespace, values, option_string=None):
        value = " ".join(values) if isinstance(values, list) else values
        setattr(namespace, self.dest, f"{option_string} {value}" if value else option_string)


class RefusedAction(argparse.Action):
    """A llama-server flag lamplight cannot honour yet: exit status 2 with one line saying why."""

    def __init__(self, option_strings, dest, reason: str = "", **kwargs):
        self.reason = reason
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        parser.exit(2, f"{parser.prog}: error: {option_string}: {self.reason}\n")


class VersionAction(argparse.Action):
    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None, **kwargs):
        super().__init__(option_strings, dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        from lamplight import __version__

        parser.exit(0, f"lamplight {__version__}\n")


_COMMAND_ACTIONS = ("help", VersionAction)  # flags that act at once and fill no setting


# -- the table ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Flag:
    names: tuple[str, ...]  # as llama-server spells them: ("-np", "--parallel")
    help: str  # without the default: --help adds "(default: ...)"
    default: Any = None
    type: Callable[[str], Any] | None = None
    to: str | None = None  # the setting it fills: "engine.n_parallel", "server.port", ...
    convert: Callable[[Any], Any] = _same  # the parsed value -> that setting's value
    dest: str | None = None  # argparse's attribute, when not the long name's
    action: Any = None  # an argparse action: "store_true", LoraAction...
    choices: tuple | None = None
    metavar: str | tuple[str, ...] | None = None
    # What --help says the default is, where the value alone would not tell; "": say nothing
    # (a second spelling of a setting whose first spelling says it).
    shown_default: str | None = None
    env: str | None = None  # llama.cpp's environment variable for it (common/arg.cpp set_env)
    nargs: Any = None
    const: Any = None  # a switch's value (store_const); False: the negative of a pair
    note: str | None = None  # accepted, and this is logged at start-up: what lamplight does instead
    refused: str | None = None  # refused with this reason (exit status 2)
    own: bool = False  # lamplight's own flag, not llama-server's

    @property
    def attribute(self) -> str:
        """The flag's name in the parsed arguments (argparse's dest)."""
        long_name = next(name for name in self.names if name.startswith("--"))
        return self.dest or long_name[2:].replace("-", "_")

    @property
    def record(self) -> str | None:
        return self.to.partition(".")[0] if self.to else None

    @property
    def field(self) -> str | None:
        return self.to.partition(".")[2] if self.to else None

    @property
    def status(self) -> str:
        return REFUSED if self.refused else ACCEPTED if self.note else IMPLEMENTED

    @property
    def is_switch(self) -> bool:
        """Takes no value: given or not (store_true/store_false/store_const)."""
        return self.action in ("store_true", "store_false", "store_const") or self.nargs == 0

    @property
    def switch_value(self) -> Any:
        """What giving a switch stores."""
        return {"store_true": True, "store_false": False}.get(self.action, self.const)

    @property
    def fills_setting(self) -> bool:
        return self.action not in _COMMAND_ACTIONS

    def help_text(self) -> str:
        shown = _shown(self.default) if self.shown_default is None else self.shown_default
        text = f"{self.help} (default: {shown})" if shown else self.help
        if self.env:
            text += f" (env: {self.env})"
        return text.replace("%", "%%")  # argparse %-formats help texts

    def add_to(self, parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
        options = {"type": self.type, "dest": self.dest, "action": self.action, "choices": self.choices,
                   "metavar": self.metavar, "nargs": self.nargs, "const": self.const}
        if self.refused:
            options.update(action=RefusedAction, reason=f"{self.refused}", nargs=self.nargs, type=None, const=None)
            if self.nargs == 0:
                options["metavar"] = None
        if self.fills_setting:
            options["default"] = UNSET
        parser.add_argument(*self.names, help=self.help_text(),
                            **{name: value for name, value in options.items() if value is not None})


def _shown(default: Any) -> str:
    if default is None or default == "" or default == ():
        return "none"
    if isinstance(default, bool):
        return "on" if default else "off"
    return str(default)


def _limit(flag: str, field: str, default: int, help: str) -> Flag:
    """A request limit: a refusal past it is a 400 (413 for the body) naming the field and the limit."""
    return Flag((flag,), help, default, int, to=f"limits.{field}", dest=field, metavar="N", own=True)


def _switch(names: tuple[str, ...], help: str, to: str | None, dest: str, value: bool, default: bool,
            **options: Any) -> Flag:
    """One side of an on/off pair (`--slots` / `--no-slots`): both fill `dest`."""
    return Flag(names, help, default, to=to, dest=dest, action="store_true" if value else "store_false",
                **({} if value else {"shown_default": ""}), **options)


def _accepted(names: tuple[str, ...], note: str, metavar: str | None = None, env: str | None = None,
              nargs: Any = None, dest: str | None = None, const: Any = True) -> Flag:
    """A llama-server flag lamplight has no use for: parsed (with its value, if any), and one line
    at start-up says what lamplight does instead."""
    return Flag(names, f"accepted, ignored: {note}", metavar=metavar, env=env, note=note, dest=dest,
                nargs=0 if metavar is None else nargs, action=AcceptedAction, const=const, shown_default="")


def _refused(names: tuple[str, ...], reason: str, metavar: str | None = None, env: str | None = None,
             nargs: Any = None, dest: str | None = None, const: Any = True) -> Flag:
    """A llama-server flag asking for what lamplight cannot do yet: exit status 2 naming it."""
    return Flag(names, f"refused: {reason}", metavar=metavar, env=env, refused=reason, dest=dest,
                nargs=0 if metavar is None else nargs, const=const, shown_default="")


_HARDWARE = "lamplight runs the whole model with torch on one device (the CPU, or torch's CUDA device)"
_THREADS = "lamplight leaves thread placement and priority to the OS; -t sets its thread count"
_NOT_YET = "not yet in lamplight"
_VIDEO = "not yet: video input (images are supported: --mmproj)"
_SPECULATIVE = "not yet in lamplight's speculative decoding (-md and the n-gram kinds of --spec-type work)"
_DRAFT_THREADS = "the draft model runs on the model's own threads (-t), one step after another"
_DRAFT_PLACEMENT = "not yet: the draft model's weights are read as the model's are, on the CPU"
_DRAFT_GREEDY = "the draft model drafts greedily (its likeliest token; the model's own sampling decides every token kept)"
_LOOKUP_CACHE = "not yet: the ngram-cache kind and its lookup files (the other n-gram kinds of --spec-type work)"
_REMOVED = "the argument has been removed from llama-server"
_SPEC_MAP, _SPEC_MOD, _SPEC_DRAFT = NgramMapSizes(), NgramModSizes(), DraftModelSizes()


def _ngram_map_flags(name: str, kind: str) -> tuple[Flag, ...]:
    field = "ngram_" + name.replace("-", "_")
    return (
        Flag((f"--spec-ngram-{name}-size-n",), f"{kind}: length of the lookup n-gram", _SPEC_MAP.size_n,
             _ngram_size, to=f"spec.{field}_size_n", metavar="N"),
        Flag((f"--spec-ngram-{name}-size-m",), f"{kind}: length of the drafted m-gram", _SPEC_MAP.size_m,
             _ngram_size, to=f"spec.{field}_size_m", metavar="N"),
        Flag((f"--spec-ngram-{name}-min-hits",), f"{kind}: hits of an n-gram before it drafts", _SPEC_MAP.min_hits,
             _min_hits, to=f"spec.{field}_min_hits", metavar="N"),
    )

# The flags in --help's groups; each group's title, then its flags.
FLAG_GROUPS: tuple[tuple[str, tuple[Flag, ...]], ...] = (
    ("model", (
        Flag(("-m", "--model"), "GGUF path or built-in alias", DEFAULT_MODEL, env="LLAMA_ARG_MODEL", metavar="FNAME"),
        Flag(("-hf", "-hfr", "--hf-repo"), "model from the Hugging Face Hub, e.g. "
             "bartowski/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M (default quant Q4_K_M, else the first GGUF); cached in "
             "huggingface_hub's cache",
             dest="hf_repo", metavar="USER/REPO[:QUANT]", env="LLAMA_ARG_HF_REPO"),
        Flag(("-hff", "--hf-file"), "with -hf: this file of the repository instead of a quant", metavar="FILE",
             env="LLAMA_ARG_HF_FILE"),
        Flag(("-hft", "--hf-token"), "Hugging Face token for gated or private repos", metavar="TOKEN",
             shown_default="$HF_TOKEN", env="HF_TOKEN"),
        Flag(("-cl", "--cache-list"), "list the cached models and exit (as `lamplight models`)", False,
             action="store_true"),
        Flag(("--list-devices",), "list the devices torch can run the model on, and exit", False,
             action="store_true"),
        Flag(("--offline",), "no network access: -hf models come from the cache (sets HF_HUB_OFFLINE)", False,
             action="store_true", env="LLAMA_ARG_OFFLINE"),
        Flag(("-a", "--alias"), "model name reported by the API (comma-separated aliases)", to="server.alias",
             shown_default="the model's name", env="LLAMA_ARG_ALIAS"),
        Flag(("--tags",), "model tags, comma-separated (informational: /v1/models lists them)", to="server.tags",
             convert=comma_list, env="LLAMA_ARG_TAGS", metavar="STRING"),
        Flag(("--chat-template",), "built-in template name or Jinja source", shown_default="the model's",
             env="LLAMA_ARG_CHAT_TEMPLATE", metavar="JINJA_TEMPLATE"),
        Flag(("--chat-template-file",), "file holding a Jinja chat template", env="LLAMA_ARG_CHAT_TEMPLATE_FILE",
             metavar="FILE"),
        _switch(("--jinja",), "render chat templates with Jinja (lamplight always does)", None, "jinja", True, True,
                env="LLAMA_ARG_JINJA"),
        _accepted(("--no-jinja",), "lamplight renders every chat template with Jinja (its built-in templates "
                  "included)"),
        Flag(("--weights",), "fast: packed 4-bit / bf16 kernels; reference: dequantized float32, slower, closest to "
             "the file's values", "fast", choices=("fast", "reference"), to="engine.weights", own=True),
        Flag(("--compile",), "compile decode steps with torch.compile at start-up: faster decoding, but minutes more "
             "start-up (up to about four the first time, less once inductor's cache is warm)", False,
             action="store_true", to="engine.compile", own=True),
        Flag(("--lora",), "LoRA adapter (GGUF) at scale 1; repeatable, or comma-separated", (), to="engine.loras",
             convert=tuple, dest="lora_adapters", action=LoraAction, metavar="FNAME"),
        Flag(("--lora-scaled",), "LoRA adapter with its scale; repeatable, or comma-separated", (), to="engine.loras",
             convert=tuple, dest="lora_adapters", action=LoraAction, metavar="FNAME:SCALE", shown_default=""),
        Flag(("--lora-init-without-apply",), "load the LoRA adapters at scale 0 (set scales later with POST "
             "/lora-adapters)", False, action="store_true", to="engine.lora_init_without_apply"),
        _refused(("-mu", "--model-url"), f"{_NOT_YET}: download the file first, or use -hf USER/REPO",
                 "MODEL_URL", env="LLAMA_ARG_MODEL_URL"),
        _refused(("-dr", "--docker-repo"), f"{_NOT_YET}: use -hf USER/REPO[:QUANT] or a local GGUF",
                 "[REPO/]MODEL[:QUANT]", env="LLAMA_ARG_DOCKER_REPO"),
        _refused(("--override-kv",), f"{_NOT_YET}: lamplight reads the model's metadata as the file has it",
                 "KEY=TYPE:VALUE,..."),
        _refused(("--control-vector",), f"{_NOT_YET}: control vectors", "FNAME"),
        _refused(("--control-vector-scaled",), f"{_NOT_YET}: control vectors", "FNAME:SCALE,..."),
        _refused(("--control-vector-layer-range",), f"{_NOT_YET}: control vectors", ("START", "END"), nargs=2),
        _refused(("--rope-scaling",), f"{_NOT_YET}: lamplight takes RoPE scaling from the model file",
                 "{none,linear,yarn}", env="LLAMA_ARG_ROPE_SCALING_TYPE"),
        _refused(("--rope-scale",), f"{_NOT_YET}: lamplight takes RoPE scaling from the model file", "N",
                 env="LLAMA_ARG_ROPE_SCALE"),
        _refused(("--rope-freq-base",), f"{_NOT_YET}: lamplight takes the RoPE base from the model file", "N",
                 env="LLAMA_ARG_ROPE_FREQ_BASE"),
        _refused(("--rope-freq-scale",), f"{_NOT_YET}: lamplight takes RoPE scaling from the model file", "N",
                 env="LLAMA_ARG_ROPE_FREQ_SCALE"),
        *(_refused((f"--yarn-{name}",), f"{_NOT_YET}: lamplight takes YaRN settings from the model file", "N",
                   env=f"LLAMA_ARG_YARN_{name.upper().replace('-', '_')}")
          for name in ("orig-ctx", "ext-factor", "attn-factor", "beta-slow", "beta-fast")),
        _refused(("--check-tensors",), f"{_NOT_YET}: lamplight checks tensor shapes and types at load, not values"),
        *(_refused((name,), f"{_NOT_YET}: llama-server's preset models; use -m ALIAS or -hf USER/REPO")
          for name in ("--embd-gemma-default", "--fim-qwen-1.5b-default", "--fim-qwen-3b-default",
                       "--fim-qwen-7b-default", "--fim-qwen-7b-spec", "--fim-qwen-14b-spec", "--fim-qwen-30b-default",
                       "--gpt-oss-20b-default", "--gpt-oss-120b-default", "--vision-gemma-4b-default",
                       "--vision-gemma-12b-default")),
    )),
    ("engine", (
        Flag(("-c", "--ctx-size"), "total context (the KV pool's tokens); 0 = the model's training context, its "
             f"KV cache at most {CTX_MEMORY_SHARE:.0%} of the memory available at start-up",
             0, int, to="engine.n_ctx", env="LLAMA_ARG_CTX_SIZE", metavar="N"),
        Flag(("-np", "--parallel"), f"number of slots, -1 = auto ({AUTO_PARALLEL}, sharing one KV pool: --kv-unified)",
             -1, slot_count, to="engine.n_parallel", convert=_auto_parallel, env="LLAMA_ARG_N_PARALLEL", metavar="N"),
        Flag(("-b", "--batch-size"), "logical batch size", 2048, int, to="engine.n_batch", env="LLAMA_ARG_BATCH",
             metavar="N"),
        Flag(("-ub", "--ubatch-size"), "tokens per forward step", 512, int, to="engine.n_ubatch",
             env="LLAMA_ARG_UBATCH", metavar="N"),
        Flag(("--queue-size",), "requests waiting for a slot before 503", 64, int, to="engine.queue_size", own=True),
        Flag(("-t", "--threads"), "CPU threads for the model", -1, int, shown_default="torch's choice",
             env="LLAMA_ARG_THREADS", metavar="N"),
        Flag(("-ctk", "--cache-type-k"), "KV cache type for K (q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl: ggml's blocks of "
             "32 values, 8.5, 4.5, 5, 5.5, 6 and 4.5 bits a value; the head size must be a multiple of 32)", choices=CACHE_TYPE_NAMES, to="engine.cache_type_k",
             shown_default="f16 with the native kernels, as llama-server; f32 on PyTorch's kernels, which convert "
                           "half precision slowly on CPU", env="LLAMA_ARG_CACHE_TYPE_K"),
        Flag(("-ctv", "--cache-type-v"), "KV cache type for V", choices=CACHE_TYPE_NAMES, to="engine.cache_type_v",
             shown_default="as for K", env="LLAMA_ARG_CACHE_TYPE_V"),
        _switch(("--context-shift",), "when a generation fills its slot, drop half of the tokens after n_keep and go "
                "on", "engine.context_shift", "context_shift", True, False, env="LLAMA_ARG_CONTEXT_SHIFT"),
        _switch(("--no-context-shift",), "stop a generation when its slot is full (the default)",
                "engine.context_shift", "context_shift", False, False),
    )),
    ("HTTP server", (
        Flag(("--host",), "address to listen on; a path ending in .sock: a UNIX socket", "127.0.0.1",
             to="server.host", env="LLAMA_ARG_HOST"),
        Flag(("--port",), "port to listen on", 8080, int, to="server.port", env="LLAMA_ARG_PORT"),
        Flag(("--api-prefix",), "serve every route also under this path prefix (no trailing slash)", "",
             to="server.api_prefix", convert=lambda prefix: prefix.rstrip("/"), env="LLAMA_ARG_API_PREFIX",
             metavar="PREFIX"),
        Flag(("--api-key",), "API key(s), comma-separated", to="server.api_keys", convert=comma_list,
             env="LLAMA_API_KEY", metavar="KEY"),
        Flag(("--api-key-file",), "file of API keys, one per line (# starts a comment); added to --api-key's",
             type=api_key_file, env="LLAMA_ARG_API_KEY_FILE", metavar="FNAME"),
        Flag(("--ssl-key-file",), "PEM private key: serve HTTPS (with --ssl-cert-file)", to="server.ssl_keyfile",
             env="LLAMA_ARG_SSL_KEY_FILE", metavar="FNAME"),
        Flag(("--ssl-cert-file",), "PEM certificate: serve HTTPS (with --ssl-key-file)", to="server.ssl_certfile",
             env="LLAMA_ARG_SSL_CERT_FILE", metavar="FNAME"),
        Flag(("--cors-origins",), "allowed CORS origins, comma-separated; localhost: only pages served from "
             "localhost", "*", to="server.cors_origins", convert=lambda value: comma_list(value) or ("*",),
             env="LLAMA_ARG_CORS_ORIGINS", metavar="ORIGINS"),
        Flag(("--cors-methods",), "methods a CORS preflight allows, comma-separated", "GET, POST, DELETE, OPTIONS",
             to="server.cors_methods", env="LLAMA_ARG_CORS_METHODS", metavar="METHODS"),
        Flag(("--cors-headers",), "headers a CORS preflight allows, comma-separated (* = those asked for)", "*",
             to="server.cors_headers", env="LLAMA_ARG_CORS_HEADERS", metavar="HEADERS"),
        _switch(("--cors-credentials",), "allow credentials on CORS requests", "server.cors_credentials",
                "cors_credentials", True, True, env="LLAMA_ARG_CORS_CREDENTIALS"),
        _switch(("--no-cors-credentials",), "do not allow credentials on CORS requests", "server.cors_credentials",
                "cors_credentials", False, True),
        Flag(("-n", "--predict", "--n-predict"), "default max tokens per request, -1 = unlimited", -1, int,
             to="server.n_predict", dest="n_predict", env="LLAMA_ARG_N_PREDICT", metavar="N"),
        Flag(("--keep",), "default n_keep", 0, int, to="server.n_keep", metavar="N"),
        Flag(("-r", "--reverse-prompt"), "default stop string of requests that give none; repeatable", (),
             to="server.stop", convert=tuple, action=AppendAction, metavar="PROMPT"),
        _switch(("--cache-prompt",), "default cache_prompt: reuse a slot's cached prefix", "server.cache_prompt",
                "cache_prompt", True, True, env="LLAMA_ARG_CACHE_PROMPT"),
        _switch(("--no-cache-prompt",), "default cache_prompt false: evaluate every prompt in full",
                "server.cache_prompt", "cache_prompt", False, True),
        _switch(("--slots",), "enable GET /slots", "server.slots_endpoint", "slots_endpoint", True, True,
                env="LLAMA_ARG_ENDPOINT_SLOTS"),
        _switch(("--no-slots",), "disable GET /slots", "server.slots_endpoint", "slots_endpoint", False, True),
        Flag(("--metrics",), "enable GET /metrics (Prometheus)", False, action="store_true", to="server.metrics",
             env="LLAMA_ARG_ENDPOINT_METRICS"),
        Flag(("--props",), "enable POST /props (accepted, as llama-server's: it changes nothing)", False,
             action="store_true", to="server.props", env="LLAMA_ARG_ENDPOINT_PROPS"),
        Flag(("--slot-save-path",), "folder for POST /slots/{id}?action=save|restore", metavar="DIR",
             to="server.slot_save_path", env="LLAMA_ARG_SLOT_SAVE_PATH"),
        Flag(("--chat-template-kwargs",), "JSON object of chat template variables, under each request's own "
             "chat_template_kwargs", to="server.chat_template_kwargs", type=json_object, convert=lambda v: v or {},
             env="LLAMA_ARG_CHAT_TEMPLATE_KWARGS", metavar="JSON"),
        Flag(("--reasoning-format",), "default reasoning_format of chat replies (as a request's: none, auto, "
             "deepseek...)", "auto", reasoning_format, to="server.reasoning_format",
             env="LLAMA_ARG_THINK", metavar="FORMAT"),
        Flag(("-rea", "--reasoning"), "thinking in chat replies: off = --reasoning-budget 0; on and auto: as the "
             "template decides", "auto", reasoning_mode, nargs="?", const="on", env="LLAMA_ARG_REASONING",
             metavar="on|off|auto"),
        Flag(("--reasoning-effort",), "reasoning_effort given to the chat template (default: the template's "
             "own)", "default", to="server.reasoning_effort", env="LLAMA_ARG_REASONING_EFFORT", metavar="LEVEL"),
        Flag(("--reasoning-budget",), "tokens of thinking per chat reply of a reasoning model: -1 unlimited, 0 none "
             "(enable_thinking false, an open thinking block closed), N > 0: after N tokens the end of thinking is "
             "forced; a request's reasoning_budget_tokens overrides it", -1, int, metavar="N",
             to="server.reasoning_budget", env="LLAMA_ARG_THINK_BUDGET"),
        Flag(("--reasoning-budget-message",), "text forced before the end of thinking when the reasoning budget runs "
             "out", "", metavar="TEXT", to="server.reasoning_budget_message", env="LLAMA_ARG_THINK_BUDGET_MESSAGE"),
        Flag(("--spm-infill",), "/infill prompts as suffix/prefix/middle (SPM) instead of prefix/suffix/middle", False,
             action="store_true", to="server.spm_infill"),
        Flag(("-to", "--timeout"), "seconds to read a request's headers and body, as llama-server's read timeout",
             3600.0, float, to="server.timeout", env="LLAMA_ARG_TIMEOUT", metavar="N"),
        Flag(("--idle-timeout",), "seconds a connection may stay silent between requests before it is closed; "
             "llama-server's HTTP library uses 5", 5.0, float, to="server.idle_timeout", own=True),
        Flag(("--sse-ping-interval",), "seconds of silence before an SSE keep-alive comment, <= 0 disables", 30.0,
             float, to="server.sse_ping_interval", env="LLAMA_ARG_SSE_PING_INTERVAL", metavar="N"),
        _switch(("--ui", "--webui"), "serve the chat page at /", "server.webui", "webui", True, True,
                env="LLAMA_ARG_UI"),
        _switch(("--no-ui", "--no-webui"), "do not serve the chat page at /", "server.webui", "webui", False, True),
        Flag(("--path",), "serve the static files in DIR at / instead of the built-in chat page", dest="static_path",
             metavar="DIR", to="server.static_path", env="LLAMA_ARG_STATIC_PATH"),
    )),
    ("logging", (
        Flag(("--log-disable",), "no log: only errors (and the start-up refusals) are printed", False,
             action="store_true"),
        Flag(("-v", "--verbose", "--log-verbose"), "log everything (uvicorn's debug level)", False,
             action="store_true", dest="verbose"),
        Flag(("-lv", "--verbosity", "--log-verbosity"), "log threshold: 0-1 errors only, 2 warnings, 3 info (the "
             "default), 4 and more: debug", 3, int, dest="verbosity", env="LLAMA_ARG_LOG_VERBOSITY", metavar="N"),
        _accepted(("--log-file",), "lamplight logs to stderr; redirect it to a file", "FNAME",
                  env="LLAMA_ARG_LOG_FILE"),
        _accepted(("--log-jsonl", "--no-log-jsonl"), "lamplight logs plain text lines", env="LLAMA_ARG_LOG_JSONL"),
        _accepted(("--log-colors",), "lamplight logs plain text, without colours", "on|off|auto", nargs="?",
                  env="LLAMA_ARG_LOG_COLORS"),
        _accepted(("--log-prefix", "--no-log-prefix"), "lamplight's own lines start with 'lamplight:'",
                  env="LLAMA_ARG_LOG_PREFIX"),
        _accepted(("--log-timestamps", "--no-log-timestamps"), "lamplight's lines carry no timestamps",
                  env="LLAMA_ARG_LOG_TIMESTAMPS"),
        _refused(("--log-prompts-dir",), f"{_NOT_YET}: prompts are not logged", "PATH"),
    )),
    ("router mode (several models behind one server: lamplight/router/)", (
        Flag(("--models-dir",), "serve the models in this folder, each loaded on demand (router mode)",
             to="router.models_dir", env="LLAMA_ARG_MODELS_DIR", metavar="DIR"),
        Flag(("--models-preset",), "INI file of model presets for router mode", to="router.models_preset",
             env="LLAMA_ARG_MODELS_PRESET", metavar="FILE"),
        Flag(("--models-max",), "router mode: most models loaded at once, 0 = unlimited", 4, int,
             to="router.models_max", env="LLAMA_ARG_MODELS_MAX", metavar="N"),
        _switch(("--models-autoload",), "router mode: load a model when a request names it", "router.models_autoload",
                "models_autoload", True, True, env="LLAMA_ARG_MODELS_AUTOLOAD"),
        _switch(("--no-models-autoload",), "router mode: only POST /models/load loads a model",
                "router.models_autoload", "models_autoload", False, True),
        Flag(("--sleep-idle-seconds",), "seconds without requests after which a model is unloaded (router mode), "
             "-1 = never", -1, int, to="router.sleep_idle_seconds", metavar="SECONDS"),
    )),
    ("accepted for llama-server's command lines, ignored (one log line each at start-up)", (
        _accepted(("-tb", "--threads-batch"), "lamplight uses -t threads for prompts too", "N"),
        _accepted(("-C", "--cpu-mask"), _THREADS, "M"),
        _accepted(("-Cr", "--cpu-range"), _THREADS, "lo-hi"),
        _accepted(("--cpu-strict",), _THREADS, "<0|1>"),
        _accepted(("--prio",), _THREADS, "N"),
        _accepted(("--poll",), "lamplight's engine thread waits for work without polling", "<0...100>"),
        _accepted(("-Cb", "--cpu-mask-batch"), _THREADS, "M"),
        _accepted(("-Crb", "--cpu-range-batch"), _THREADS, "lo-hi"),
        _accepted(("--cpu-strict-batch",), _THREADS, "<0|1>"),
        _accepted(("--prio-batch",), _THREADS, "N"),
        _accepted(("--poll-batch",), "lamplight's engine thread waits for work without polling", "<0|1>"),
        _accepted(("--numa",), _THREADS, "TYPE", env="LLAMA_ARG_NUMA"),
        _accepted(("--threads-http",), "lamplight answers HTTP on one asyncio event loop, requests' parsing in its "
                  "thread pool", "N", env="LLAMA_ARG_THREADS_HTTP"),
        _accepted(("-fa", "--flash-attn"), "lamplight picks its attention kernel itself (its native kernels, else "
                  "PyTorch's scaled_dot_product_attention)", "on|off|auto", nargs="?", env="LLAMA_ARG_FLASH_ATTN"),
        _accepted(("-ngl", "--gpu-layers", "--n-gpu-layers"), _HARDWARE, "N", env="LLAMA_ARG_N_GPU_LAYERS"),
        _accepted(("-dev", "--device"), _HARDWARE, "<dev1,dev2,..>", env="LLAMA_ARG_DEVICE"),
        _accepted(("-sm", "--split-mode"), _HARDWARE, "{none,layer,row,tensor}", env="LLAMA_ARG_SPLIT_MODE"),
        _accepted(("-ts", "--tensor-split"), _HARDWARE, "N0,N1,N2,...", env="LLAMA_ARG_TENSOR_SPLIT"),
        _accepted(("-mg", "--main-gpu"), _HARDWARE, "INDEX", env="LLAMA_ARG_MAIN_GPU"),
        _accepted(("-ot", "--override-tensor"), _HARDWARE, "PATTERN=TYPE,...", env="LLAMA_ARG_OVERRIDE_TENSOR"),
        _accepted(("-cmoe", "--cpu-moe"), _HARDWARE, env="LLAMA_ARG_CPU_MOE"),
        _accepted(("-ncmoe", "--n-cpu-moe"), _HARDWARE, "N", env="LLAMA_ARG_N_CPU_MOE"),
        _accepted(("--moe-cache-mib",), _HARDWARE, "N", env="LLAMA_ARG_MOE_CACHE_MIB"),
        _accepted(("-ncffn", "--n-cpu-ffn"), _HARDWARE, "N", env="LLAMA_ARG_N_CPU_FFN"),
        _accepted(("-kvo", "--kv-offload", "-nkvo", "--no-kv-offload"), "lamplight keeps the KV cache on the model's "
                  "device", env="LLAMA_ARG_KV_OFFLOAD"),
        _accepted(("--op-offload", "--no-op-offload"), _HARDWARE),
        _accepted(("--no-host",), _HARDWARE, env="LLAMA_ARG_NO_HOST"),
        _accepted(("-fit", "--fit"), "lamplight does not shrink flags to fit device memory: -c and -np are used as "
                  "given", "on|off", nargs="?", env="LLAMA_ARG_FIT"),
        _accepted(("-fitt", "--fit-target"), "lamplight does not fit flags to device memory", "MiB0,MiB1,...",
                  env="LLAMA_ARG_FIT_TARGET"),
        _accepted(("-fitc", "--fit-ctx"), "lamplight does not fit flags to device memory", "N",
                  env="LLAMA_ARG_FIT_CTX"),
        _accepted(("--rpc",), "lamplight does not offload to ggml RPC servers (--replicas spreads it over a Ray "
                  "cluster instead)", "SERVERS", env="LLAMA_ARG_RPC"),
        _accepted(("--repack", "-nr", "--no-repack"), "lamplight packs the weights at load as --weights says",
                  env="LLAMA_ARG_REPACK"),
        _accepted(("-lm", "--load-mode"), "lamplight memory-maps the GGUF and copies what its kernels repack",
                  "MODE", env="LLAMA_ARG_LOAD_MODE"),
        _accepted(("--mlock",), "lamplight memory-maps the GGUF and does not lock it in RAM", env="LLAMA_ARG_MLOCK"),
        _accepted(("--mmap", "--no-mmap"), "lamplight memory-maps the GGUF and copies what its kernels repack",
                  env="LLAMA_ARG_MMAP"),
        _accepted(("-dio", "--direct-io", "-ndio", "--no-direct-io"), "lamplight reads the GGUF through a memory "
                  "map", env="LLAMA_ARG_DIO"),
        _accepted(("-lzm", "--lazy-mode"), "lamplight keeps every tensor it uses resident", "MODE",
                  env="LLAMA_ARG_LAZY_MODE"),
        _accepted(("--swa-full",), "lamplight's paged KV cache keeps every layer's tokens", env="LLAMA_ARG_SWA_FULL"),
        _accepted(("-dt", "--defrag-thold"), "deprecated in llama-server; lamplight's paged KV cache needs no "
                  "defragmentation", "N", env="LLAMA_ARG_DEFRAG_THOLD"),
        _accepted(("--perf", "--no-perf"), "responses always carry their timings", env="LLAMA_ARG_PERF"),
        _accepted(("-e", "--escape", "--no-escape"), "lamplight's server takes prompts as JSON strings, unescaped"),
        _accepted(("-cb", "--cont-batching", "-nocb", "--no-cont-batching"), "lamplight always batches continuously",
                  env="LLAMA_ARG_CONT_BATCHING"),
        _accepted(("--warmup", "--no-warmup"), "lamplight runs no warm-up pass (--compile compiles at start-up)"),
        _accepted(("-sps", "--slot-prompt-similarity"), "lamplight's slots share one paged prefix cache: a request "
                  "reuses a cached prefix whichever slot it gets", "SIMILARITY"),
        _accepted(("--cache-idle-slots", "--no-cache-idle-slots"), "idle slots' KV stays in lamplight's paged prefix "
                  "cache until the space is needed", env="LLAMA_ARG_CACHE_IDLE_SLOTS"),
        _accepted(("--cache-reuse",), "lamplight reuses cached prefixes, not chunks shifted into place: a shifted "
                  "chunk's K/V were computed after other tokens, so the reply would depend on what was cached "
                  "(requests' n_cache_reuse is accepted and ignored likewise)", "N", env="LLAMA_ARG_CACHE_REUSE"),
        _accepted(("--reuse-port",), "lamplight binds one socket of its own", env="LLAMA_ARG_REUSE_PORT"),
        _accepted(("-bs", "--backend-sampling"), "lamplight samples every slot in one batch with numpy",
                  env="LLAMA_ARG_BACKEND_SAMPLING"),
        _accepted(("--prefill-assistant",), "lamplight continues a final assistant message (the default)",
                  dest="prefill_assistant", env="LLAMA_ARG_PREFILL_ASSISTANT"),
        _refused(("--no-prefill-assistant",), f"{_NOT_YET}: a final assistant message is always continued",
                 dest="prefill_assistant", const=False),
        _accepted(("--reasoning-preserve", "--no-reasoning-preserve"), "lamplight gives the template the history's "
                  "reasoning as the request has it", env="LLAMA_ARG_REASONING_PRESERVE"),
        _accepted(("--no-skip-chat-parsing",), "lamplight parses chat replies (the default)",
                  dest="skip_chat_parsing", const=False),
        _refused(("--skip-chat-parsing",), f"{_NOT_YET}: a pure content parser", dest="skip_chat_parsing",
                 env="LLAMA_ARG_SKIP_CHAT_PARSING"),
        _accepted(("-sp", "--special"), "lamplight's replies never show special tokens"),
        _refused(("--completion-bash",), f"{_NOT_YET}: no bash completion script"),
        _accepted(("--no-ui-mcp-proxy", "--no-webui-mcp-proxy"), "lamplight has no MCP proxy", dest="ui_mcp_proxy",
                  const=False),
        _refused(("--ui-mcp-proxy", "--webui-mcp-proxy"), f"{_NOT_YET}: the chat page's MCP CORS proxy",
                 dest="ui_mcp_proxy", env="LLAMA_ARG_UI_MCP_PROXY"),
        _accepted(("-no-ag", "--no-agent"), "lamplight has no built-in agent tools", dest="agent", const=False),
        _refused(("-ag", "--agent"), f"{_NOT_YET}: built-in agent tools and the MCP proxy", dest="agent",
                 env="LLAMA_ARG_AGENT"),
        _refused(("--tools",), f"{_NOT_YET}: built-in agent tools (requests' own tools work)", "TOOL1,TOOL2,...",
                 env="LLAMA_ARG_TOOLS"),
        _refused(("--tools-runtime",), f"{_NOT_YET}: built-in agent tools", "OPTION", env="LLAMA_ARG_TOOLS_RUNTIME"),
        _refused(("--mcp-servers-config",), f"{_NOT_YET}: MCP servers", "PATH", env="LLAMA_ARG_MCP_SERVERS_CONFIG"),
        _refused(("--mcp-servers-json",), f"{_NOT_YET}: MCP servers", "JSON", env="LLAMA_ARG_MCP_SERVERS_JSON"),
        _refused(("--ui-config", "--webui-config"), f"{_NOT_YET}: the chat page keeps its settings in the browser",
                 "JSON", env="LLAMA_ARG_UI_CONFIG"),
        _refused(("--ui-config-file", "--webui-config-file"), f"{_NOT_YET}: the chat page keeps its settings in the "
                 "browser", "PATH", env="LLAMA_ARG_UI_CONFIG_FILE"),
    )),
    # The places the next features fill: each entry becomes a flag of its own when it is implemented.
    ("embeddings and reranking", (
        Flag(("--embedding", "--embeddings"), "serve /v1/embeddings, /embedding and Ollama's /api/embed with this "
             "model's pooled vectors (a model that can generate still does; an encoder such as BERT embeds only, "
             "and turns this on by itself)", False, action="store_true", to="engine.embedding",
             env="LLAMA_ARG_EMBEDDINGS"),
        Flag(("--pooling",), "how a sequence's vectors become one: none (one per token, /embedding only), mean, "
             "cls, last, rank (a reranker's score)", None, choices=("none", "mean", "cls", "last", "rank"),
             to="engine.pooling", env="LLAMA_ARG_POOLING", shown_default="the model file's"),
        Flag(("--rerank", "--reranking"), "serve /rerank (and /reranking, /v1/rerank, /v1/reranking) with the "
             "model's ranking head (implies --embedding --pooling rank)", False, action="store_true",
             to="engine.reranking", env="LLAMA_ARG_RERANKING"),
        Flag(("--embd-normalize",), "how vectors are normalised unless a request's embd_normalize says: -1 none, 0 "
             "max-abs to int16, 1 taxicab, 2 euclidean, p > 2 p-norm", 2, int, to="server.embd_normalize",
             metavar="N"),
    )),
    ("vision (images in prompts: lamplight.server.media)", (
        Flag(("-mm", "--mmproj"), "multimodal projector (mmproj GGUF) for the model: images in /completion "
             "(multimodal_data) and chat image_url parts", None, to="engine.mmproj", metavar="FILE",
             env="LLAMA_ARG_MMPROJ"),
        _refused(("-mmu", "--mmproj-url"), f"{_NOT_YET}: download the projector first and pass --mmproj FILE", "URL",
                 env="LLAMA_ARG_MMPROJ_URL"),
        Flag(("--no-mmproj",), "load no projector (not --mmproj's, not -hf's)", False, to="engine.no_mmproj",
             action="store_true"),
        _switch(("--mmproj-auto",), "with -hf: also fetch and load the repository's mmproj-*.gguf",
                "engine.mmproj_auto", "mmproj_auto", True, True, env="LLAMA_ARG_MMPROJ_AUTO"),
        _switch(("--no-mmproj-auto",), "with -hf: load no projector", "engine.mmproj_auto", "mmproj_auto", False, True),
        _accepted(("--mmproj-offload", "--no-mmproj-offload"), "the projector runs on the text model's device "
                  "(the CPU, or torch's CUDA device)", env="LLAMA_ARG_MMPROJ_OFFLOAD", dest="mmproj_offload"),
        _accepted(("-mmdev", "--mmproj-device"), "the projector runs on the text model's device", "DEVICE",
                  env="MTMD_BACKEND_DEVICE"),
        Flag(("--image-min-tokens",), "fewest positions per image, for projector types that resize to a token "
             "budget (none of lamplight's three: idefics3, gemma3 and mlp have a fixed layout)", -1, int,
             to="engine.image_min_tokens", metavar="N", shown_default="from the projector",
             env="LLAMA_ARG_IMAGE_MIN_TOKENS"),
        Flag(("--image-max-tokens",), "most positions per image, likewise", -1, int, to="engine.image_max_tokens",
             metavar="N", shown_default="from the projector", env="LLAMA_ARG_IMAGE_MAX_TOKENS"),
        _refused(("--mtmd-batch-max-tokens",), f"{_NOT_YET}: each image is encoded on its own", "N",
                 env="LLAMA_ARG_MTMD_BATCH_MAX_TOKENS"),
        Flag(("--media-path",), "chat image_url parts may be file:// URLs of files inside this folder (resolved "
             "paths, never outside it)", None, to="engine.media_path", metavar="DIR"),
        Flag(("--media-allow-urls",), "chat image_url parts may be http(s) URLs, fetched by the server (at most "
             "10 MB in 10 s); off: data: URIs and --media-path files only", False, to="engine.media_allow_urls",
             action="store_true", own=True),
        _refused(("--video-fps",), _VIDEO, "N", env="LLAMA_ARG_VIDEO_FPS"),
        _refused(("--video-timestamp-interval",), _VIDEO, "N", env="LLAMA_ARG_VIDEO_TIMESTAMP_INTERVAL"),
        _refused(("--video-ffmpeg-dir",), _VIDEO, "DIR", env="LLAMA_ARG_VIDEO_FFMPEG_DIR"),
    )),
    ("KV cache, prompt cache and state checkpoints", (
        _switch(("-kvu", "--kv-unified"), "one KV pool shared by the slots: a sequence may hold the whole context "
                "while there is room (idle slots' caches give way, the newest running sequences are preempted and "
                "computed again); the default with -np auto", "engine.kv_unified", "kv_unified", True, None,
                env="LLAMA_ARG_KV_UNIFIED", shown_default="on with -np auto (-1), else off"),
        _switch(("-no-kvu", "--no-kv-unified"), "each slot its own share of -c (-c / -np tokens)",
                "engine.kv_unified", "kv_unified", False, None),
        _refused(("--kv-unified-per-slot",), "not yet: the shared KV pool across slots", "N",
                 env="LLAMA_ARG_KV_UNIFIED_PER_SLOT"),
        Flag(("-cram", "--cache-ram"), "MiB of host memory for cached prompts beyond the slots' KV (a slot's tokens "
             "kept when a new request would lose them, copied back for a prompt that shares more with them); 0: off, "
             "-1: no limit", 8192, int, to="engine.cache_ram_mib", env="LLAMA_ARG_CACHE_RAM", metavar="N"),
        Flag(("-ctxcp", "--ctx-checkpoints", "--swa-checkpoints"), "models with recurrent layers (Qwen 3.5, LFM2, "
             "Granite 4.0-H): snapshots of each slot's state kept for follow-up turns, which then re-read at most "
             "--checkpoint-min-step - 1 tokens of their prefix; 0: none (a follow-up that diverges re-reads its "
             "prompt)", 8, int, to="engine.ctx_checkpoints", env="LLAMA_ARG_CTX_CHECKPOINTS", metavar="N"),
        Flag(("-cms", "--checkpoint-min-step"), "tokens between two checkpoints of a recurrent model's state "
             "(positions that are multiples of N, in prompts and replies; replies also every 32 tokens, and a prompt "
             "4 tokens before its end)", 256, int, to="engine.checkpoint_interval",
             env="LLAMA_ARG_CHECKPOINT_MIN_SPACING_NT", metavar="N"),
    )),
    ("speculative decoding (tokens drafted by n-gram lookups or a draft model, verified as decode rows: the output "
     "is the same)", (
        Flag(("--spec-type",), "comma-separated kinds to draft with, tried in order: none, "
             + ", ".join(NGRAM_KINDS) + f", {DRAFT_MODEL_KIND} (the draft model of -md; the default when -md is "
             "given)", None, speculative_kinds, to="spec.kinds", env="LLAMA_ARG_SPEC_TYPE", metavar="TYPES",
             shown_default="none"),
        Flag(("--spec-default",), f"the default speculative decoding: ngram-mod with n-match {_SPEC_MOD.n_match}, "
             f"n-min {_SPEC_MOD.n_min}, n-max {_SPEC_MOD.n_max}",
             False, action="store_true", to="spec.default"),
        *_ngram_map_flags("simple", "ngram-simple"),
        *_ngram_map_flags("map-k", "ngram-map-k"),
        *_ngram_map_flags("map-k4v", "ngram-map-k4v"),
        Flag(("--spec-ngram-mod-n-match",), "ngram-mod: lookup length", _SPEC_MOD.n_match, _ngram_size,
             to="spec.ngram_mod_n_match", metavar="N"),
        Flag(("--spec-ngram-mod-n-min",), "ngram-mod: fewest tokens drafted", _SPEC_MOD.n_min, _ngram_count,
             to="spec.ngram_mod_n_min", metavar="N"),
        Flag(("--spec-ngram-mod-n-max",), "ngram-mod: most tokens drafted", _SPEC_MOD.n_max, _ngram_count,
             to="spec.ngram_mod_n_max", metavar="N"),
        Flag(("--spec-draft-n-max",), "a draft model's most tokens per draft", _SPEC_DRAFT.n_max, _non_negative,
             to="spec.draft_n_max", env="LLAMA_ARG_SPEC_DRAFT_N_MAX", metavar="N"),
        Flag(("--spec-draft-n-min",), "a draft model's fewest tokens per draft (a shorter one is not verified)",
             _SPEC_DRAFT.n_min, _non_negative, to="spec.draft_n_min", env="LLAMA_ARG_SPEC_DRAFT_N_MIN", metavar="N"),
        Flag(("--spec-draft-p-min", "--draft-p-min"), "a draft model's least probability (among its 10 likeliest "
             "tokens) to go on drafting", _SPEC_DRAFT.p_min, _probability, to="spec.draft_p_min",
             env="LLAMA_ARG_SPEC_DRAFT_P_MIN", metavar="P"),
        Flag(("--spec-draft-model", "-md", "--model-draft"), "a draft model for speculative decoding (the target's "
             "vocabulary; read by the same kernels and threads as the model)", None, str, to="spec.draft_model",
             env="LLAMA_ARG_SPEC_DRAFT_MODEL", metavar="FNAME", shown_default="unused"),
        Flag(("--spec-draft-type-k", "-ctkd", "--cache-type-k-draft"), "the draft model's KV cache type for K",
             choices=CACHE_TYPE_NAMES, to="spec.draft_cache_type_k", env="LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_K",
             shown_default="as -ctk's default"),
        Flag(("--spec-draft-type-v", "-ctvd", "--cache-type-v-draft"), "the draft model's KV cache type for V",
             choices=CACHE_TYPE_NAMES, to="spec.draft_cache_type_v", env="LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_V",
             shown_default="as -ctv's default"),
        _refused(("-lcs", "--lookup-cache-static"), _LOOKUP_CACHE, "FNAME"),
        _refused(("-lcd", "--lookup-cache-dynamic"), _LOOKUP_CACHE, "FNAME"),
        _refused(("--spec-draft-hf", "-hfd", "-hfrd", "--hf-repo-draft"), f"{_NOT_YET}: download the draft model and "
                 "pass -md FNAME", "USER/MODEL[:QUANT]",
                 env="LLAMA_ARG_SPEC_DRAFT_HF_REPO"),
        _refused(("--spec-draft-p-split", "--draft-p-split"), f"{_NOT_YET}: a draft model drafts one chain", "P", env="LLAMA_ARG_SPEC_DRAFT_P_SPLIT"),
        _refused(("--spec-draft-sampling",), _DRAFT_GREEDY, "{greedy,probabilistic}",
                 env="LLAMA_ARG_SPEC_DRAFT_SAMPLING"),
        _refused(("--spec-draft-backend-sampling", "--no-spec-draft-backend-sampling"), _DRAFT_GREEDY,
                 env="LLAMA_ARG_SPEC_DRAFT_BACKEND_SAMPLING"),
        _refused(("--spec-draft-threads", "-td", "--threads-draft"), _DRAFT_THREADS, "N"),
        _refused(("--spec-draft-threads-batch", "-tbd", "--threads-batch-draft"), _DRAFT_THREADS, "N"),
        _refused(("--spec-draft-cpu-mask", "-Cd", "--cpu-mask-draft"), _DRAFT_THREADS, "M"),
        _refused(("--spec-draft-cpu-range", "-Crd", "--cpu-range-draft"), _DRAFT_THREADS, "lo-hi"),
        _refused(("--spec-draft-cpu-strict", "--cpu-strict-draft"), _DRAFT_THREADS, "<0|1>"),
        _refused(("--spec-draft-prio", "--prio-draft"), _DRAFT_THREADS, "N"),
        _refused(("--spec-draft-poll", "--poll-draft"), _DRAFT_THREADS, "<0|1>"),
        _refused(("--spec-draft-cpu-mask-batch", "-Cbd", "--cpu-mask-batch-draft"), _DRAFT_THREADS, "M"),
        _refused(("--spec-draft-cpu-strict-batch", "--cpu-strict-batch-draft"), _DRAFT_THREADS, "<0|1>"),
        _refused(("--spec-draft-prio-batch", "--prio-batch-draft"), _DRAFT_THREADS, "N"),
        _refused(("--spec-draft-poll-batch", "--poll-batch-draft"), _DRAFT_THREADS, "<0|1>"),
        _refused(("--spec-draft-override-tensor", "-otd", "--override-tensor-draft"), _DRAFT_PLACEMENT,
                 "PATTERN=TYPE,..."),
        _refused(("--spec-draft-cpu-moe", "-cmoed", "--cpu-moe-draft"), _DRAFT_PLACEMENT,
                 env="LLAMA_ARG_SPEC_DRAFT_CPU_MOE"),
        _refused(("--spec-draft-n-cpu-moe", "--spec-draft-ncmoe", "-ncmoed", "--n-cpu-moe-draft"), _DRAFT_PLACEMENT, "N",
                 env="LLAMA_ARG_SPEC_DRAFT_N_CPU_MOE"),
        _refused(("--spec-draft-device", "-devd", "--device-draft"), _DRAFT_PLACEMENT, "<dev1,dev2,..>"),
        _refused(("--spec-draft-ngl", "-ngld", "--gpu-layers-draft", "--n-gpu-layers-draft"), _DRAFT_PLACEMENT, "N",
                 env="LLAMA_ARG_N_GPU_LAYERS_DRAFT"),
        _refused(("--spec-synth-len",), _SPECULATIVE, "L", env="LLAMA_ARG_SPEC_SYNTH_LEN"),
        _refused(("--spec-synth-rates",), _SPECULATIVE, "P0,P1,...", env="LLAMA_ARG_SPEC_SYNTH_RATES"),
        _refused(("--draft", "--draft-n", "--draft-max"), f"{_REMOVED} (use --spec-draft-n-max)",
                 "N", env="LLAMA_ARG_DRAFT_MAX"),
        _refused(("--draft-min", "--draft-n-min"), f"{_REMOVED} (use --spec-draft-n-min)", "N",
                 env="LLAMA_ARG_DRAFT_MIN"),
        *(_refused((f"--spec-ngram-{name}",), f"{_REMOVED} (use --spec-ngram-simple-{name})", "N")
          for name in ("size-n", "size-m", "min-hits")),
    )),
    ("per-request constraint defaults (a request's own grammar, json_schema, response_format or tools win)", (
        Flag(("--grammar",), "default GBNF grammar of requests that ask for no constraint", to="server.grammar",
             metavar="GRAMMAR", shown_default="none"),
        Flag(("--grammar-file",), "--grammar, read from this file", type=file_text, dest="grammar",
             to="server.grammar", metavar="FNAME", shown_default=""),
        Flag(("-j", "--json-schema"), "default JSON schema of requests that ask for no constraint",
             type=json_schema, to="server.json_schema", metavar="SCHEMA"),
        Flag(("-jf", "--json-schema-file"), "--json-schema, read from this file", type=json_schema_file,
             dest="json_schema", to="server.json_schema", metavar="FILE", shown_default=""),
    )),
    ("request limits (past one, a request is refused with a 400 naming the field and the limit)", (
        _limit("--max-body-size", "max_body_bytes", 16 * 2**20, "largest request body in bytes (413 past it)"),
        _limit("--max-request-sequences", "max_sequences", 256, "most prompts x n in one request"),
        _limit("--max-stop-strings", "max_stop_strings", 32, "most stop strings in one request"),
        _limit("--max-dry-breakers", "max_dry_breakers", 64, "most dry_sequence_breakers in one request"),
        _limit("--max-logit-bias", "max_logit_bias", 1024,
               "most logit_bias entries (and tokens they name) in one request"),
        _limit("--max-grammar-size", "max_grammar_bytes", 256 * 2**10, "largest grammar or JSON schema in bytes"),
        _limit("--max-n-probs", "max_n_probs", 100, "largest n_probs / logprobs / top_logprobs"),
    )),
    ("replicas on Ray Serve (lamplight/distributed/, the ray extra)", (
        Flag(("--replicas",), "serve N replicas on Ray Serve behind one port, routed by prompt prefix (needs the ray "
             "extra); -t is split between them, --slot-save-path gets a subfolder per replica", 0, int, metavar="N",
             shown_default="one process, no Ray", own=True),
        Flag(("--ray-address",), "with --replicas: join this Ray cluster (e.g. auto, ray://HOST:10001) instead of "
             "starting a local one", metavar="ADDR", shown_default="a local Ray instance", own=True),
        Flag(("--route",), "with --replicas: prefix (a request goes where its prompt prefix was served, see "
             "--route-imbalance) or random (plain load spreading, the baseline)", "prefix",
             choices=("prefix", "random"), own=True),
        Flag(("--route-imbalance",), "with --replicas: a request follows its prompt prefix to a replica unless that "
             "replica has more than N requests in flight beyond the least loaded one", None, int, metavar="N",
             shown_default="-np", own=True),
        Flag(("--route-block-chars",), "with --replicas: characters per prompt-prefix block the router matches on",
             256, int, metavar="N", to="routing.block_chars", own=True),
    )),
    ("usage", (
        Flag(("-h", "--help", "--usage"), "print the flags and exit", action="help", shown_default=""),
        Flag(("--version",), "print lamplight's version and exit", action=VersionAction, shown_default=""),
    )),
)
SERVE_FLAGS: tuple[Flag, ...] = tuple(flag for _, flags in FLAG_GROUPS for flag in flags)

_SAMPLING_GROUP = "per-request sampling defaults (a request's own fields override them)"

# llama-server's sampling flags: field -> (names, help, env). Each field's kind, range and default
# are its entry's in the sampling table (lamplight.sampling.spec); the flags below them with more
# than a number to read (samplers, logit bias, DRY's breakers, ignore_eos) are in _special_sampling_flags.
SAMPLING_SPELLINGS: dict[str, tuple[tuple[str, ...], str, str | None]] = {
    "seed": (("-s", "--seed"), "default seed (-1 = random)", None),
    "temperature": (("--temp", "--temperature"), "default temperature", "LLAMA_ARG_TEMPERATURE"),
    "top_k": (("--top-k",), "default top_k (<= 0 disables it)", "LLAMA_ARG_TOP_K"),
    "top_p": (("--top-p",), "default top_p (1 disables it)", "LLAMA_ARG_TOP_P"),
    "min_p": (("--min-p",), "default min_p (0 disables it)", "LLAMA_ARG_MIN_P"),
    "top_n_sigma": (("--top-nsigma", "--top-n-sigma"), "default top_n_sigma (<= 0 disables it)", None),
    "xtc_probability": (("--xtc-probability",), "default xtc_probability (0 disables XTC)", None),
    "xtc_threshold": (("--xtc-threshold",), "default xtc_threshold (> 0.5 disables XTC)", None),
    "typical_p": (("--typical", "--typical-p"), "default typical_p (1 disables it)", None),
    "repeat_last_n": (("--repeat-last-n",), "default repeat_last_n (0 disables, -1 = the slot's context)", None),
    "repeat_penalty": (("--repeat-penalty",), "default repeat_penalty (1 disables it)", "LLAMA_ARG_REPEAT_PENALTY"),
    "presence_penalty": (("--presence-penalty",), "default presence_penalty", "LLAMA_ARG_PRESENCE_PENALTY"),
    "frequency_penalty": (("--frequency-penalty",), "default frequency_penalty", "LLAMA_ARG_FREQUENCY_PENALTY"),
    "dry_multiplier": (("--dry-multiplier",), "default dry_multiplier (0 disables DRY)", None),
    "dry_base": (("--dry-base",), "default dry_base", None),
    "dry_allowed_length": (("--dry-allowed-length",), "default dry_allowed_length", None),
    "dry_penalty_last_n": (("--dry-penalty-last-n",), "default dry_penalty_last_n (-1 = the slot's context)", None),
    "dynatemp_range": (("--dynatemp-range",), "default dynatemp_range (0 disables it)", None),
    "dynatemp_exponent": (("--dynatemp-exp",), "default dynatemp_exponent", None),
    "mirostat": (("--mirostat",), "default mirostat: 0 off, 1 Mirostat, 2 Mirostat 2.0", None),
    "mirostat_eta": (("--mirostat-lr",), "default mirostat_eta (learning rate)", None),
    "mirostat_tau": (("--mirostat-ent",), "default mirostat_tau (target entropy)", None),
}


@functools.cache
def _by_setting() -> dict[str, Flag]:
    found: dict[str, Flag] = {}
    for flag in SERVE_FLAGS:
        if flag.to is not None:
            found.setdefault(flag.to, flag)  # a setting's first spelling holds its default
    return found


def default_of(setting: str) -> Any:
    """The default of the setting a flag fills ("engine.n_parallel"), as that setting holds it."""
    flag = _by_setting()[setting]
    return flag.convert(flag.default)


@functools.cache
def sampling_flags() -> tuple[Flag, ...]:
    """`-s/--seed`, `--temp`, ...: one flag per sampling field llama-server has a flag for, with its
    range from the sampling table; then the samplers, logit bias, DRY's breakers and ignore_eos."""
    from lamplight.sampling.params import SamplingParams
    from lamplight.sampling.spec import sampling_fields, server_default

    specs = dict(sampling_fields(SamplingParams))
    numbers = tuple(Flag(names, help, type=_checked_value(specs[name]), to=f"sampling.{name}", env=env, metavar="N",
                         shown_default=str(server_default(SamplingParams, name)))
                    for name, (names, help, env) in SAMPLING_SPELLINGS.items())
    return numbers + _special_sampling_flags()


def _special_sampling_flags() -> tuple[Flag, ...]:
    from lamplight.sampling.params import parse_samplers

    samplers_by_name = _checked(lambda text: parse_samplers([name for name in text.split(";") if name]))
    samplers_by_letter = _checked(parse_samplers)
    return (
        Flag(("--samplers",), "default samplers, in order, separated by ';' (e.g. top_k;top_p;temperature)",
             type=samplers_by_name, to="sampling.samplers", dest="samplers", metavar="SAMPLERS",
             shown_default="penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature"),
        Flag(("--sampler-seq", "--sampling-seq"), "default samplers, one letter each (e.g. kpt)",
             type=samplers_by_letter, to="sampling.samplers", dest="samplers", metavar="SEQUENCE",
             shown_default="edskypmxt"),
        Flag(("--ignore-eos",), "default ignore_eos: generate past the end-of-generation tokens",
             to="sampling.ignore_eos", action="store_const", const=True, shown_default="off"),
        Flag(("-l", "--logit-bias"), "default logit_bias of requests that give none: TOKEN_ID+BIAS or "
             "TOKEN_ID-BIAS (2-inf bans token 2); repeatable", type=logit_bias_entry, to="sampling.logit_bias",
             action=AppendAction, metavar="TOKEN_ID(+/-)BIAS", shown_default="none"),
        Flag(("--dry-sequence-breaker",), "default DRY sequence breaker, replacing the defaults; repeatable",
             type=dry_breaker, to="sampling.dry_sequence_breakers", action=AppendAction, metavar="STRING",
             shown_default="\\n : \" *"),
        _refused(("--adaptive-target",), f"{_NOT_YET}: the adaptive-p sampler", "N"),
        _refused(("--adaptive-decay",), f"{_NOT_YET}: the adaptive-p sampler", "N"),
    )


def _checked_value(spec: Any) -> Callable[[str], Any]:
    """argparse's `type` for a sampling field: its kind, then its entry's range check."""
    convert = {"number": float, "integer": int}[spec.kind]

    def value(text: str) -> Any:
        try:
            parsed = convert(text)
        except ValueError:
            parsed = text  # not a number: the check says what it must be
        try:
            spec.check(parsed)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return parsed

    return value


def all_flags() -> tuple[Flag, ...]:
    return (*SERVE_FLAGS, *sampling_flags())


def flag_groups() -> tuple[tuple[str, tuple[Flag, ...]], ...]:
    """--help's groups, the sampling defaults included."""
    *groups, usage = FLAG_GROUPS
    return (*groups, (_SAMPLING_GROUP, sampling_flags()), usage)


# -- parsing -----------------------------------------------------------------------------------

class FlagParser(argparse.ArgumentParser):
    """argparse, but: one line for an error (the serve flags' usage would be pages long), and the
    flags the command line did not give filled from their environment variables, else their
    defaults, once parsing is done."""

    serve_flags: tuple[Flag, ...] = ()

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        if self.serve_flags:
            try:
                fill_unset(namespace, self.serve_flags, os.environ)
            except FlagError as exc:
                self.error(str(exc))
        return namespace, extras


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """The serve flags on `parser`, a FlagParser made with add_help=False (-h is one of them)."""
    parser.allow_abbrev = False  # llama-server takes no abbreviations: `--temp` is not `--temperature`
    parser.usage = "%(prog)s [-m FNAME | -hf USER/REPO[:QUANT]] [FLAG ...]"  # the full list is pages long
    for title, flags in flag_groups():
        group = parser.add_argument_group(title)
        for flag in flags:
            flag.add_to(group)
    parser.serve_flags = all_flags()


def fill_unset(namespace: argparse.Namespace, flags: Iterable[Flag], environ: Mapping[str, str]) -> None:
    """Every flag the command line did not give: from its environment variable, else its
    default. A refused flag's variable is refused as the flag is (FlagError naming both)."""
    by_dest: dict[str, list[Flag]] = {}
    for flag in flags:
        if flag.fills_setting:
            by_dest.setdefault(flag.attribute, []).append(flag)
    for dest, spellings in by_dest.items():
        if getattr(namespace, dest, UNSET) is not UNSET:
            continue
        first = next((flag for flag in spellings if not flag.refused), spellings[0])
        setattr(namespace, dest, first.default)
        for flag in spellings:
            if flag.env and environ.get(flag.env, "") != "":
                _from_environment(namespace, flag, spellings, environ[flag.env])


def _from_environment(namespace: argparse.Namespace, flag: Flag, spellings: list[Flag], text: str) -> None:
    given_as = f"{flag.env}={text}"
    if flag.is_switch:
        on = parse_bool(text, flag.env)
        # An on/off pair's variable: true gives the spelling that switches on, false its negative.
        given = next((spelling for spelling in spellings if spelling.is_switch and spelling.switch_value == on),
                     flag if flag.note else None)
        if given is None:  # a lone switch set false: its setting's off value
            setattr(namespace, flag.attribute, on)
        elif given.refused:
            raise FlagError(f"{given_as} ({given.names[-1]}): {given.refused}")
        else:
            setattr(namespace, flag.attribute, given_as if given.note else given.switch_value)
        return
    if flag.refused:
        raise FlagError(f"{given_as} ({flag.names[-1]}): {flag.refused}")
    if flag.note:
        setattr(namespace, flag.attribute, given_as)
        return
    value = text
    if flag.type is not None:
        try:
            value = flag.type(text)
        except argparse.ArgumentTypeError as exc:
            raise FlagError(f"{flag.env}={text!r}: {exc}") from None
        except ValueError:  # int, float: argparse's words
            raise FlagError(f"{flag.env}={text!r}: invalid {flag.type.__name__} value: {text!r}") from None
    if flag.choices is not None and value not in flag.choices:
        raise FlagError(f"{flag.env}={text!r}: must be one of {', '.join(map(str, flag.choices))}")
    if flag.action is AppendAction:
        value = [value]
    setattr(namespace, flag.attribute, value)


def settings_from(args: argparse.Namespace, record: str) -> dict[str, Any]:
    """The settings of one record ("engine", "server", "limits", "sampling", "router") from parsed
    flags, keyed by field; a sampling default the command line did not give is left out."""
    flags = sampling_flags() if record == "sampling" else SERVE_FLAGS
    values = {flag.field: flag.convert(getattr(args, flag.attribute)) for flag in flags
              if flag.record == record and not flag.refused}
    return {field: value for field, value in values.items() if not (record == "sampling" and value is None)}


def accepted_notes(args: argparse.Namespace) -> list[str]:
    """One line per accepted-and-ignored flag that was given: what lamplight does instead."""
    given = ((getattr(args, flag.attribute, None), flag.note) for flag in all_flags() if flag.note)
    return [f"{how}: {note}" for how, note in given if isinstance(how, str)]


# -- the table of llama-server's flags ---------------------------------------------------------

def status_counts() -> dict[str, int]:
    counts = {IMPLEMENTED: 0, ACCEPTED: 0, REFUSED: 0}
    for flag in all_flags():
        if not flag.own:
            counts[flag.status] += 1
    return counts


def flags_markdown() -> str:
    """The table of llama-server's flags with lamplight's status for each (the README's section)."""
    counts = status_counts()
    lines = [f"{sum(counts.values())} llama-server flags: " +
             ", ".join(f"{count} {status}" for status, count in counts.items()) +
             ". Generated by `lamplight flags --markdown` from lamplight/serve_flags.py.", ""]
    for title, flags in flag_groups():
        rows = [flag for flag in flags if not flag.own]
        if not rows:
            continue
        lines += [f"#### {title}", "", "| Flag | Env | Status | On lamplight |", "| --- | --- | --- | --- |"]
        lines += [_markdown_row(flag) for flag in rows]
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


def _markdown_row(flag: Flag) -> str:
    names = ", ".join(flag.names)
    if flag.fills_setting and not flag.is_switch:
        choices = "{" + ",".join(map(str, flag.choices)) + "}" if flag.choices else None
        metavar = flag.metavar or choices or flag.attribute.upper()  # argparse's own choice without one
        names += " " + (" ".join(metavar) if isinstance(metavar, tuple) else metavar)
    what = flag.refused or flag.note or flag.help
    cells = [f"`{names}`", f"`{flag.env}`" if flag.env else "", flag.status, what]
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"
