"""Every `lamplight serve` flag, written once: its names, type, default, help, and the setting it
fills. Adding a flag is one entry in FLAG_GROUPS.

`to` names the setting: "engine.FIELD" (lamplight.server.launcher.EngineOptions), "server.FIELD"
(lamplight.server.settings.ServerSettings), "limits.FIELD" (its RequestLimits),
"sampling.FIELD" (a per-request sampling default) or "routing.FIELD" (lamplight.distributed's
router); flags without one are read by the command itself (the model, threads, replicas).
The per-request sampling defaults (`--temp`, `--top-k`, ...) are not listed here: each comes
from its field's entry in the sampling table (lamplight.sampling.spec), type and range included.

Read by `lamplight serve`'s parser and --help (add_serve_arguments), by lamplight.serve_options
(parsed flags -> EngineOptions / ServerSettings), and for their defaults (`default_of`) by
EngineOptions, EngineConfig, ServerSettings, RequestLimits and the router's block size. So this
module stays low: nothing of lamplight's at import time (the sampling table only once the
parser is built).
"""

from __future__ import annotations

import argparse
import functools
from dataclasses import dataclass
from typing import Any, Callable

DEFAULT_MODEL = "smollm2-135m-instruct"
MAX_DEFAULT_CTX = 4096  # `-c 0` takes the model's training context, but not more than this
CACHE_TYPE_NAMES = ("f32", "f16", "bf16")  # `-ctk/-ctv` values (lamplight.engine.config.CACHE_TYPES)


def comma_list(value: str | None) -> tuple[str, ...]:
    return tuple(part.strip() for part in (value or "").split(",") if part.strip())


def _same(value: Any) -> Any:
    return value


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
    metavar: str | None = None
    # What --help says the default is, where the value alone would not tell; "": say nothing
    # (a second spelling of a setting whose first spelling says it).
    shown_default: str | None = None

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

    def help_text(self) -> str:
        shown = _shown(self.default) if self.shown_default is None else self.shown_default
        text = f"{self.help} (default: {shown})" if shown else self.help
        return text.replace("%", "%%")  # argparse %-formats help texts

    def add_to(self, parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
        options = {"default": self.default, "type": self.type, "dest": self.dest, "action": self.action,
                   "choices": self.choices, "metavar": self.metavar}
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
    return Flag((flag,), help, default, int, to=f"limits.{field}", dest=field, metavar="N")


# The flags in --help's groups; each group's title, then its flags.
FLAG_GROUPS: tuple[tuple[str, tuple[Flag, ...]], ...] = (
    ("model", (
        Flag(("-m", "--model"), "GGUF path or built-in alias", DEFAULT_MODEL),
        Flag(("-hf", "-hfr", "--hf-repo"), "model from the Hugging Face Hub, e.g. "
             "bartowski/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M (default quant Q4_K_M, else the first GGUF); cached in "
             "huggingface_hub's cache",
             dest="hf_repo", metavar="USER/REPO[:QUANT]"),
        Flag(("-hff", "--hf-file"), "with -hf: this file of the repository instead of a quant", metavar="FILE"),
        Flag(("-hft", "--hf-token"), "Hugging Face token for gated or private repos", metavar="TOKEN",
             shown_default="$HF_TOKEN"),
        Flag(("-a", "--alias"), "model name reported by the API (comma-separated aliases)", to="server.alias",
             shown_default="the model's name"),
        Flag(("--chat-template",), "built-in template name or Jinja source", shown_default="the model's"),
        Flag(("--chat-template-file",), "file holding a Jinja chat template"),
        Flag(("--weights",), "fast: packed 4-bit / bf16 kernels; reference: dequantized float32, slower, closest to "
             "the file's values", "fast", choices=("fast", "reference"), to="engine.weights"),
        Flag(("--compile",), "compile decode steps with torch.compile at start-up: faster decoding, but minutes more "
             "start-up (up to about four the first time, less once inductor's cache is warm)", False,
             action="store_true", to="engine.compile"),
        Flag(("--lora",), "LoRA adapter (GGUF) at scale 1; repeatable, or comma-separated", (), to="engine.loras",
             convert=tuple, dest="lora_adapters", action=LoraAction, metavar="FNAME"),
        Flag(("--lora-scaled",), "LoRA adapter with its scale; repeatable, or comma-separated", (), to="engine.loras",
             convert=tuple, dest="lora_adapters", action=LoraAction, metavar="FNAME:SCALE", shown_default=""),
        Flag(("--lora-init-without-apply",), "load the LoRA adapters at scale 0 (set scales later with POST "
             "/lora-adapters)", False, action="store_true", to="engine.lora_init_without_apply"),
    )),
    ("engine", (
        Flag(("-c", "--ctx-size"), f"total context, split across slots; 0 = from the model, at most {MAX_DEFAULT_CTX}",
             0, int, to="engine.n_ctx"),
        Flag(("-np", "--parallel"), "number of slots", 4, int, to="engine.n_parallel"),
        Flag(("-b", "--batch-size"), "logical batch size", 2048, int, to="engine.n_batch"),
        Flag(("-ub", "--ubatch-size"), "tokens per forward step", 512, int, to="engine.n_ubatch"),
        Flag(("--queue-size",), "requests waiting for a slot before 503", 64, int, to="engine.queue_size"),
        Flag(("-t", "--threads"), "CPU threads for the model", -1, int, shown_default="torch's choice"),
        Flag(("-ctk", "--cache-type-k"), "KV cache type for K", choices=CACHE_TYPE_NAMES, to="engine.cache_type_k",
             shown_default="f16 with the native kernels, as llama-server; f32 on PyTorch's kernels, which convert "
                           "half precision slowly on CPU"),
        Flag(("-ctv", "--cache-type-v"), "KV cache type for V", choices=CACHE_TYPE_NAMES, to="engine.cache_type_v",
             shown_default="as for K"),
        Flag(("--context-shift",), "when a generation fills its slot, drop half of the tokens after n_keep and go on",
             False, dest="context_shift", action="store_true", to="engine.context_shift"),
        Flag(("--no-context-shift",), "stop a generation when its slot is full (the default)", False,
             dest="context_shift", action="store_false", to="engine.context_shift", shown_default=""),
    )),
    ("HTTP server", (
        Flag(("--host",), "address to listen on", "127.0.0.1", to="server.host"),
        Flag(("--port",), "port to listen on", 8080, int, to="server.port"),
        Flag(("--api-key",), "API key(s), comma-separated", to="server.api_keys", convert=comma_list),
        Flag(("--cors-origins",), "allowed CORS origins, comma-separated", "*", to="server.cors_origins",
             convert=lambda value: comma_list(value) or ("*",)),
        Flag(("-n", "--n-predict"), "default max tokens per request, -1 = unlimited", -1, int, to="server.n_predict"),
        Flag(("--keep",), "default n_keep", 0, int, to="server.n_keep"),
        Flag(("--no-slots",), "disable GET /slots", False, action="store_true", to="server.slots_endpoint",
             convert=lambda disabled: not disabled),
        Flag(("--metrics",), "enable GET /metrics (Prometheus)", False, action="store_true", to="server.metrics"),
        Flag(("--slot-save-path",), "folder for POST /slots/{id}?action=save|restore", metavar="DIR",
             to="server.slot_save_path"),
        Flag(("--reasoning-budget",), "tokens of thinking per chat reply of a reasoning model: -1 unlimited, 0 none "
             "(enable_thinking false, an open thinking block closed), N > 0: after N tokens the end of thinking is "
             "forced; a request's reasoning_budget_tokens overrides it", -1, int, metavar="N",
             to="server.reasoning_budget"),
        Flag(("--reasoning-budget-message",), "text forced before the end of thinking when the reasoning budget runs "
             "out", "", metavar="TEXT", to="server.reasoning_budget_message"),
        Flag(("--spm-infill",), "/infill prompts as suffix/prefix/middle (SPM) instead of prefix/suffix/middle", False,
             action="store_true", to="server.spm_infill"),
        Flag(("-to", "--timeout"), "seconds to read a request's headers and body, as llama-server's read timeout",
             3600.0, float, to="server.timeout"),
        Flag(("--idle-timeout",), "seconds a connection may stay silent between requests before it is closed; "
             "llama-server's HTTP library uses 5", 5.0, float, to="server.idle_timeout"),
        Flag(("--sse-ping-interval",), "seconds of silence before an SSE keep-alive comment, <= 0 disables", 30.0,
             float, to="server.sse_ping_interval"),
        Flag(("--no-webui",), "do not serve the chat page at /", True, dest="webui", action="store_false",
             to="server.webui", shown_default="served"),
        Flag(("--path",), "serve the static files in DIR at / instead of the built-in chat page", dest="static_path",
             metavar="DIR", to="server.static_path"),
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
             shown_default="one process, no Ray"),
        Flag(("--ray-address",), "with --replicas: join this Ray cluster (e.g. auto, ray://HOST:10001) instead of "
             "starting a local one", metavar="ADDR", shown_default="a local Ray instance"),
        Flag(("--route",), "with --replicas: prefix (a request goes where its prompt prefix was served, see "
             "--route-imbalance) or random (plain load spreading, the baseline)", "prefix",
             choices=("prefix", "random")),
        Flag(("--route-imbalance",), "with --replicas: a request follows its prompt prefix to a replica unless that "
             "replica has more than N requests in flight beyond the least loaded one", None, int, metavar="N",
             shown_default="-np"),
        Flag(("--route-block-chars",), "with --replicas: characters per prompt-prefix block the router matches on",
             256, int, metavar="N", to="routing.block_chars"),
    )),
)
SERVE_FLAGS: tuple[Flag, ...] = tuple(flag for _, flags in FLAG_GROUPS for flag in flags)

_SAMPLING_GROUP = "per-request sampling defaults (a request's own fields override them)"


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


def sampling_flags() -> tuple[Flag, ...]:
    """`--seed`, `--temp`, ...: one flag per sampling field whose entry names one, with its range."""
    from lamplight.sampling.params import SamplingParams
    from lamplight.sampling.spec import sampling_fields, server_default

    return tuple(Flag((spec.flag,), spec.flag_help, type=_checked_value(spec), to=f"sampling.{name}",
                      shown_default=str(server_default(SamplingParams, name)))
                 for name, spec in sampling_fields(SamplingParams) if spec.flag)


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


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    for title, flags in (*FLAG_GROUPS, (_SAMPLING_GROUP, sampling_flags())):
        group = parser.add_argument_group(title)
        for flag in flags:
            flag.add_to(group)


def settings_from(args: argparse.Namespace, record: str) -> dict[str, Any]:
    """The settings of one record ("engine", "server", "limits", "sampling") from parsed flags,
    keyed by field; a sampling default the command line did not give is left out."""
    flags = sampling_flags() if record == "sampling" else SERVE_FLAGS
    values = {flag.field: flag.convert(getattr(args, flag.attribute)) for flag in flags if flag.record == record}
    return {field: value for field, value in values.items() if not (record == "sampling" and value is None)}
