"""Command line: `python -m lamplight.bench` or, mounted as a subcommand, `lamplight bench`."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
import time
from typing import Callable

from lamplight.bench.client import BenchError
from lamplight.bench.config import DEFAULT_CONFIG, QUICK_CONFIG, BenchConfig
from lamplight.bench.progress import Progress
from lamplight.bench.report import BenchReport, format_table, write_json
from lamplight.bench.runner import DEFAULT_SCENARIOS, SCENARIOS, BenchOptions, ServerSpec, run_benchmark

DESCRIPTION = (
    "Benchmark OpenAI-compatible servers (lamplight, llama.cpp's llama-server, vLLM...) with "
    "streamed requests: decode speed, time to first token, throughput under concurrency and "
    "prefix-cache reuse, multi-turn conversations, copy edits (answers that repeat the prompt: speculative "
    "decoding's ground, with the share of drafted tokens accepted) and an 8K-token context; on request, "
    "embeddings and rerank throughput. With --compare (repeatable: servers B, C, ...), all servers "
    "run the same prompts, interleaved."
)


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the benchmark's options to `parser` (a standalone parser or a subcommand's)."""
    parser.add_argument("--url", default="http://127.0.0.1:8080",
                        help="server A (default: %(default)s)")
    parser.add_argument("--compare", metavar="URL", action="append",
                        help="server B, measured side by side with A; repeat for C, D, ...")
    parser.add_argument("--model", help="model name sent to A (default: first of its /v1/models)")
    parser.add_argument("--compare-model", metavar="NAME", action="append",
                        help="model name sent to B (repeat for C, ... in --compare's order)")
    parser.add_argument("--api", choices=("completions", "chat"), default="completions",
                        help="endpoint: /v1/completions or /v1/chat/completions")
    parser.add_argument("--scenarios", nargs="+", metavar="NAME", type=_scenario_names,
                        help=f"which to run, of {', '.join(SCENARIOS)} (default: all but embeddings and "
                             "rerank, which need a server started with --embedding or --reranking)")
    parser.add_argument("--quick", action="store_true",
                        help="small sizes, for a first look or a slow CPU server")
    parser.add_argument("--json", metavar="PATH", help="write all per-request figures here")
    parser.add_argument("--seed", type=int,
                        help="prompt seed (default: from the clock, so that a server's cache "
                             "from an earlier run cannot flatter it)")
    parser.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS",
                        help="per-request read timeout (default: %(default)s)")
    parser.add_argument("--concurrency", type=_int_list, metavar="N,N,...",
                        help="requests in flight (default: "
                             f"{_join(DEFAULT_CONFIG.concurrency_levels)})")
    parser.add_argument("--ttft-lengths", type=_int_list, metavar="N,N,...",
                        help=f"prompt lengths (default: {_join(DEFAULT_CONFIG.ttft_lengths)})")
    parser.add_argument("--set", dest="config_overrides", action="append", default=[], metavar="FIELD=VALUE",
                        type=_config_override,
                        help="any size of the scenarios (e.g. conversation_count=1, conversation_turns=4, "
                             f"decode_max_tokens=64; lists as 1,2,3), repeatable; the fields: {', '.join(_CONFIG_FIELDS)}")
    parser.add_argument("--no-progress", action="store_true", help="no progress on stderr")
    engine = parser.add_argument_group("in-process engine figures (--engine)")
    engine.add_argument("--engine", action="store_true",
                        help="measure the engine in this process instead of a server: ms per decode "
                             "step by batch size, prefill tokens/s, peak memory")
    engine.add_argument("--engine-model", metavar="ALIAS|PATH", help="model for --engine (default: smollm2-135m-instruct)")
    engine.add_argument("--paths", default="fast,native", metavar="P,P",
                        help="paths measured side by side with --engine: reference, fast (PyTorch's packed kernels), "
                             "compiled (fast with compiled decode steps), native (the C++ forward) "
                             "(default: %(default)s)")
    engine.add_argument("--batches", type=_int_list, default=(1, 4, 16, 32), metavar="N,N,...",
                        help="decode batch sizes for --engine (default: 1,4,16,32)")
    engine.add_argument("--steps", type=int, default=12, help="timed decode steps per batch size (default: %(default)s)")
    parser.set_defaults(bench_main=run_with_args)
    _add_write_model_command(parser)
    return parser


def _add_write_model_command(parser: argparse.ArgumentParser) -> None:
    """`bench write-model SHAPE OUT.gguf`: an optional subcommand, so `bench [options]` is unchanged."""
    commands = parser.add_subparsers(dest="bench_command", metavar="{write-model}",
                                     title="other commands (instead of a benchmark run)")
    write = commands.add_parser("write-model", help="write a random-weight GGUF of a real model shape",
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                description=WRITE_MODEL_DESCRIPTION)
    add_write_model_arguments(write)
    write.set_defaults(bench_main=run_write_model)


WRITE_MODEL_DESCRIPTION = """\
Write a random-weight GGUF of a real model's shape, for benchmarks at real sizes; lamplight and
llama.cpp's llama-server both load it.

decoders (llama-3.2-*, qwen3.5-*): the default model's tokenizer (SmolLM2's), quantized as
  llama-quantize would (--type Q4_K_M, Q4_0, Q8_0, F16).
encoders: bge-reranker-base (a BERT cross-encoder with its classification head, pooling rank: serve
  with --reranking) and bert-base (no head, pooling cls). Their vocabulary is a small WordPiece one,
  not bge-reranker-base's 250k-token XLM-R SentencePiece (which lamplight does not tokenize): a
  step's compute does not depend on the vocabulary size, only a text's token count does.
vision projector: siglip-b16-mlp, an mmproj file (SigLIP-B/16 tower at 512 px, 1024 image rows,
  LLaVA's mlp projector) for the real SmolLM2-135M-Instruct: serve with -m SMOLLM2 --mmproj OUT
  (--type F16 or Q8_0).
"""


def _model_writers() -> dict[str, tuple[Callable, str]]:
    """Shape name -> (the function writing it, its default --type). The functions take the same arguments."""
    from lamplight.bench.random_encoder import ENCODER_SHAPES, write_random_encoder
    from lamplight.bench.random_mmproj import MMPROJ_SHAPES, write_random_mmproj
    from lamplight.bench.random_model import SHAPES, write_random_model

    return {**dict.fromkeys(SHAPES, (write_random_model, "Q4_K_M")),
            **dict.fromkeys(ENCODER_SHAPES, (write_random_encoder, "F16")),
            **dict.fromkeys(MMPROJ_SHAPES, (write_random_mmproj, "F16"))}


def add_write_model_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    from lamplight.bench.random_model import FILE_TYPES

    shapes = list(_model_writers())
    parser.add_argument("shape", choices=shapes, metavar="SHAPE", help=f"one of {', '.join(shapes)}")
    parser.add_argument("out", metavar="OUT.gguf", help="the file to write")
    parser.add_argument("--type", dest="file_type", choices=list(FILE_TYPES),
                        help="weight types, as llama-quantize's file type of that name (default: Q4_K_M for "
                             "decoders, F16 for encoders and the projector, which takes F16 or Q8_0)")
    parser.add_argument("--seed", type=int, default=0, help="weight seed (default: %(default)s)")
    parser.add_argument("--layers", type=int, metavar="N", help="cut the model to N layers")
    parser.add_argument("--shape-override", action="append", default=[], metavar="FIELD=VALUE",
                        help="change one size of the shape (e.g. n_embd=256, n_ff=512, tied=0); repeatable")
    parser.add_argument("--tokenizer-from", metavar="ALIAS|PATH",
                        help="GGUF whose tokenizer is copied (default: smollm2-135m-instruct for decoders, "
                             "the built-in WordPiece vocabulary for encoders; encoders need a 'bert' one)")
    parser.add_argument("-v", "--verbose", action="store_true", help="one line per tensor on stderr")
    return parser


def run_write_model(args: argparse.Namespace) -> int:
    """`lamplight bench write-model`: returns the exit code."""
    from lamplight.gguf.file import GGUFError
    from lamplight.sources import ModelSourceError

    write, default_type = _model_writers()[args.shape]
    progress = (lambda line: print(line, file=sys.stderr)) if args.verbose else None
    try:
        written = write(args.shape, args.out, args.file_type or default_type, seed=args.seed, layers=args.layers,
                        overrides=args.shape_override, tokenizer_from=args.tokenizer_from, progress=progress)
    except (ValueError, GGUFError) as exc:  # GGUFError is a ValueError; named for the reader
        print(f"lamplight bench write-model: error: {exc}", file=sys.stderr)
        return 2
    except (OSError, ModelSourceError) as exc:
        print(f"lamplight bench write-model: error: {exc}", file=sys.stderr)
        return 1
    mix = ", ".join(f"{name} x{n}" for name, n in sorted(written.type_counts().items()))
    print(f"wrote {written.path}: {written.bytes / 2**20:.1f} MiB, {len(written.types)} tensors ({mix}) "
          f"in {written.seconds:.1f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lamplight bench", description=DESCRIPTION)
    add_arguments(parser)
    args = parser.parse_args(argv)
    return args.bench_main(args)  # run_with_args, or a subcommand's


def run_with_args(args: argparse.Namespace) -> int:
    """Run the benchmark described by parsed arguments; returns the process exit code."""
    if getattr(args, "engine", False):
        from lamplight.bench.engine_bench import run_engine_bench

        paths = [p.strip() for p in args.paths.split(",") if p.strip()]
        if not paths or any(p not in ("reference", "fast", "compiled", "native") for p in paths):
            print("lamplight bench: error: --paths takes reference, fast, compiled and/or native", file=sys.stderr)
            return 2
        return run_engine_bench(args.engine_model, paths, list(args.batches), args.steps, args.json)
    progress = Progress(enabled=not args.no_progress)
    try:
        options = options_from_args(args)
        progress.note(f"[bench] seed {options.seed}")
        report = asyncio.run(run_benchmark(options, progress))
    except BenchError as exc:
        print(f"lamplight bench: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nlamplight bench: interrupted", file=sys.stderr)
        return 130
    return _publish(report, args.json)


def options_from_args(args: argparse.Namespace) -> BenchOptions:
    servers = [ServerSpec(args.url, args.model)]
    compare_models = list(args.compare_model or [])
    for i, url in enumerate(args.compare or []):
        if url.rstrip("/") in {spec.url.rstrip("/") for spec in servers}:
            raise BenchError(f"--compare {url}: that server is already measured (each URL once)")
        servers.append(ServerSpec(url, compare_models[i] if i < len(compare_models) else None))
    if len(servers) > 26:
        raise BenchError("at most 26 servers (A to Z)")
    names = [name for group in (args.scenarios or [DEFAULT_SCENARIOS]) for name in group]
    return BenchOptions(
        servers=servers,
        scenarios=list(dict.fromkeys(names)),
        config=_config(args),
        api=args.api,
        seed=args.seed if args.seed is not None else int(time.time()),
        timeout_s=args.timeout,
    )


_CONFIG_FIELDS = [f.name for f in dataclasses.fields(BenchConfig)]


def _config_override(text: str) -> tuple[str, object]:
    """"FIELD=VALUE" of BenchConfig, the value parsed as the field's default's type."""
    key, sep, value = text.partition("=")
    if not sep or key not in _CONFIG_FIELDS:
        raise argparse.ArgumentTypeError(f"{text!r}: expected FIELD=VALUE with FIELD one of {', '.join(_CONFIG_FIELDS)}")
    default = getattr(DEFAULT_CONFIG, key)
    try:
        parsed = _int_list(value) if isinstance(default, tuple) else type(default)(value)
    except (ValueError, argparse.ArgumentTypeError):
        raise argparse.ArgumentTypeError(f"{text!r}: {key} takes {type(default).__name__} values") from None
    if min(parsed if isinstance(parsed, tuple) else (parsed,)) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: {key} must be at least 1")
    return key, parsed


def _config(args: argparse.Namespace) -> BenchConfig:
    config = QUICK_CONFIG if args.quick else DEFAULT_CONFIG
    overrides = dict(getattr(args, "config_overrides", []) or [])
    if args.concurrency:
        overrides["concurrency_levels"] = args.concurrency
    if args.ttft_lengths:
        overrides["ttft_lengths"] = args.ttft_lengths
    return dataclasses.replace(config, **overrides)


def _publish(report: BenchReport, json_path: str | None) -> int:
    print(format_table(report))
    if json_path:
        try:
            write_json(report, json_path)
        except OSError as exc:
            print(f"lamplight bench: error: cannot write {json_path}: {exc}", file=sys.stderr)
            return 1
    for warning in report.warnings():
        print(f"lamplight bench: warning: {warning}", file=sys.stderr)
    errors = report.error_count()
    if errors:
        print(f"lamplight bench: error: {errors} requests failed (see warnings above)",
              file=sys.stderr)
        return 1
    return 0


def _scenario_names(value: str) -> list[str]:
    names = [name.strip() for name in value.split(",") if name.strip()]
    unknown = [name for name in names if name not in SCENARIOS]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown scenario {', '.join(unknown)} (choose from {', '.join(SCENARIOS)})")
    return names


def _int_list(value: str) -> tuple[int, ...]:
    try:
        numbers = tuple(int(part) for part in value.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers like 1,4,16, got {value!r}") from None
    if not numbers or min(numbers) < 1:
        raise argparse.ArgumentTypeError(f"expected positive numbers, got {value!r}")
    return numbers


def _join(numbers: tuple[int, ...]) -> str:
    return ",".join(str(n) for n in numbers)
