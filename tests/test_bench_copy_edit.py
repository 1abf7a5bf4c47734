"""The copy_edit and long_context bench scenarios: their prompts, the speculative-decoding draft
counts read from a server's `timings`, the acceptance row, and servers skipped for a short context.

The end-to-end test runs the CLI against a fake server on a loopback port that reports draft
counts the way llama-server does (in the final chunk's `timings`, only when it drafted).
"""

from __future__ import annotations

import ast
import asyncio
import json
import time
from dataclasses import dataclass, field

import pytest
from test_bench_client import AppThread
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from lamplight.bench import main
from lamplight.bench.client import RequestResult, ServerInfo, StreamRecorder
from lamplight.bench.config import DEFAULT_CONFIG, QUICK_CONFIG, BenchConfig
from lamplight.bench.context import BenchContext, Target
from lamplight.bench.progress import Progress
from lamplight.bench.prompts import COPY_EDIT_INSTRUCTION, PromptFactory, estimate_code_tokens, repeated_share
from lamplight.bench.report import ScenarioResult
from lamplight.bench.scenarios import SCENARIOS, _acceptance_row, run_copy_edit, run_long_context


async def chars_tokenizer(text: str) -> int:
    """A stand-in tokenizer unlike the built-in estimate: about four characters a token."""
    return max(1, round(len(text) / 4))


def copy_edit_prompts(seed: int, n_tokens: int = 256, repeats: int = 3, counter=chars_tokenizer):
    async def build():
        factory = PromptFactory(seed, counter)
        return [await factory.copy_edit_prompt(n_tokens, f"copy_edit/{i}") for i in range(repeats)]
    return asyncio.run(build())


def listing(prompt) -> str:
    head = f"{COPY_EDIT_INSTRUCTION}\n\n"
    assert prompt.user.startswith(head)
    return prompt.user[len(head):]


# --- the copy-edit prompts ------------------------------------------------------------------

def test_copy_edit_prompts_are_deterministic_distinct_and_valid_python():
    first, again, other_seed = (copy_edit_prompts(seed) for seed in (1, 1, 2))
    assert first == again and first != other_seed
    codes = [listing(p) for p in first]
    assert len(set(codes)) == 3
    for code in codes:
        assert code.isascii()
        tree = ast.parse(code)  # a real module: the model is asked to copy code, not noise
        functions = [node for node in tree.body if isinstance(node, ast.FunctionDef)]
        assert len(functions) >= 3 and len({f.name for f in functions}) == len(functions)
        assert "total" in {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
        assert "subtotal" not in code


@pytest.mark.parametrize("n_tokens", [128, 256, 1000])
def test_copy_edit_listing_is_close_to_the_wanted_size(n_tokens):
    for prompt in copy_edit_prompts(3, n_tokens, repeats=2):
        code_tokens = asyncio.run(chars_tokenizer(listing(prompt)))
        # Filled up with one-line constants, so within a line's worth of tokens.
        assert abs(code_tokens - n_tokens) <= 6, (n_tokens, code_tokens)
        assert prompt.counted_tokens == asyncio.run(chars_tokenizer(prompt.user))
        assert abs(prompt.counted_tokens - prompt.target_tokens) <= 8


def test_copy_edit_without_a_tokenizer_uses_the_estimate():
    for prompt in copy_edit_prompts(4, 256, repeats=2, counter=None):
        assert prompt.counted_tokens is None
        assert abs(estimate_code_tokens(listing(prompt)) - 256) <= 8
        assert prompt.tokens == prompt.target_tokens > 256


def test_a_tiny_size_still_holds_one_function_with_total():
    (prompt,) = copy_edit_prompts(5, 8, repeats=1)
    tree = ast.parse(listing(prompt))
    assert sum(isinstance(node, ast.FunctionDef) for node in tree.body) == 1
    assert "total =" in prompt.user


# --- how much of an answer repeats its prompt -----------------------------------------------

def test_repeated_share_counts_the_characters_in_runs_found_in_the_source():
    (prompt,) = copy_edit_prompts(6, 256, repeats=1)
    code = listing(prompt)
    assert repeated_share(prompt.user, code) == 1.0
    # The asked-for edit: only the characters near each renamed word fall outside a shared run.
    edited = repeated_share(prompt.user, code.replace("total", "subtotal"))
    assert 0.6 < edited < 1.0
    # Half the answer copied, half new text no 20 characters of which occur in the prompt.
    new = "".join(chr(0x3b1 + i % 20) for i in range(len(code)))
    assert repeated_share(prompt.user, code + new) == pytest.approx(0.5)
    # A line repeated over and over repeats the prompt once (and what other lines of the listing
    # share with it); short shared words do not count.
    line = max(code.splitlines(), key=len) + "\n"
    assert len(line) >= 21 and 0.2 <= repeated_share(prompt.user, line * 5) < 0.4
    assert repeated_share(prompt.user, "return total " * 4) == 0.0
    assert repeated_share(prompt.user, "") is None and repeated_share("", "abc") == 0.0


# --- draft counts from the server's timings --------------------------------------------------

def recorded(*events: dict) -> RequestResult:
    recorder = StreamRecorder(max_tokens=4)
    for event in events:
        recorder.on_event(event, time.perf_counter())
    return recorder.finish()


def chunk(text: str = "x", **extra) -> dict:
    return {"choices": [{"index": 0, "text": text, "finish_reason": None}], **extra}


def test_draft_counts_are_read_from_the_final_timings():
    result = recorded(chunk(), chunk(), chunk("", timings={"predicted_n": 2, "draft_n": 12, "draft_n_accepted": 9}))
    assert (result.draft_n, result.draft_n_accepted) == (12, 9)
    record = result.to_dict()
    assert record["draft_n"] == 12 and record["draft_n_accepted"] == 9
    assert record["server_timings"]["predicted_n"] == 2


def test_chat_final_chunk_timings_carry_draft_counts():
    final = {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}],
             "timings": {"cache_n": 3, "draft_n": 5, "draft_n_accepted": 0}}
    result = recorded({"choices": [{"index": 0, "delta": {"content": "a"}}]}, final)
    assert (result.draft_n, result.draft_n_accepted, result.cached_tokens) == (5, 0, 3)


def test_draft_counts_are_none_without_speculation():
    result = recorded(chunk(), chunk("", timings={"predicted_n": 1, "cache_n": 0}))
    assert result.error is None and result.server_timings is not None
    assert result.draft_n is None and result.draft_n_accepted is None
    assert recorded(chunk()).to_dict()["draft_n"] is None  # no timings at all


def test_later_timings_without_drafts_keep_the_counts_and_bad_values_are_ignored():
    result = recorded(chunk(timings={"draft_n": 4, "draft_n_accepted": 3}), chunk(timings={"predicted_n": 2}))
    assert (result.draft_n, result.draft_n_accepted) == (4, 3)
    result = recorded(chunk(timings={"draft_n": True, "draft_n_accepted": "3"}))
    assert result.draft_n is None and result.draft_n_accepted is None


# --- the acceptance row and skipped servers, in process --------------------------------------

class ScriptedClient:
    """Answers every request at once with the given draft counts and `reply(prompt)` as its text;
    remembers what it was sent."""

    def __init__(self, drafts: list[tuple[int, int]] | None = None, reply=lambda prompt: ""):
        self.drafts = list(drafts or [])
        self.reply = reply
        self.sent: list[tuple[object, int]] = []

    async def stream(self, prompt, max_tokens: int) -> RequestResult:
        self.sent.append((prompt, max_tokens))
        result = RequestResult(max_tokens=max_tokens, total_s=0.05, ttft_s=0.01, decode_s=0.04,
                               content_chunks=max_tokens, usage_completion_tokens=max_tokens,
                               text=self.reply(prompt))
        if self.drafts:
            result.draft_n, result.draft_n_accepted = self.drafts.pop(0)
        return result


def context(config: BenchConfig, *servers: tuple[str, int | None, ScriptedClient]) -> BenchContext:
    targets = [Target(label, client, ServerInfo(f"http://{label}", "m", n_ctx, "test", True))
               for label, n_ctx, client in servers]
    return BenchContext(targets, PromptFactory(1), config, Progress(enabled=False))


def test_acceptance_row_is_summed_accepted_over_summed_drafted():
    ctx = context(DEFAULT_CONFIG, ("A", None, ScriptedClient()), ("B", None, ScriptedClient()))
    scenario = ScenarioResult("copy_edit", {})
    scenario.records = [
        {"server": "A", "error": None, "draft_n": 10, "draft_n_accepted": 8},
        {"server": "A", "error": None, "draft_n": 30, "draft_n_accepted": 1},
        {"server": "B", "error": None, "draft_n": None, "draft_n_accepted": None},
    ]
    row = _acceptance_row(scenario, ctx, scenario.records)
    # 9 of 40 (22.5 %), not the mean of the per-request shares (41.7 %).
    assert row.values == {"A": pytest.approx(22.5), "B": None}
    assert row.samples == {"A": 2, "B": 0} and row.unit == "%" and row.higher_is_better


def test_copy_edit_scenario_reports_speed_latency_acceptance_and_repetition():
    config = BenchConfig(copy_edit_source_tokens=64, copy_edit_max_tokens=32, copy_edit_repeats=2)
    # A repeats the listing it was sent; B answers something else.
    a = ScriptedClient([(20, 15), (10, 10)], reply=lambda prompt: listing(prompt))
    b = ScriptedClient(reply=lambda prompt: "Here is some other text entirely." * 3)
    scenario = asyncio.run(run_copy_edit(context(config, ("A", 4096, a), ("B", 4096, b))))
    assert [r["server"] for r in scenario.records] == ["A", "B", "A", "B"]
    assert [r["repeat"] for r in scenario.records] == [0, 0, 1, 1]
    assert a.sent[0][0] == b.sent[0][0] and a.sent[0][0] != a.sent[1][0]
    assert {max_tokens for _, max_tokens in a.sent + b.sent} == {32}
    rows = {row.name: row for row in scenario.rows}
    assert set(rows) == {"decode speed, copying the prompt", "latency for 32 tokens", "draft tokens accepted",
                         "answer text repeating the prompt"}
    assert rows["draft tokens accepted"].values == {"A": pytest.approx(25 / 30 * 100), "B": None}
    assert rows["decode speed, copying the prompt"].values["A"] == pytest.approx(31 / 0.04)
    assert rows["latency for 32 tokens"].values["B"] == pytest.approx(50)
    repeated = rows["answer text repeating the prompt"]
    assert repeated.values == {"A": 100.0, "B": 0.0} and repeated.samples == {"A": 2, "B": 2}
    assert not repeated.compared and repeated.ratio() is None and repeated.better() is None
    assert repeated.aside == "of the answers"
    assert all("reply" not in r for r in scenario.records)


def test_copy_edit_without_drafts_has_no_acceptance_row():
    config = BenchConfig(copy_edit_source_tokens=64, copy_edit_max_tokens=8, copy_edit_repeats=1)
    scenario = asyncio.run(run_copy_edit(context(config, ("A", None, ScriptedClient()))))
    assert [row.name for row in scenario.rows] == ["decode speed, copying the prompt", "latency for 8 tokens",
                                                   "answer text repeating the prompt"]
    # An empty answer repeats nothing and is not counted.
    assert scenario.rows[-1].values == {"A": None} and scenario.records[0]["repeated_pct"] is None


def test_long_context_skips_servers_whose_context_is_too_small():
    config = BenchConfig(long_context_tokens=8000, long_context_max_tokens=64, long_context_repeats=2)
    big, small, unknown = ScriptedClient(), ScriptedClient(), ScriptedClient()
    ctx = context(config, ("A", 16384, big), ("B", 4096, small), ("C", None, unknown))
    scenario = asyncio.run(run_long_context(ctx))
    assert small.sent == [] and len(big.sent) == len(unknown.sent) == 2
    assert all(prompt.tokens >= 8000 and max_tokens == 64 for prompt, max_tokens in big.sent)
    assert scenario.notes == ["8000-token prompt skipped on server B: it does not fit its context of 4096 tokens"]
    ttft, decode = scenario.rows
    assert ttft.name == "TTFT, 8000-token prompt" and decode.name == "decode speed after a 8000-token prompt"
    assert ttft.values == {"A": pytest.approx(10), "B": None, "C": pytest.approx(10)}
    assert decode.samples == {"A": 2, "B": 0, "C": 2}


def test_config_defaults_and_the_quick_preset():
    assert (DEFAULT_CONFIG.copy_edit_source_tokens, DEFAULT_CONFIG.copy_edit_max_tokens,
            DEFAULT_CONFIG.copy_edit_repeats) == (256, 256, 3)
    assert (DEFAULT_CONFIG.long_context_tokens, DEFAULT_CONFIG.long_context_max_tokens,
            DEFAULT_CONFIG.long_context_repeats) == (8000, 64, 2)
    assert QUICK_CONFIG.copy_edit_source_tokens < 256 and QUICK_CONFIG.long_context_tokens < 8000
    assert SCENARIOS["copy_edit"] is run_copy_edit and SCENARIOS["long_context"] is run_long_context


# --- end to end, through the CLI and HTTP ----------------------------------------------------

@dataclass
class DraftingServer:
    """A fake llama-server: word-count tokenizer, and draft counts in the final chunk's timings
    when `drafts` is set (accepted = 3/4 of drafted, drafted = 2 per generated token)."""

    n_ctx: int
    drafts: bool
    bodies: list[dict] = field(default_factory=list)

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.get("/v1/models")
        async def models():
            return {"object": "list", "data": [{"id": "fake", "object": "model"}]}

        @app.get("/props")
        async def props():
            return {"default_generation_settings": {"n_ctx": self.n_ctx}}

        @app.post("/tokenize")
        async def tokenize(request: Request):
            return {"tokens": list(range(len((await request.json())["content"].split())))}

        @app.post("/v1/completions")
        async def completions(request: Request):
            return await self.generate(request, chat=False)

        @app.post("/v1/chat/completions")
        async def chat(request: Request):
            return await self.generate(request, chat=True)

        return app

    async def generate(self, request: Request, chat: bool) -> StreamingResponse:
        body = await request.json()
        self.bodies.append(body)
        return StreamingResponse(self.stream(body, chat), media_type="text/event-stream")

    async def stream(self, body: dict, chat: bool):
        n = body["max_tokens"] if body.get("ignore_eos") else 1
        for _ in range(n):
            await asyncio.sleep(0.001)
            choice = {"index": 0, "delta": {"content": " x"}} if chat else {"index": 0, "text": " x"}
            yield _sse({"choices": [choice]})
        timings = {"predicted_n": n, **({"draft_n": 2 * n, "draft_n_accepted": 3 * n // 2} if self.drafts else {})}
        yield _sse({"choices": [{"index": 0, "delta": {}, "text": "", "finish_reason": "length"}], "timings": timings,
                    "usage": {"prompt_tokens": 1, "completion_tokens": n}})
        yield "data: [DONE]\n\n"


def _sse(data: dict) -> str:
    return f"data: {json.dumps(data)}\n\n"


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_cli_runs_both_scenarios_against_servers(tmp_path, capsys, api):
    drafting, plain = DraftingServer(n_ctx=4096, drafts=True), DraftingServer(n_ctx=1024, drafts=False)
    out = tmp_path / "bench.json"
    with AppThread(drafting.app()) as a, AppThread(plain.app()) as b:
        code = main(["--url", a.url, "--compare", b.url, "--api", api, "--quick", "--no-progress", "--seed", "3",
                     "--json", str(out), "--scenarios", "copy_edit,long_context",
                     "--set", "copy_edit_repeats=3", "--set", "copy_edit_max_tokens=24",
                     "--set", "long_context_tokens=2000"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = json.loads(out.read_text())
    copy_edit, long_context = report["scenarios"]
    assert copy_edit["params"] == {"source_tokens": 128, "max_tokens": 24, "repeats": 3}
    assert len(copy_edit["requests"]) == 6 and all(r["output_tokens"] == 24 for r in copy_edit["requests"])
    assert all(body["ignore_eos"] and body["max_tokens"] == 24 for body in drafting.bodies[1:4])
    sent = [body["messages"][-1]["content"] if api == "chat" else body["prompt"] for body in drafting.bodies[1:4]]
    assert all(text.startswith(COPY_EDIT_INSTRUCTION) for text in sent) and len(set(sent)) == 3
    assert [(r["draft_n"], r["draft_n_accepted"]) for r in copy_edit["requests"] if r["server"] == "A"] == [(48, 36)] * 3
    assert all(r["draft_n"] is None for r in copy_edit["requests"] if r["server"] == "B")
    summary = {(row["scenario"], row["metric"]): row["values"] for row in report["summary"]}
    assert summary[("copy_edit", "draft tokens accepted")] == {"A": 75.0, "B": None}
    # The fake servers answer " x x x ...": nothing of the prompt.
    assert summary[("copy_edit", "answer text repeating the prompt")] == {"A": 0.0, "B": 0.0}
    assert all(summary[("copy_edit", "decode speed, copying the prompt")].values())
    # B's 1024-token context cannot hold the 2000-token prompt.
    assert [r["server"] for r in long_context["requests"]] == ["A"]
    assert summary[("long_context", "TTFT, 2000-token prompt")]["B"] is None
    assert summary[("long_context", "decode speed after a 2000-token prompt")]["A"] > 0
    assert any("2000-token prompt skipped on server B" in w for w in report["warnings"])
    assert "draft tokens accepted" in captured.out and "2000-token prompt skipped" in captured.err
    assert "answer text repeating the prompt [%] (of the answers)" in captured.out


def test_help_lists_the_new_scenarios_and_fields(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    words = capsys.readouterr().out.replace(",", " ").split()
    assert exit_info.value.code == 0
    for name in ("copy_edit", "long_context", "copy_edit_source_tokens", "long_context_repeats"):
        assert name in words
