"""The seven benchmark scenarios.

Each scenario builds all its prompts first (tokenizer calls never overlap timed requests), then
sends each step to every server in turn (A, B, A, B...) so that drift in the machine's load or
temperature affects all servers alike. Figures are medians over requests.
"""

from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable

from lamplight.bench.context import TEMPLATE_MARGIN, BenchContext, Target
from lamplight.bench.prompts import Prompt, repeated_share
from lamplight.bench.report import MetricRow, ScenarioResult, median_or_none, scaled
from lamplight.bench.roofline import Roofline


def summary_row(scenario: ScenarioResult, ctx: BenchContext, name: str, unit: str,
                higher_is_better: bool, field: str, factor: float = 1.0,
                select: Callable[[dict], bool] = lambda record: True) -> MetricRow:
    """The median of one per-request field, per server, over the selected successful requests."""
    values, samples = {}, {}
    for target in ctx.targets:
        figures = [r[field] for r in scenario.records_of(target.label)
                   if select(r) and not r["error"] and r[field] is not None]
        values[target.label] = scaled(median_or_none(figures), factor)
        samples[target.label] = len(figures)
    return MetricRow(scenario.name, name, unit, higher_is_better, values, samples)


async def run_decode(ctx: BenchContext) -> ScenarioResult:
    cfg = ctx.config
    scenario = ScenarioResult("decode", {"prompt_tokens": cfg.decode_prompt_tokens,
                                         "max_tokens": cfg.decode_max_tokens,
                                         "repeats": cfg.decode_repeats})
    prompts = [await ctx.prompts.prompt(cfg.decode_prompt_tokens, f"decode/{i}")
               for i in range(cfg.decode_repeats)]
    roofline = Roofline(ctx.targets)
    ctx.progress.start("decode", len(prompts) * len(ctx.targets))
    for repeat, prompt in enumerate(prompts):
        for target in ctx.targets:
            before = await roofline.sample(target.label)
            record = await ctx.measure(scenario, target, prompt, cfg.decode_max_tokens, repeat=repeat)
            roofline.judge(record, before, await roofline.sample(target.label))
    ctx.progress.finish()
    scenario.rows = [
        summary_row(scenario, ctx, "decode speed, single stream", "tok/s", True, "decode_tps"),
        *roofline.rows(scenario, [t.label for t in ctx.targets]),
        summary_row(scenario, ctx, f"latency for {cfg.decode_max_tokens} tokens", "ms", False,
                    "total_s", 1000),
    ]
    scenario.params["roofline"] = roofline.params()
    return scenario


async def run_ttft(ctx: BenchContext) -> ScenarioResult:
    cfg = ctx.config
    scenario = ScenarioResult("ttft", {"prompt_lengths": list(cfg.ttft_lengths),
                                       "repeats": cfg.ttft_repeats,
                                       "max_tokens": cfg.ttft_max_tokens})
    steps = [(length, repeat, await ctx.prompts.prompt(length, f"ttft/{length}/{repeat}"))
             for length in cfg.ttft_lengths for repeat in range(cfg.ttft_repeats)]
    plan = _fitting_plan(scenario, ctx, steps, cfg.ttft_max_tokens)
    ctx.progress.start("ttft", sum(len(targets) for *_, targets in plan))
    for length, repeat, prompt, targets in plan:
        for target in targets:
            await ctx.measure(scenario, target, prompt, cfg.ttft_max_tokens,
                              prompt_length=length, repeat=repeat)
    ctx.progress.finish()
    scenario.rows = [
        summary_row(scenario, ctx, f"TTFT, {length}-token prompt", "ms", False, "ttft_s", 1000,
                    select=lambda r, length=length: r["prompt_length"] == length)
        for length in cfg.ttft_lengths
    ]
    return scenario


def _fitting_plan(scenario: ScenarioResult, ctx: BenchContext, steps: list[tuple[int, int, Prompt]],
                  max_tokens: int) -> list[tuple[int, int, Prompt, list[Target]]]:
    """Each (length, repeat, prompt) step with the servers whose context holds it; a note for the others."""
    plan = [(length, repeat, prompt, [t for t in ctx.targets if ctx.fits(t, prompt, max_tokens)])
            for length, repeat, prompt in steps]
    _note_skipped_lengths(scenario, ctx, plan)
    return plan


def _note_skipped_lengths(scenario: ScenarioResult, ctx: BenchContext, plan: list) -> None:
    skipped = {(target.label, length)
               for length, _, _, targets in plan for target in ctx.targets if target not in targets}
    for label, length in sorted(skipped):
        n_ctx = next(t.info.n_ctx for t in ctx.targets if t.label == label)
        scenario.notes.append(f"{length}-token prompt skipped on server {label}: "
                              f"it does not fit its context of {n_ctx} tokens")


async def run_concurrency(ctx: BenchContext) -> ScenarioResult:
    cfg = ctx.config
    scenario = ScenarioResult("concurrency", {"levels": list(cfg.concurrency_levels),
                                              "rounds": cfg.concurrency_rounds,
                                              "prompt_tokens": cfg.concurrency_prompt_tokens,
                                              "max_tokens": cfg.concurrency_max_tokens})
    plans = {level: await _stream_prompts(ctx, level) for level in cfg.concurrency_levels}
    requests = sum(level * cfg.concurrency_rounds for level in cfg.concurrency_levels)
    ctx.progress.start("concurrency", requests * len(ctx.targets))
    for level, stream_prompts in plans.items():
        for target in ctx.targets:
            scenario.batches.append(await _run_batch(ctx, scenario, target, level, stream_prompts))
    ctx.progress.finish()
    for level in cfg.concurrency_levels:
        scenario.rows.append(_aggregate_row(scenario, ctx, level))
        scenario.rows.append(summary_row(
            scenario, ctx, f"TTFT, {level} in flight", "ms", False, "ttft_s", 1000,
            select=lambda r, level=level: r["concurrency"] == level))
    return scenario


async def _stream_prompts(ctx: BenchContext, level: int) -> list[list[Prompt]]:
    """For each of the `level` streams, the prompts it sends one after the other."""
    cfg = ctx.config
    return [[await ctx.prompts.prompt(cfg.concurrency_prompt_tokens,
                                      f"concurrency/{level}/{stream}/{round_}")
             for round_ in range(cfg.concurrency_rounds)]
            for stream in range(level)]


async def _run_batch(ctx: BenchContext, scenario: ScenarioResult, target: Target, level: int,
                     stream_prompts: list[list[Prompt]]) -> dict:
    """Keep `level` requests in flight on one server; aggregate throughput over the wall time."""
    max_tokens = ctx.config.concurrency_max_tokens

    async def stream(index: int, prompts: list[Prompt]) -> None:
        for round_, prompt in enumerate(prompts):
            await ctx.measure(scenario, target, prompt, max_tokens,
                              concurrency=level, stream=index, round=round_)

    started = time.perf_counter()
    await asyncio.gather(*(stream(i, prompts) for i, prompts in enumerate(stream_prompts)))
    wall_s = time.perf_counter() - started
    records = scenario.records_of(target.label, concurrency=level)
    tokens = sum(r["output_tokens"] for r in records if not r["error"])
    return {
        "server": target.label,
        "concurrency": level,
        "requests": len(records),
        "errors": sum(1 for r in records if r["error"]),
        "output_tokens": tokens,
        "wall_s": wall_s,
        "aggregate_tps": tokens / wall_s if wall_s > 0 else None,
    }


def _aggregate_row(scenario: ScenarioResult, ctx: BenchContext, level: int) -> MetricRow:
    values, samples = {}, {}
    for target in ctx.targets:
        batch = next(b for b in scenario.batches
                     if b["server"] == target.label and b["concurrency"] == level)
        usable = batch["requests"] > batch["errors"]
        values[target.label] = batch["aggregate_tps"] if usable else None
        samples[target.label] = batch["requests"] - batch["errors"]
    return MetricRow(scenario.name, f"output speed, {level} in flight", "tok/s", True,
                     values, samples)


async def run_prefix_cache(ctx: BenchContext) -> ScenarioResult:
    cfg = ctx.config
    system_tokens = _fitting_system_tokens(ctx)
    scenario = ScenarioResult("prefix", {"system_tokens": system_tokens,
                                         "user_tokens": cfg.prefix_user_tokens,
                                         "requests": cfg.prefix_requests,
                                         "max_tokens": cfg.prefix_max_tokens})
    if system_tokens < cfg.prefix_system_tokens:
        scenario.notes.append(f"system prompt shortened to {system_tokens} tokens "
                              f"to fit the servers' context")
    system = await ctx.prompts.prompt(system_tokens, "prefix/system")
    prompts = [await ctx.prompts.prompt(cfg.prefix_user_tokens, f"prefix/user/{turn}", system)
               for turn in range(cfg.prefix_requests)]
    ctx.progress.start("prefix", len(prompts) * len(ctx.targets))
    for turn, prompt in enumerate(prompts):
        for target in ctx.targets:
            await ctx.measure(scenario, target, prompt, cfg.prefix_max_tokens, turn=turn)
    ctx.progress.finish()
    first = summary_row(scenario, ctx, "TTFT, first request (cold)", "ms", False, "ttft_s", 1000,
                        select=lambda r: r["turn"] == 0)
    later = summary_row(scenario, ctx, "TTFT, later requests (shared prefix)", "ms", False,
                        "ttft_s", 1000, select=lambda r: r["turn"] > 0)
    scenario.rows = [first, later, _speedup_row(first, later)]
    return scenario


def _fitting_system_tokens(ctx: BenchContext) -> int:
    cfg = ctx.config
    largest = ctx.largest_prompt(cfg.prefix_max_tokens)
    wanted = cfg.prefix_system_tokens
    if largest is None or wanted + cfg.prefix_user_tokens <= largest:
        return wanted
    return max(1, largest - cfg.prefix_user_tokens)


def _speedup_row(first: MetricRow, later: MetricRow) -> MetricRow:
    values = {label: (first.values[label] / later.values[label]
                      if first.values[label] and later.values[label] else None)
              for label in first.values}
    return MetricRow(first.scenario, "prefix cache speedup (first / later TTFT)", "x", True,
                     values, dict(later.samples))


async def run_conversations(ctx: BenchContext) -> ScenarioResult:
    """Conversations that share a long system prompt, all in flight at once, turn by turn: what
    a prefix cache (and, with replicas, routing that keeps a conversation on one) is for. Each
    server runs every conversation's turn k before the next server does (A, B, C, then turn k+1)."""
    cfg = ctx.config
    system_tokens = _fitting_conversation_system_tokens(ctx)
    scenario = ScenarioResult("conversation", {"conversations": cfg.conversation_count,
                                               "turns": cfg.conversation_turns,
                                               "system_tokens": system_tokens,
                                               "user_tokens": cfg.conversation_user_tokens,
                                               "max_tokens": cfg.conversation_max_tokens})
    if system_tokens < cfg.conversation_system_tokens:
        scenario.notes.append(f"system prompt shortened to {system_tokens} tokens so that the last turn fits "
                              f"the servers' context")
    system = (await ctx.prompts.prompt(system_tokens, "conversation/system")).user
    users = [[(await ctx.prompts.prompt(cfg.conversation_user_tokens, f"conversation/{c}/{turn}")).user
              for turn in range(cfg.conversation_turns)] for c in range(cfg.conversation_count)]
    histories = {t.label: [[{"role": "system", "content": system}] for _ in users] for t in ctx.targets}
    ctx.progress.start("conversation", cfg.conversation_count * cfg.conversation_turns * len(ctx.targets))

    async def turn_of(target: Target, conversation: int, turn: int) -> None:
        history = histories[target.label][conversation]
        history.append({"role": "user", "content": users[conversation][turn]})
        previous = scenario.records_of(target.label, conversation=conversation, turn=turn - 1)
        record = await ctx.measure_chat(scenario, target, history, cfg.conversation_max_tokens,
                                        conversation=conversation, turn=turn)
        record["same_replica"] = (record["replica"] == previous[0]["replica"]
                                  if previous and record["replica"] else None)
        history.append({"role": "assistant", "content": record.pop("reply")})

    for turn in range(cfg.conversation_turns):
        for target in ctx.targets:
            await asyncio.gather(*(turn_of(target, c, turn) for c in range(cfg.conversation_count)))
    ctx.progress.finish()
    scenario.rows = _conversation_rows(scenario, ctx, cfg.conversation_turns)
    return scenario


def _fitting_conversation_system_tokens(ctx: BenchContext) -> int:
    """The configured system prompt, or a shorter one when the last turn would not fit a server."""
    cfg = ctx.config
    contexts = [t.info.n_ctx for t in ctx.targets if t.info.n_ctx]
    if not contexts:
        return cfg.conversation_system_tokens
    history = (cfg.conversation_turns * cfg.conversation_user_tokens
               + (cfg.conversation_turns - 1) * cfg.conversation_max_tokens)
    room = min(contexts) - cfg.conversation_max_tokens - TEMPLATE_MARGIN["chat"] * cfg.conversation_turns - history
    return max(1, min(cfg.conversation_system_tokens, room))


def _conversation_rows(scenario: ScenarioResult, ctx: BenchContext, turns: int) -> list[MetricRow]:
    rows = []
    for turn in range(turns):
        rows.append(summary_row(scenario, ctx, f"TTFT, turn {turn + 1}", "ms", False, "ttft_s", 1000,
                                select=lambda r, turn=turn: r["turn"] == turn))
    for turn in range(1, turns):
        rows.append(summary_row(scenario, ctx, f"cached prompt tokens, turn {turn + 1}", "tokens", True,
                                "cached_tokens", select=lambda r, turn=turn: r["turn"] == turn))
    later = [r for r in scenario.records if r["turn"] > 0 and not r["error"]]
    rows.append(_share_row(scenario, ctx, "prompt tokens from the cache, turns 2+", later,
                           lambda r: r["cached_tokens"], lambda r: r["usage_prompt_tokens"]))
    if any(r["same_replica"] is not None for r in later):
        rows.append(_share_row(scenario, ctx, "turns on the previous turn's replica", later,
                               lambda r: None if r["same_replica"] is None else int(r["same_replica"]),
                               lambda r: 1))
    return rows


def _share_row(scenario: ScenarioResult, ctx: BenchContext, name: str, records: list[dict],
               part: Callable[[dict], int | None], whole: Callable[[dict], int | None]) -> MetricRow:
    """sum(part) / sum(whole) in percent, per server, over records where both are known."""
    values, samples = {}, {}
    for target in ctx.targets:
        pairs = [(part(r), whole(r)) for r in records if r["server"] == target.label]
        pairs = [(p, w) for p, w in pairs if p is not None and w]
        total = sum(w for _, w in pairs)
        values[target.label] = 100.0 * sum(p for p, _ in pairs) / total if total else None
        samples[target.label] = len(pairs)
    return MetricRow(scenario.name, name, "%", True, values, samples)


async def run_copy_edit(ctx: BenchContext) -> ScenarioResult:
    """Answers that repeat most of their prompt, as code edits do: where speculative decoding
    (n-gram lookup or a draft model) pays off, so beside the speed comes the share of drafted
    tokens the server accepted, when it reports one, and how much of the answers does repeat
    the prompt (a small model may not: then the scenario shows less than it is meant to).
    ignore_eos keeps the token count fixed."""
    cfg = ctx.config
    scenario = ScenarioResult("copy_edit", {"source_tokens": cfg.copy_edit_source_tokens,
                                            "max_tokens": cfg.copy_edit_max_tokens,
                                            "repeats": cfg.copy_edit_repeats})
    steps = [(cfg.copy_edit_source_tokens, repeat,
              await ctx.prompts.copy_edit_prompt(cfg.copy_edit_source_tokens, f"copy_edit/{repeat}"))
             for repeat in range(cfg.copy_edit_repeats)]
    await _run_plan(ctx, scenario, _fitting_plan(scenario, ctx, steps, cfg.copy_edit_max_tokens),
                    cfg.copy_edit_max_tokens, judge=_note_repetition)
    repeated = summary_row(scenario, ctx, "answer text repeating the prompt", "%", True, "repeated_pct")
    repeated.compared, repeated.aside = False, "of the answers"  # what they are, not how fast a server is
    scenario.rows = [
        summary_row(scenario, ctx, "decode speed, copying the prompt", "tok/s", True, "decode_tps"),
        summary_row(scenario, ctx, f"latency for {cfg.copy_edit_max_tokens} tokens", "ms", False,
                    "total_s", 1000),
        repeated,
    ]
    drafted = [r for r in scenario.records if not r["error"] and r["draft_n"] is not None]
    if drafted:
        scenario.rows.append(_acceptance_row(scenario, ctx, drafted))
    return scenario


def _note_repetition(record: dict, prompt: Prompt) -> None:
    """The record's answer judged against its prompt: the share of it that repeats the prompt
    (prompts.repeated_share) in percent; the text itself is not kept."""
    share = repeated_share(prompt.user, record.pop("reply"))
    record["repeated_pct"] = None if share is None or record["error"] else 100.0 * share


def _acceptance_row(scenario: ScenarioResult, ctx: BenchContext, records: list[dict]) -> MetricRow:
    """Accepted over drafted tokens, summed per server: a request that drafted more weighs more."""
    return _share_row(scenario, ctx, "draft tokens accepted", records,
                      lambda r: r["draft_n_accepted"], lambda r: r["draft_n"])


async def run_long_context(ctx: BenchContext) -> ScenarioResult:
    """One long prompt (8K tokens by default): prefill at length, then decoding that attends to
    all of it; servers whose context cannot hold it are left out with a note."""
    cfg = ctx.config
    length = cfg.long_context_tokens
    scenario = ScenarioResult("long_context", {"prompt_tokens": length,
                                               "max_tokens": cfg.long_context_max_tokens,
                                               "repeats": cfg.long_context_repeats})
    steps = [(length, repeat, await ctx.prompts.prompt(length, f"long_context/{repeat}"))
             for repeat in range(cfg.long_context_repeats)]
    await _run_plan(ctx, scenario, _fitting_plan(scenario, ctx, steps, cfg.long_context_max_tokens),
                    cfg.long_context_max_tokens)
    scenario.rows = [
        summary_row(scenario, ctx, f"TTFT, {length}-token prompt", "ms", False, "ttft_s", 1000),
        summary_row(scenario, ctx, f"decode speed after a {length}-token prompt", "tok/s", True,
                    "decode_tps"),
    ]
    return scenario


async def _run_plan(ctx: BenchContext, scenario: ScenarioResult,
                    plan: list[tuple[int, int, Prompt, list[Target]]], max_tokens: int,
                    judge: Callable[[dict, Prompt], None] | None = None) -> None:
    """Each step on each of its servers in turn, tagged with its repeat; `judge(record, prompt)`
    then reads the record's "reply" (and pops it)."""
    ctx.progress.start(scenario.name, sum(len(targets) for *_, targets in plan))
    for _, repeat, prompt, targets in plan:
        for target in targets:
            record = await ctx.measure(scenario, target, prompt, max_tokens, keep_reply=judge is not None,
                                       repeat=repeat)
            if judge is not None:
                judge(record, prompt)
    ctx.progress.finish()


Scenario = Callable[[BenchContext], Awaitable[ScenarioResult]]

SCENARIOS: dict[str, Scenario] = {
    "decode": run_decode,
    "ttft": run_ttft,
    "concurrency": run_concurrency,
    "prefix": run_prefix_cache,
    "conversation": run_conversations,
    "copy_edit": run_copy_edit,
    "long_context": run_long_context,
}
