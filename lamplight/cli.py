"""`lamplight` command line: serve (llama-server's flag names), pull, bench."""

from __future__ import annotations

import argparse
import os
import sys

from lamplight import __version__
from lamplight.serve_flags import add_serve_arguments
from lamplight.serve_options import engine_options, server_settings

__all__ = ["build_parser", "engine_options", "main", "server_settings"]


def _say(message: str) -> None:
    print(f"lamplight: {message}", file=sys.stderr, flush=True)


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


def run_serve(args: argparse.Namespace) -> int:
    from lamplight.server import ServerState
    from lamplight.server.launcher import build_engine, load_model, serve
    from lamplight.server.memory import memory_line

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
        loaded = load_model(args.model, options, chat_template=args.chat_template,
                            chat_template_file=args.chat_template_file, progress=_say)
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
    serve = commands.add_parser("serve", help="run the HTTP server (llama-server compatible flags)")
    add_serve_arguments(serve)
    serve.set_defaults(handler=run_serve)
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
