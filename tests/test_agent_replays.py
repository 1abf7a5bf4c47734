"""The requests real agents sent lamplight, replayed (tests/data/agents, README.md there says how
they were recorded and how each run ended): Codex (`codex exec`, OpenAI's Responses API) and
Claude Code (`claude -p`, Anthropic's Messages API), each against a random-weight model with a
large context. The agents themselves are not needed: every recorded request goes to lamplight
again, and each answer must be what that API's official client accepts, event by event.

The random model will not solve anything: the point is the protocol. Replies are capped
(`max_output_tokens` / `max_tokens` at most REPLY_CAP) so the replay stays short."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import httpx
import pydantic
import pytest
from test_server_support import serve
from tiny_gguf import write_tiny_llama

AGENTS = Path(__file__).resolve().parent / "data" / "agents"
RECORDINGS = sorted(AGENTS.glob("*.jsonl.gz"))
REPLY_CAP = 48


def exchanges(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The recordings' server: a tiny random llama with a context as large as an agent's prompt."""
    import lamplight
    from lamplight.server.launcher import EngineOptions, build_engine

    path = write_tiny_llama(tmp_path_factory.mktemp("agents") / "tiny-agent.gguf", n_ctx=131072)
    loaded = lamplight.load(str(path), backend="fast")
    engine = build_engine(loaded, EngineOptions(n_ctx=131072, n_parallel=1))
    running = serve(loaded, engine)
    yield running
    running.stop()
    engine.stop()


def sse_frames(text: str) -> list[tuple[str | None, str]]:
    """(event name, data) of every SSE frame with data (comment pings skipped)."""
    frames = []
    for block in text.split("\n\n"):
        name, data = None, []
        for line in block.split("\n"):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].strip())
        if data:
            frames.append((name, "\n".join(data)))
    return frames


def capped(exchange: dict) -> dict:
    body = dict(exchange["body"])
    field = "max_output_tokens" if exchange["path"].startswith("/v1/responses") else "max_tokens"
    body[field] = min(body.get(field) or REPLY_CAP, REPLY_CAP)
    return body


def check_responses_stream(text: str) -> list[str]:
    from openai.types.responses import ResponseStreamEvent

    adapter = pydantic.TypeAdapter(ResponseStreamEvent)
    events = [adapter.validate_json(data) for _, data in sse_frames(text)]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[-1].type in ("response.completed", "response.incomplete")
    return [e.type for e in events]


def check_messages_stream(text: str) -> list[str]:
    from anthropic.types import RawMessageStreamEvent

    adapter = pydantic.TypeAdapter(RawMessageStreamEvent)
    frames = [(name, data) for name, data in sse_frames(text) if name != "ping"]
    events = [adapter.validate_json(data) for _, data in frames]
    assert [name for name, _ in frames] == [e.type for e in events]
    assert events[0].type == "message_start" and events[-1].type == "message_stop"
    return [e.type for e in events]


def check_answer(exchange: dict, response: httpx.Response) -> None:
    assert response.status_code == exchange["recorded_status"] == 200, response.text[:500]
    path, streamed = exchange["path"], exchange["body"].get("stream")
    if path.startswith("/v1/responses") and streamed:
        check_responses_stream(response.text)
    elif path.startswith("/v1/responses"):
        from openai.types.responses import Response

        Response.model_validate_json(response.text)
    elif path.startswith("/v1/messages/count_tokens"):
        assert response.json()["input_tokens"] > 0
    elif path.startswith("/v1/messages") and streamed:
        check_messages_stream(response.text)
    elif path.startswith("/v1/messages"):
        from anthropic.types import Message

        Message.model_validate_json(response.text)


@pytest.mark.parametrize("recording", RECORDINGS, ids=[p.name.split(".")[0] for p in RECORDINGS])
def test_an_agents_requests_get_answers_its_client_accepts(server, recording):
    recorded = exchanges(recording)
    assert recorded, recording
    with httpx.Client(base_url=server.url, timeout=600) as client:
        for exchange in recorded:
            headers = {k: v for k, v in exchange["headers"].items() if k in ("content-type", "accept", "anthropic-version")}
            response = client.request(exchange["method"], exchange["path"], json=capped(exchange), headers=headers)
            check_answer(exchange, response)
        assert client.get("/health").status_code == 200
