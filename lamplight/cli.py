"""`lamplight` command line: serve (llama-server's flags and LLAMA_ARG_* variables), pull, models,
flags (the table of llama-server's flags), bench."""

from __future__ import annotations

import argparse
import os
import sys

from lamplight import __version__
from lamplight.serve_flags import FlagError, FlagParser, accepted_notes, add_serve_arguments, flags_markdown
from lamplight.serve_options import engine_options, server_settings
from lamplight.threads import request_threads

__all__ = ["build_parser", "engine_options", "main", "server_settings"]


_quiet = False  # --log-disable and -lv below 3: only errors


def _say(message: str) -> None:
    print(f"lamplight: {message}", file=sys.stderr, flush=True)


def _info(message: str) -> None:
    if not _quiet:
        _say(message)


def _startup_problem(args: argparse.Namespace) -> str | None:
    """Flags that cannot work, found before the port is bound."""
    if "," in args.host:
        return f"--host {args.host}: lamplight listens on one address (or one .sock path), not a list"
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
    global _quiet
    from lamplight.serve_options import log_level

    _quiet = log_level(args) not in ("info", "debug")
    if args.cache_list:
        return run_models(args)
    if args.list_devices:
        return _list_devices()
    for note in accepted_notes(args):
        _info(note)
    problem = _startup_problem(args)
    if problem is not None:
        _say(f"error: {problem}")
        return 1
    if args.offline:
        os.environ["HF_HUB_OFFLINE"] = "1"  # read by huggingface_hub when -hf first imports it
    if args.models_dir or args.models_preset:
        from lamplight.router import run_router  # router mode: lamplight/router/

        return run_router(args)
    if args.sleep_idle_seconds != -1:
        _info("--sleep-idle-seconds: idle models are unloaded in router mode (--models-dir, --models-preset); "
              "this server keeps its one model loaded")
    return _serve_one_model(args)


def _serve_one_model(args: argparse.Namespace) -> int:
    from lamplight.server import ServerState
    from lamplight.server.launcher import (EmbeddingOnlyModel, StartupError, build_engine, load_embedder, load_model,
                                           serve, wants_embedder)
    from lamplight.server.memory import memory_line

    try:
        settings = server_settings(args)
        options = engine_options(args)
    except FlagError as exc:
        _say(f"error: {exc}")
        return 2
    if args.replicas or args.ray_address:
        from lamplight.distributed.launch import run_replicas

        args.replicas = args.replicas or 1
        return run_replicas(args)
    if args.threads > 0:
        request_threads(args.threads)  # before loading: the native pool and PyTorch (where it is used) read it
    if args.hf_repo:
        model = _hub_model(args.hf_repo, args.hf_file, args.hf_token)
        if model is None:
            return 1
        args.model = str(model)

    def load():
        _info(f"loading model {args.model}")
        embed_only = _embeds_only(args.model)
        if embed_only or wants_embedder(options):
            return _load_with_embedder(args, options, settings, embed_only)
        return load_generator()

    def load_generator():
        loaded = load_model(args.model, options, chat_template=args.chat_template,
                            chat_template_file=args.chat_template_file, progress=_info)
        problem = _default_problem(settings, loaded.tokenizer)
        if problem is not None:
            raise StartupError(problem)
        _info(f"kernels: {loaded.kernels}")
        engine = build_engine(loaded, options, _info)
        _info(f"memory: {memory_line(loaded, engine)}")
        if engine.checkpoints is not None:
            _info(checkpoint_line(engine))
        if engine.prompt_cache is not None:
            budget = engine.prompt_cache.budget
            _info("prompt cache in RAM: " + ("no limit" if budget is None else f"up to {budget / 2**20:.0f} MiB")
                  + " of slots' tokens kept for later requests (--cache-ram)")
        for adapter in engine.lora_json():
            _info(f"LoRA adapter {adapter['id']}: {adapter['path']} (scale {adapter['scale']:g})")
        shared = engine.config.kv_unified
        _info(f"model {loaded.name} ready: {engine.n_parallel} slots "
              + (f"sharing {engine.config.n_ctx} tokens of KV (a sequence up to {engine.n_ctx_slot})" if shared
                 else f"of {engine.n_ctx_slot} tokens"))
        return loaded, engine

    def _load_with_embedder(args, options, settings, embed_only: bool):
        from lamplight.sources import resolve_model

        path = resolve_model(args.model, progress=_info)
        loaded, engine = (None, None) if embed_only else load_generator()
        embedder = load_embedder(path, options, n_ctx=engine.n_ctx_slot if engine is not None else None, engine=engine)
        if embed_only:
            alias = args.model if os.fspath(args.model) != os.fspath(path) else path.name
            loaded = EmbeddingOnlyModel(path, alias, embedder.tokenizer, kernels=embedder.kernels,
                                        file_type=embedder.file_type)
            _info(f"{path.name} ({embedder.architecture}) computes embeddings only: /v1/embeddings, /embedding"
                  f"{', /rerank' if options.reranking else ''}")
        _info(f"embeddings: pooling {embedder.pooling.value}, {embedder.n_embd} dimensions, up to {embedder.n_ctx} "
              f"tokens per input{'; /rerank on' if options.reranking else ''}; kernels: {embedder.kernels}")
        return loaded, engine, embedder, options.reranking

    _info(f"listening on {_address(settings)}")
    return serve(ServerState(settings), load)


def checkpoint_line(engine) -> str:
    """The start-up line of a model with recurrent layers: what its state and checkpoints cost."""
    per_sequence = engine.runner.state_spec.recurrent_bytes_per_sequence()
    store = engine.checkpoints
    most = per_sequence * engine.n_parallel * store.max_per_slot
    return (f"recurrent state: {per_sequence / 2**20:.1f} MiB per slot and per checkpoint; up to {store.max_per_slot} "
            f"checkpoints per slot every {store.interval} tokens, {store.reply_interval} in replies (--ctx-checkpoints, "
            f"--checkpoint-min-step): at most "
            f"{most / 2**20:.0f} MiB for {engine.n_parallel} slots")


def _embeds_only(model: str) -> bool:
    """Whether the model (a path; aliases are generating models) only computes vectors."""
    from lamplight.server.launcher import embeds_only

    return os.path.isfile(model) and embeds_only(model)


def _address(settings) -> str:
    if settings.unix_socket:
        return f"unix:{settings.unix_socket}"
    scheme = "https" if settings.ssl_certfile else "http"
    return f"{scheme}://{settings.host}:{settings.port}{settings.api_prefix}"


def _default_problem(settings, tokenizer) -> str | None:
    """Server-wide defaults that only the model can check: -l's token ids, --grammar / --json-schema."""
    from lamplight.server.constraints import compile_constraint
    from lamplight.server.errors import ApiError
    from lamplight.server.params import server_constraint

    for token, _ in settings.sampling_defaults.get("logit_bias", ()):
        if token >= tokenizer.vocab_size:
            return f"-l/--logit-bias: token id {token} is outside the vocabulary of {tokenizer.vocab_size} tokens"
    constraint = server_constraint(settings)
    if constraint.kind:
        from lamplight.grammar import GrammarCompiler

        try:
            compile_constraint(constraint, lambda: GrammarCompiler(tokenizer), tokenizer)
        except ApiError as exc:
            return exc.message
    return None


def _list_devices() -> int:
    import torch

    print("cpu")
    for index in range(torch.cuda.device_count() if torch.cuda.is_available() else 0):
        print(f"cuda:{index}  {torch.cuda.get_device_name(index)}")
    return 0


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


def run_flags(args: argparse.Namespace) -> int:
    print(flags_markdown(), end="")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from lamplight.bench import add_arguments as add_bench_arguments

    parser = FlagParser(prog="lamplight", description="Local LLM inference server for GGUF models.")
    parser.add_argument("--version", action="version", version=f"lamplight {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=FlagParser)
    serve = commands.add_parser("serve", help="run the HTTP server (llama-server's flags and LLAMA_ARG_* "
                                "variables)", add_help=False)
    add_serve_arguments(serve)
    serve.set_defaults(handler=run_serve)
    flags_parser = commands.add_parser("flags", help="print the table of llama-server's flags and what each "
                                       "does on lamplight")
    flags_parser.add_argument("--markdown", action="store_true", help="as Markdown (the only format, the README's)")
    flags_parser.set_defaults(handler=run_flags)
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
    if getattr(args, "command", None) == "serve":  # router mode passes the model flags on to its children
        args.serve_argv = list(sys.argv[2:] if argv is None else argv[1:])
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
