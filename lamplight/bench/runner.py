"""Runs a whole benchmark: probe the servers, calibrate prompts, warm up, run the scenarios."""

from __future__ import annotations

import string
import time
from contextlib import AsyncExitStack
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone

from lamplight.bench.client import BenchError, ServerClient
from lamplight.bench.config import DEFAULT_CONFIG, BenchConfig
from lamplight.bench.context import BenchContext, Target
from lamplight.bench.progress import Progress
from lamplight.bench.prompts import PromptFactory
from lamplight.bench.report import BenchReport
from lamplight.bench.retrieval import RETRIEVAL_SCENARIOS
from lamplight.bench.scenarios import SCENARIOS as GENERATION_SCENARIOS

# Every scenario by name; a run without --scenarios runs the generation ones (the retrieval ones
# need a server started for them).
SCENARIOS = {**GENERATION_SCENARIOS, **RETRIEVAL_SCENARIOS}
DEFAULT_SCENARIOS = list(GENERATION_SCENARIOS)

# Head-room in the connection pool above the highest concurrency, for probes and tokenizing.
SPARE_CONNECTIONS = 8


@dataclass
class ServerSpec:
    url: str
    model: str | None = None


@dataclass
class BenchOptions:
    servers: list[ServerSpec]
    scenarios: list[str] = field(default_factory=lambda: list(DEFAULT_SCENARIOS))
    config: BenchConfig = DEFAULT_CONFIG
    api: str = "completions"
    seed: int = 0
    timeout_s: float = 600.0

    def to_dict(self) -> dict:
        return {**asdict(self), "config": self.config.to_dict()}


async def run_benchmark(options: BenchOptions, progress: Progress) -> BenchReport:
    started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    started = time.perf_counter()
    async with AsyncExitStack() as stack:
        targets = [await _open_target(stack, label, spec, options, progress)
                   for label, spec in zip(string.ascii_uppercase, options.servers)]
        prompts = await _prompt_factory(targets, options.seed, progress)
        ctx = BenchContext(targets, prompts, options.config, progress, options.api)
        # The retrieval scenarios warm up with their own kind of request (an encoder cannot generate).
        generates = any(name in GENERATION_SCENARIOS for name in options.scenarios)
        warmup = [await _warm_up(ctx, target) for target in targets] if generates else []
        scenarios = [await SCENARIOS[name](ctx) for name in options.scenarios]
    return BenchReport(
        servers={t.label: t.info for t in targets},
        scenarios=scenarios,
        options=options.to_dict(),
        started_at=started_at,
        duration_s=time.perf_counter() - started,
        warmup=warmup,
    )


async def _open_target(stack: AsyncExitStack, label: str, spec: ServerSpec,
                       options: BenchOptions, progress: Progress) -> Target:
    connections = max(options.config.concurrency_levels, default=1) + SPARE_CONNECTIONS
    client = await stack.enter_async_context(ServerClient(
        spec.url, api=options.api, model=spec.model, timeout_s=options.timeout_s,
        max_connections=connections))
    info = await client.probe()
    progress.note(f"[bench] {label}: {info.url}  model={info.model or '?'}  "
                  f"n_ctx={info.n_ctx or 'unknown'}  tokenize={'yes' if info.tokenize else 'no'}")
    return Target(label, client, info)


async def _prompt_factory(targets: list[Target], seed: int, progress: Progress) -> PromptFactory:
    """Prompts are shared by all servers, measured with the first server that can tokenize."""
    tokenizer = next((t for t in targets if t.info.tokenize), None)
    if tokenizer is None:
        progress.note("[bench] no /tokenize endpoint: assuming one token per word")
        factory = PromptFactory(seed)
    else:
        factory = PromptFactory(seed, tokenizer.client.count_tokens)
    await factory.calibrate()
    return factory


async def _warm_up(ctx: BenchContext, target: Target) -> dict:
    """One untimed request per server; also our chance to fail early with a clear message."""
    prompt = await ctx.prompts.prompt(16, f"warmup/{target.label}")
    result = await target.client.stream(prompt, ctx.config.warmup_max_tokens)
    if result.error:
        raise BenchError(f"server {target.label} ({target.info.url}) failed the warm-up request: "
                         f"{result.error}")
    return {"server": target.label, **result.to_dict()}
