"""Jan's dialect of /v1/chat/completions: llama.cpp's request fields, and on a non-streamed chat
completion the /completion fields too (generation_settings, prompt, truncated, tokens_cached,
tokens_evaluated), which `response_fields` trims. Streams are unchanged. Tiny random-weight
model, uvicorn on 127.0.0.1, httpx and the official openai client."""

from __future__ import annotations

import httpx
import openai
import pytest
from test_server_support import sse_events, tiny_served

CHAT = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"max_tokens": 3, "ignore_eos": True, "temperature": 0}
CHAT_KEYS = {"choices", "created", "model", "system_fingerprint", "object", "usage", "id", "timings"}
COMPLETION_FIELDS = ["generation_settings", "prompt", "truncated", "tokens_cached", "tokens_evaluated"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with tiny_served(tmp_path_factory.mktemp("jan")) as (server, _engine):
        yield server


@pytest.fixture()
def client(server):
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client


def chat(client, **fields) -> dict:
    response = client.post("/v1/chat/completions", json={"messages": CHAT, **GREEDY, **fields})
    assert response.status_code == 200, response.text
    return response.json()


def test_the_asked_fields_are_those_of_completion_for_the_same_prompt(client):
    body = chat(client, response_fields=COMPLETION_FIELDS)
    assert set(body) == CHAT_KEYS | set(COMPLETION_FIELDS)
    prompt = client.post("/apply-template", json={"messages": CHAT}).json()["prompt"]
    native = client.post("/completion", json={"prompt": prompt, "n_predict": 3, "ignore_eos": True,
                                              "temperature": 0, "response_fields": COMPLETION_FIELDS}).json()
    for name in ("prompt", "truncated", "tokens_cached", "tokens_evaluated"):
        assert body[name] == native[name], name
    assert body["tokens_evaluated"] == body["usage"]["prompt_tokens"] and body["truncated"] is False
    assert set(body["generation_settings"]) == set(native["generation_settings"])
    assert body["generation_settings"]["n_predict"] == 3 and body["generation_settings"]["temperature"] == 0


def test_response_fields_trims_them_by_completions_paths(client):
    body = chat(client, response_fields=["generation_settings/n_predict", "tokens_evaluated", "content", "usage"])
    assert set(body) == CHAT_KEYS | {"generation_settings/n_predict", "tokens_evaluated"}
    assert body["generation_settings/n_predict"] == 3
    assert body["tokens_evaluated"] == body["usage"]["prompt_tokens"]


def test_without_response_fields_a_chat_completion_carries_them_all(client):
    body = chat(client)
    assert set(body) == CHAT_KEYS | set(COMPLETION_FIELDS)
    assert body["tokens_evaluated"] == body["usage"]["prompt_tokens"] and body["generation_settings"]["n_predict"] == 3


def test_streams_carry_none_of_them(client):
    events = sse_events(client.post("/v1/chat/completions", json={
        "messages": CHAT, **GREEDY, "stream": True, "response_fields": COMPLETION_FIELDS}).text)
    assert events[-1] == "[DONE]"
    assert not any(name in event for event in events[:-1] for name in COMPLETION_FIELDS)


def test_the_openai_client_parses_it(server):
    oai = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)
    reply = oai.chat.completions.create(model="tiny", messages=CHAT, max_tokens=3,
                                        extra_body={"ignore_eos": True, "response_fields": COMPLETION_FIELDS})
    assert isinstance(reply.choices[0].message.content, str) and reply.usage.completion_tokens == 3
    assert reply.model_extra["tokens_evaluated"] == reply.usage.prompt_tokens
    assert reply.model_extra["generation_settings"]["n_predict"] == 3
