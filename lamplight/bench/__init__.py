"""Benchmark load generator for OpenAI-compatible servers (`python -m lamplight.bench`).

Modules: cli (arguments, exit codes), runner (one whole run), scenarios (what is measured),
client (HTTP and per-request timing), prompts (deterministic prompts), report (table, JSON),
config (scenario sizes), context (what scenarios share), progress (stderr counter),
random_model (`bench write-model`: random-weight GGUFs of real model shapes).

To mount as a subcommand: `add_arguments(subparser)`, then call `run_with_args(args)`.
"""

from lamplight.bench.cli import add_arguments, main, run_with_args

__all__ = ["add_arguments", "main", "run_with_args"]
