"""The retrieval scenarios: embeddings (many short inputs in one request, as a RAG tool indexes
its chunks) and rerank (one query against many passages). Not in the default run: a server
answers them only when started for them (--embedding, --reranking).

As the generation scenarios: all texts are built first, then each request goes to every server
in turn (A, B, A, B...); each server gets one untimed request first, and figures are medians.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable

from lamplight.bench.context import BenchContext, Target
from lamplight.bench.report import ScenarioResult
from lamplight.bench.scenarios import summary_row

# Inputs (or documents) of the untimed first request to each server.
WARMUP_ITEMS = 2


async def run_embeddings(ctx: BenchContext) -> ScenarioResult:
    cfg = ctx.config
    scenario = ScenarioResult("embeddings", {"inputs": cfg.embeddings_inputs,
                                             "input_tokens": cfg.embeddings_input_tokens,
                                             "repeats": cfg.embeddings_repeats})
    batches = [await _texts(ctx, cfg.embeddings_inputs, cfg.embeddings_input_tokens, f"embeddings/{repeat}")
               for repeat in range(cfg.embeddings_repeats)]
    warmup = await _texts(ctx, WARMUP_ITEMS, cfg.embeddings_input_tokens, "embeddings/warmup")
    size = f"{cfg.embeddings_inputs} inputs of ~{cfg.embeddings_input_tokens} tokens a request"
    return await _measure(ctx, scenario, _embed, warmup, batches,
                          per_second=(f"inputs per second, {size}", "inputs/s"), tokens="input tokens")


async def run_rerank(ctx: BenchContext) -> ScenarioResult:
    cfg = ctx.config
    scenario = ScenarioResult("rerank", {"documents": cfg.rerank_documents,
                                         "document_tokens": cfg.rerank_document_tokens,
                                         "query_tokens": cfg.rerank_query_tokens,
                                         "repeats": cfg.rerank_repeats})
    requests = [((await ctx.prompts.fitted_text(cfg.rerank_query_tokens, f"rerank/{repeat}/query"))[0],
                 await _texts(ctx, cfg.rerank_documents, cfg.rerank_document_tokens, f"rerank/{repeat}"))
                for repeat in range(cfg.rerank_repeats)]
    query, documents = requests[0]
    size = f"{cfg.rerank_documents} documents of ~{cfg.rerank_document_tokens} tokens a request"
    return await _measure(ctx, scenario, _rerank, (query, documents[:WARMUP_ITEMS]), requests,
                          per_second=(f"documents per second, {size}", "docs/s"), tokens="pair tokens")


async def _measure(ctx: BenchContext, scenario: ScenarioResult, send: Callable[[Target, Any], Awaitable[dict]],
                   warmup: Any, requests: list, per_second: tuple[str, str], tokens: str) -> ScenarioResult:
    """`send(target, request)` untimed with `warmup` to each server, then each request to every
    server in turn; the rows: items a second (`per_second`: name and unit), tokens a second,
    latency."""
    for target in ctx.targets:
        await send(target, warmup)
    ctx.progress.start(scenario.name, len(requests) * len(ctx.targets))
    for repeat, request in enumerate(requests):
        for target in ctx.targets:
            record = await send(target, request)
            scenario.records.append({**record, "repeat": repeat})
            ctx.progress.tick(failed=record["error"] is not None)
    ctx.progress.finish()
    name, unit = per_second
    scenario.rows = [
        summary_row(scenario, ctx, name, unit, True, "items_per_s"),
        summary_row(scenario, ctx, f"{tokens} per second", "tok/s", True, "tokens_per_s"),
        summary_row(scenario, ctx, "latency of a request", "ms", False, "total_s", 1000),
    ]
    return scenario


async def _texts(ctx: BenchContext, count: int, n_tokens: int, key: str) -> list[str]:
    return [(await ctx.prompts.fitted_text(n_tokens, f"{key}/{i}"))[0] for i in range(count)]


async def _embed(target: Target, texts: list[str]) -> dict:
    """One /v1/embeddings request of all `texts`; an answer without a vector per input is an error."""
    answer = await target.client.post_timed("/v1/embeddings", {"input": texts, "encoding_format": "float"})
    error = answer.error
    if error is None:
        vectors = [item.get("embedding") for item in _list(answer.data, "data")]
        if len(vectors) != len(texts) or not all(isinstance(v, list) and v for v in vectors):
            error = f"/v1/embeddings answered {len(vectors)} vectors for {len(texts)} inputs"
    return _record(target, answer, len(texts), error)


async def _rerank(target: Target, request: tuple[str, list[str]]) -> dict:
    """One /v1/rerank request (query, documents) scoring every document; an answer missing one is
    an error."""
    query, documents = request
    answer = await target.client.post_timed("/v1/rerank", {"query": query, "documents": documents,
                                                           "top_n": len(documents)})
    error = answer.error
    if error is None:
        indices = sorted(item.get("index") for item in _list(answer.data, "results"))
        if indices != list(range(len(documents))):
            error = f"/v1/rerank answered {len(indices)} scores for {len(documents)} documents"
    return _record(target, answer, len(documents), error)


def _list(data, key: str) -> list[dict]:
    items = data.get(key) if isinstance(data, dict) else None
    return [item for item in items if isinstance(item, dict)] if isinstance(items, list) else []


def _record(target: Target, answer, items: int, error: str | None) -> dict:
    usage = answer.data.get("usage") if isinstance(answer.data, dict) else None
    tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    ok = error is None and answer.total_s > 0
    return {
        "server": target.label,
        "items": items,
        "usage_prompt_tokens": tokens,
        "total_s": answer.total_s,
        "items_per_s": items / answer.total_s if ok else None,
        "tokens_per_s": tokens / answer.total_s if ok and isinstance(tokens, int) else None,
        "error": error,
        "short": False,
    }


RETRIEVAL_SCENARIOS = {
    "embeddings": run_embeddings,
    "rerank": run_rerank,
}
