"""The retrieval scenarios: embeddings (many short inputs in one request, as a RAG tool indexes
its chunks) and rerank (one query against many passages). Not in the default run: a server
answers them only when started for them (--embedding, --reranking).

As the generation scenarios: all texts are built first, then each request goes to every server
in turn (A, B, A, B...); each server gets one untimed request first, and figures are medians.
"""

from __future__ import annotations

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
    for target in ctx.targets:
        await _embed(target, warmup)
    ctx.progress.start("embeddings", len(batches) * len(ctx.targets))
    for repeat, texts in enumerate(batches):
        for target in ctx.targets:
            record = await _embed(target, texts)
            _add(ctx, scenario, record, repeat=repeat)
    ctx.progress.finish()
    size = f"{cfg.embeddings_inputs} inputs of ~{cfg.embeddings_input_tokens} tokens a request"
    scenario.rows = [
        summary_row(scenario, ctx, f"inputs per second, {size}", "inputs/s", True, "items_per_s"),
        summary_row(scenario, ctx, "input tokens per second", "tok/s", True, "tokens_per_s"),
        summary_row(scenario, ctx, "latency of a request", "ms", False, "total_s", 1000),
    ]
    return scenario


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
    for target in ctx.targets:
        await _rerank(target, query, documents[:WARMUP_ITEMS])
    ctx.progress.start("rerank", len(requests) * len(ctx.targets))
    for repeat, (query, documents) in enumerate(requests):
        for target in ctx.targets:
            _add(ctx, scenario, await _rerank(target, query, documents), repeat=repeat)
    ctx.progress.finish()
    size = f"{cfg.rerank_documents} documents of ~{cfg.rerank_document_tokens} tokens a request"
    scenario.rows = [
        summary_row(scenario, ctx, f"documents per second, {size}", "docs/s", True, "items_per_s"),
        summary_row(scenario, ctx, "pair tokens per second", "tok/s", True, "tokens_per_s"),
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


async def _rerank(target: Target, query: str, documents: list[str]) -> dict:
    """One /v1/rerank request scoring every document; an answer missing one is an error."""
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


def _add(ctx: BenchContext, scenario: ScenarioResult, record: dict, **tags) -> None:
    scenario.records.append({**record, **tags})
    ctx.progress.tick(failed=record["error"] is not None)


RETRIEVAL_SCENARIOS = {
    "embeddings": run_embeddings,
    "rerank": run_rerank,
}
