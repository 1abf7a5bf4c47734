"""`lamplight` command line: serve (llama-server's flag names), pull, bench."""

from __future__ import annotations

import argparse
import os
import sys

from lamplight import __version__

DEFAULT_MODEL = "smollm2-135m-instruct"


def _say(message: str) -> None:
    print(f"lamplight: {message}", file=sys.stderr, flush=True)


def _comma_list(value: str | None) -> tuple[str, ...]:
    return tuple(part.strip() for part in (value or "").split(",") if part.strip())


class _LoraAction(argparse.Action):
    """`--lora FNAME[,FNAME...]` and `--lora-scaled FNAME:SCALE[,...]` append to one list, so the
    adapters get their ids in the order the flags were given (as llama-server)."""

    def __call__(self, parser, namespace, values, option_string=None):
        adapters = list(getattr(namespace, self.dest, None) or [])
        for item in _comma_list(values):
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


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("-m", "--model", default=DEFAULT_MODEL, help="GGUF path or built-in alias (default: %(default)s)")
    add("-hf", "-hfr", "--hf-repo", dest="hf_repo", metavar="USER/REPO[:QUANT]",
        help="model from the Hugging Face Hub, e.g. bartowski/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M "
             "(default quant Q4_K_M, else the first GGUF); cached in huggingface_hub's cache")
    add("-hff", "--hf-file", metavar="FILE", help="with -hf: this file of the repository instead of a quant")
    add("-hft", "--hf-token", metavar="TOKEN", help="Hugging Face token for gated or private repos (default: $HF_TOKEN)")
    add("-a", "--alias", help="model name reported by the API (comma-separated aliases)")
    add("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    add("--port", type=int, default=8080, help="port to listen on (default: %(default)s)")
    add("-c", "--ctx-size", type=int, default=0,
        help="total context, split across slots; 0 = from the model, at most 4096 (default: 0)")
    add("-np", "--parallel", type=int, default=4, help="number of slots (default: %(default)s)")
    add("-b", "--batch-size", type=int, default=2048, help="logical batch size (default: %(default)s)")
    add("-ub", "--ubatch-size", type=int, default=512, help="tokens per forward step (default: %(default)s)")
    add("-n", "--n-predict", type=int, default=-1, help="default max tokens per request, -1 = unlimited")
    add("--keep", type=int, default=0, help="default n_keep (default: %(default)s)")
    add("--queue-size", type=int, default=64, help="requests waiting for a slot before 503 (default: %(default)s)")
    add("--api-key", help="API key(s), comma-separated")
    add("--chat-template", help="built-in template name or Jinja source")
    add("--chat-template-file", help="file holding a Jinja chat template")
    add("-t", "--threads", type=int, default=-1, help="CPU threads for the model (default: torch's choice)")
    add("--seed", type=int, help="default seed (-1 = random)")
    add("--temp", type=float, help="default temperature")
    add("--top-k", type=int, help="default top_k")
    add("--top-p", type=float, help="default top_p")
    add("--min-p", type=float, help="default min_p")
    add("--no-slots", action="store_true", help="disable GET /slots")
    add("--cors-origins", default="*", help="allowed CORS origins, comma-separated (default: *)")
    add("--metrics", action="store_true", help="enable GET /metrics (Prometheus)")
    add("--weights", choices=("fast", "reference"), default="fast",
        help="fast: packed 4-bit / bf16 kernels; reference: dequantized float32, slower, closest to the "
             "file's values (default: %(default)s)")
    add("-ctk", "--cache-type-k", choices=("f32", "f16", "bf16"), default=None,
        help="KV cache type for K (default: f16 with the native kernels, as llama-server; f32 on PyTorch's "
             "kernels, which convert half precision slowly on CPU)")
    add("-ctv", "--cache-type-v", choices=("f32", "f16", "bf16"), default=None,
        help="KV cache type for V (default: as for K)")
    add("--compile", action="store_true",
        help="compile decode steps with torch.compile at start-up: faster decoding, but minutes more "
             "start-up (up to about four the first time, less once inductor's cache is warm) (default: off)")
    add("--context-shift", dest="context_shift", action="store_true", default=False,
        help="when a generation fills its slot, drop half of the tokens after n_keep and go on (default: off)")
    add("--no-context-shift", dest="context_shift", action="store_false",
        help="stop a generation when its slot is full (the default)")
    add("--lora", dest="lora_adapters", action=_LoraAction, metavar="FNAME", default=[],
        help="LoRA adapter (GGUF) at scale 1; repeatable, or comma-separated")
    add("--lora-scaled", dest="lora_adapters", action=_LoraAction, metavar="FNAME:SCALE", default=[],
        help="LoRA adapter with its scale; repeatable, or comma-separated")
    add("--lora-init-without-apply", action="store_true",
        help="load the LoRA adapters at scale 0 (set scales later with POST /lora-adapters)")
    add("--slot-save-path", metavar="DIR", help="folder for POST /slots/{id}?action=save|restore")
    add("--reasoning-budget", type=int, default=-1, metavar="N",
        help="tokens of thinking per chat reply of a reasoning model: -1 unlimited, 0 none (enable_thinking "
             "false, an open thinking block closed), N > 0: after N tokens the end of thinking is forced; "
             "a request's reasoning_budget_tokens overrides it (default: %(default)s)")
    add("--reasoning-budget-message", default="", metavar="TEXT",
        help="text forced before the end of thinking when the reasoning budget runs out (default: none)")
    add("--spm-infill", action="store_true",
        help="/infill prompts as suffix/prefix/middle (SPM) instead of prefix/suffix/middle")
    add("-to", "--timeout", type=float, default=3600,
        help="seconds to read a request's headers and body, as llama-server's read timeout (default: 3600)")
    add("--idle-timeout", type=float, default=5.0,
        help="seconds a connection may stay silent between requests before it is closed; llama-server's "
             "HTTP library uses 5 (default: %(default)s)")
    add("--no-webui", dest="webui", action="store_false", default=True,
        help="do not serve the chat page at / (default: served)")
    add("--path", dest="static_path", metavar="DIR",
        help="serve the static files in DIR at / instead of the built-in chat page")
    _add_limit_arguments(add)
    add("--sse-ping-interval", type=float, default=30.0,
        help="seconds of silence before an SSE keep-alive comment, <= 0 disables (default: %(default)s)")
    _add_replica_arguments(add)
    parser.set_defaults(handler=run_serve)


def _add_replica_arguments(add) -> None:
    """Replicas on Ray Serve (lamplight/distributed/, the `ray` extra)."""
    add("--replicas", type=int, default=0, metavar="N",
        help="serve N replicas on Ray Serve behind one port, routed by prompt prefix (needs the ray extra); "
             "-t is split between them, --slot-save-path gets a subfolder per replica (default: one process, no Ray)")
    add("--ray-address", metavar="ADDR",
        help="with --replicas: join this Ray cluster (e.g. auto, ray://HOST:10001) instead of starting a local one")
    add("--route", choices=("prefix", "random"), default="prefix",
        help="with --replicas: prefix (a request goes where its prompt prefix was served, see --route-imbalance) "
             "or random (plain load spreading, the baseline) (default: %(default)s)")
    add("--route-imbalance", type=int, default=None, metavar="N",
        help="with --replicas: a request follows its prompt prefix to a replica unless that replica has more than N "
             "requests in flight beyond the least loaded one (default: -np)")
    add("--route-block-chars", type=int, default=256, metavar="N",
        help="with --replicas: characters per prompt-prefix block the router matches on (default: %(default)s)")


# Request limits: (flag, RequestLimits field, help). Each refusal is a 400 naming field and limit.
_LIMIT_FLAGS = (
    ("--max-body-size", "max_body_bytes", "largest request body in bytes (413 past it)"),
    ("--max-request-sequences", "max_sequences", "most prompts x n in one request"),
    ("--max-stop-strings", "max_stop_strings", "most stop strings in one request"),
    ("--max-dry-breakers", "max_dry_breakers", "most dry_sequence_breakers in one request"),
    ("--max-logit-bias", "max_logit_bias", "most logit_bias entries (and tokens they name) in one request"),
    ("--max-grammar-size", "max_grammar_bytes", "largest grammar or JSON schema in bytes"),
    ("--max-n-probs", "max_n_probs", "largest n_probs / logprobs / top_logprobs"),
)


def _add_limit_arguments(add) -> None:
    from lamplight.server.settings import RequestLimits

    defaults = RequestLimits()
    for flag, name, text in _LIMIT_FLAGS:
        add(flag, dest=name, type=int, metavar="N", default=getattr(defaults, name),
            help=f"{text} (default: %(default)s)")


def _request_limits(args: argparse.Namespace):
    from lamplight.server.settings import RequestLimits

    return RequestLimits(**{name: getattr(args, name) for _, name, _ in _LIMIT_FLAGS})


def _sampling_defaults(args: argparse.Namespace) -> dict:
    flags = {"seed": args.seed, "temperature": args.temp, "top_k": args.top_k,
             "top_p": args.top_p, "min_p": args.min_p}
    return {name: value for name, value in flags.items() if value is not None}


def _startup_problem(args: argparse.Namespace) -> str | None:
    """Flags that cannot work, found before the port is bound."""
    if not -1 <= args.reasoning_budget <= 2**31 - 1:
        return f"--reasoning-budget {args.reasoning_budget}: must be -1 (unlimited) or a number of tokens >= 0"
    if args.static_path and not os.path.isdir(args.static_path):
        return f"--path: not a directory: {args.static_path}"
    if args.slot_save_path and not os.path.isdir(args.slot_save_path):
        return f"--slot-save-path: not a directory: {args.slot_save_path}"
    for path, _ in args.lora_adapters:
        if not os.path.isfile(path):
            return f"LoRA adapter not found: {path}"
    return None


def engine_options(args: argparse.Namespace):
    from lamplight.server.launcher import EngineOptions

    return EngineOptions(n_ctx=args.ctx_size, n_parallel=args.parallel, n_batch=args.batch_size,
                         n_ubatch=args.ubatch_size, queue_size=args.queue_size,
                         context_shift=args.context_shift, loras=tuple(args.lora_adapters),
                         lora_init_without_apply=args.lora_init_without_apply, compile=args.compile,
                         cache_type_k=args.cache_type_k, cache_type_v=args.cache_type_v)


def server_settings(args: argparse.Namespace):
    from lamplight.server import ServerSettings

    return ServerSettings(
        host=args.host, port=args.port, api_keys=_comma_list(args.api_key),
        cors_origins=_comma_list(args.cors_origins) or ("*",), alias=args.alias,
        sampling_defaults=_sampling_defaults(args), n_predict=args.n_predict, n_keep=args.keep,
        slots_endpoint=not args.no_slots, metrics=args.metrics,
        sse_ping_interval=args.sse_ping_interval, timeout=args.timeout, idle_timeout=args.idle_timeout,
        limits=_request_limits(args),
        slot_save_path=args.slot_save_path, spm_infill=args.spm_infill, reasoning_budget=args.reasoning_budget,
        reasoning_budget_message=args.reasoning_budget_message,
        webui=args.webui, static_path=args.static_path,
    )


def run_serve(args: argparse.Namespace) -> int:
    import lamplight
    from lamplight.server import ServerState
    from lamplight.server.launcher import build_engine, memory_line, serve

    problem = _startup_problem(args)
    if problem is not None:
        _say(f"error: {problem}")
        return 1
    if args.replicas or args.ray_address:
        from lamplight.distributed.launch import run_replicas

        args.replicas = args.replicas or 1
        return run_replicas(args)
    if args.threads > 0:
        import torch

        torch.set_num_threads(args.threads)
    if args.hf_repo:
        model = _hub_model(args.hf_repo, args.hf_file, args.hf_token)
        if model is None:
            return 1
        args.model = str(model)
    settings = server_settings(args)
    options = engine_options(args)

    def load():
        _say(f"loading model {args.model}")
        loaded = lamplight.load(args.model, chat_template=args.chat_template,
                                chat_template_file=args.chat_template_file, progress=_say,
                                fast=args.weights == "fast")
        _say(f"kernels: {loaded.kernels}")
        engine = build_engine(loaded, options)
        _say(f"memory: {memory_line(loaded, engine)}")
        for adapter in engine.lora_json():
            _say(f"LoRA adapter {adapter['id']}: {adapter['path']} (scale {adapter['scale']:g})")
        _say(f"model {loaded.name} ready: {engine.n_parallel} slots of {engine.n_ctx_slot} tokens")
        return loaded, engine

    _say(f"listening on http://{args.host}:{args.port}")
    return serve(ServerState(settings), load)


def _hub_model(spec: str, filename: str | None, token: str | None):
    """The local path of a Hub model (downloaded if needed), or None after saying why not."""
    from lamplight.hf_hub import resolve_hf
    from lamplight.sources import ModelSourceError

    try:
        return resolve_hf(spec, filename=filename, token=token, progress=_say)
    except ModelSourceError as exc:
        _say(f"error: {exc}")
        return None


def run_pull(args: argparse.Namespace) -> int:
    from lamplight.sources import ModelSourceError, pull

    if "/" in args.alias or args.hf_file:  # user/repo[:QUANT]: from the Hugging Face Hub
        path = _hub_model(args.alias, args.hf_file, args.hf_token)
        if path is None:
            return 1
        print(path)
        return 0
    try:
        path = pull(args.alias, progress=_say, force=args.force)
    except ModelSourceError as exc:
        print(f"lamplight pull: error: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


def run_models(args: argparse.Namespace) -> int:
    from lamplight.hf_hub import cached_hub_models
    from lamplight.sources import ALIASES, cache_dir

    rows = [(alias, str(cache_dir() / pkg.filename), (cache_dir() / pkg.filename).stat().st_size)
            for alias, pkg in sorted(ALIASES.items()) if (cache_dir() / pkg.filename).is_file()]
    rows += [(f"{repo}", name, size) for repo, name, size in cached_hub_models()]
    if not rows:
        print("no cached models (lamplight pull ALIAS or USER/REPO[:QUANT] fetches one)")
        return 0
    width = max(len(model) for model, _, _ in rows)
    for model, file, size in rows:
        print(f"{model:<{width}}  {size / 2**20:9.1f} MiB  {file}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from lamplight.bench import add_arguments as add_bench_arguments

    parser = argparse.ArgumentParser(prog="lamplight", description="Local LLM inference server for GGUF models.")
    parser.add_argument("--version", action="version", version=f"lamplight {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    add_serve_arguments(commands.add_parser("serve", help="run the HTTP server (llama-server compatible flags)"))
    pull_parser = commands.add_parser("pull", help="download a built-in model alias into the cache")
    pull_parser.add_argument("alias", metavar="MODEL",
                             help="a built-in alias (e.g. smollm2-135m-instruct) or a Hub repo USER/REPO[:QUANT]")
    pull_parser.add_argument("--force", action="store_true", help="download an alias again even if cached")
    pull_parser.add_argument("-hff", "--hf-file", metavar="FILE", help="a Hub repo's file instead of a quant")
    pull_parser.add_argument("-hft", "--hf-token", metavar="TOKEN", help="Hugging Face token (default: $HF_TOKEN)")
    pull_parser.set_defaults(handler=run_pull)
    models_parser = commands.add_parser("models", help="list the cached models: aliases and Hub files")
    models_parser.set_defaults(handler=run_models)
    bench = commands.add_parser("bench", help="benchmark an OpenAI-compatible server")
    add_bench_arguments(bench)
    bench.set_defaults(handler=lambda args: args.bench_main(args))
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "handler", None) is None:
        parser.print_help()
        return 2
    try:
        return args.handler(args)
    except KeyboardInterrupt:  # Ctrl-C outside the places that handle it (a model alias's download...)
        print("\nlamplight: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
