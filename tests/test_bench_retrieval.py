"""The embeddings and rerank bench scenarios (lamplight.bench.retrieval), run through the CLI
against fake servers that answer /v1/embeddings and /v1/rerank only (as an encoder does: no
generation, so no generation warm-up), one slower than the other."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from test_bench_client import AppThread

from lamplight.bench import main
from lamplight.bench.config import DEFAULT_CONFIG, QUICK_CONFIG
from lamplight.bench.runner import DEFAULT_SCENARIOS, SCENARIOS


@dataclass
class RetrievalServer:
    """Word-count tokenizer; each input or document costs `per_item_s`; `drop_one` answers one
    vector or score too few (a broken server the bench must report)."""

    per_item_s: float
    drop_one: bool = False
    bodies: list[tuple[str, dict]] = field(default_factory=list)

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.get("/v1/models")
        async def models():
            return {"object": "list", "data": [{"id": "encoder", "object": "model"}]}

        @app.get("/props")
        async def props():
            return {"default_generation_settings": {"n_ctx": 512}}

        @app.post("/tokenize")
        async def tokenize(request: Request):
            return {"tokens": list(range(len((await request.json())["content"].split())))}

        @app.post("/v1/embeddings")
        async def embeddings(request: Request):
            body = await request.json()
            self.bodies.append(("embeddings", body))
            texts = body["input"]
            await asyncio.sleep(self.per_item_s * len(texts))
            data = [{"object": "embedding", "index": i, "embedding": [0.5, 0.5]} for i in range(len(texts))]
            tokens = sum(len(t.split()) for t in texts)
            return {"object": "list", "data": data[:len(data) - self.drop_one],
                    "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}

        @app.post("/v1/rerank")
        async def rerank(request: Request):
            body = await request.json()
            self.bodies.append(("rerank", body))
            documents = body["documents"]
            await asyncio.sleep(self.per_item_s * len(documents))
            results = [{"index": i, "relevance_score": -i} for i in range(len(documents))]
            tokens = sum(len(body["query"].split()) + len(d.split()) for d in documents)
            return {"results": results[:len(results) - self.drop_one], "usage": {"prompt_tokens": tokens}}

        @app.post("/v1/completions")
        async def completions():
            return JSONResponse({"error": {"message": "embeddings only", "type": "not_supported_error"}}, 501)

        return app


def run(tmp_path, a: RetrievalServer, b: RetrievalServer, *args: str) -> tuple[int, dict]:
    out = tmp_path / "bench.json"
    with AppThread(a.app()) as server_a, AppThread(b.app()) as server_b:
        code = main(["--url", server_a.url, "--compare", server_b.url, "--quick", "--no-progress", "--seed", "4",
                     "--json", str(out), "--scenarios", "embeddings,rerank", *args])
    return code, json.loads(out.read_text())


def test_embeddings_and_rerank_measure_items_per_second_side_by_side(tmp_path, capsys):
    fast, slow = RetrievalServer(per_item_s=0.001), RetrievalServer(per_item_s=0.004)
    code, report = run(tmp_path, fast, slow, "--set", "embeddings_repeats=2", "--set", "rerank_documents=6")
    assert code == 0, capsys.readouterr().err
    embeddings, rerank = report["scenarios"]
    assert embeddings["params"] == {"inputs": 32, "input_tokens": 20, "repeats": 2}
    assert rerank["params"] == {"documents": 6, "document_tokens": 64, "query_tokens": 16, "repeats": 1}
    # an untimed request of two items first, then the timed ones, A and B in turn
    kinds = [kind for kind, _ in fast.bodies]
    assert kinds == ["embeddings"] * 3 + ["rerank"] * 2 and [k for k, _ in slow.bodies] == kinds
    timed = [body for kind, body in fast.bodies if kind == "embeddings"][1:]
    assert all(len(body["input"]) == 32 and body["model"] == "encoder" for body in timed)
    assert timed[0]["input"] != timed[1]["input"] and timed[0]["input"] == [b for k, b in slow.bodies][1]["input"]
    assert all(18 <= len(text.split()) <= 22 for text in timed[0]["input"])  # ~20 tokens, by /tokenize's count
    (_, ranked), = [(k, b) for k, b in fast.bodies if k == "rerank"][1:]
    assert len(ranked["documents"]) == 6 and ranked["top_n"] == 6
    assert [(r["server"], r["repeat"]) for r in embeddings["requests"]] == [("A", 0), ("B", 0), ("A", 1), ("B", 1)]
    summary = {(row["scenario"], row["metric"].split(",")[0]): row for row in report["summary"]}
    per_second = summary[("embeddings", "inputs per second")]
    assert per_second["better"] == "A" and 1.5 < per_second["ratio_a_over_b"] < 4.5
    assert per_second["values"]["A"] < 1000  # 32 inputs at 1 ms each: at most 1000 a second
    assert summary[("rerank", "documents per second")]["better"] == "A"
    assert summary[("rerank", "latency of a request")]["better"] == "A"
    tokens = summary[("embeddings", "input tokens per second")]["values"]
    assert tokens["A"] > 10 * per_second["values"]["A"]  # ~20 tokens an input
    assert "inputs per second, 32 inputs of ~20 tokens a request" in capsys.readouterr().out


def test_a_server_answering_too_few_items_is_an_error(tmp_path, capsys):
    code, report = run(tmp_path, RetrievalServer(0.0), RetrievalServer(0.0, drop_one=True))
    err = capsys.readouterr().err
    assert code == 1
    assert "answered 31 vectors for 32 inputs" in err and "answered 7 scores for 8 documents" in err
    assert all(r["error"] is None for r in report["scenarios"][0]["requests"] if r["server"] == "A")
    row = next(r for r in report["summary"] if r["metric"].startswith("inputs per second"))
    assert row["values"]["B"] is None and row["values"]["A"] > 0


def test_retrieval_scenarios_are_named_but_not_run_by_default(capsys):
    assert {"embeddings", "rerank"} <= set(SCENARIOS) and not {"embeddings", "rerank"} & set(DEFAULT_SCENARIOS)
    assert QUICK_CONFIG.rerank_documents < DEFAULT_CONFIG.rerank_documents == 64
    assert DEFAULT_CONFIG.embeddings_inputs == 256 and DEFAULT_CONFIG.embeddings_input_tokens == 20
    with pytest.raises(SystemExit):
        main(["--help"])
    words = capsys.readouterr().out.replace(",", " ").split()
    for name in ("embeddings", "rerank", "embeddings_inputs", "rerank_document_tokens"):
        assert name in words
