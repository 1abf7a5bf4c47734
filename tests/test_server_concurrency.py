"""The server under concurrent load, with the official openai client and the real SmolLM2 model:
8 concurrent greedy chats equal the same chats one by one; a repeated request hits the cache."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
from test_server_support import model_server


pytestmark = pytest.mark.real_model

QUESTIONS = [
    "What is the capital of France?",
    "Name a primary color.",
    "Write one word about the sea.",
    "What is 2 + 2?",
    "Say hello in Spanish.",
    "Which planet is closest to the sun?",
    "Give me a fruit that is yellow.",
    "What do bees make?",
]


@pytest.fixture(scope="module", params=["reference", "fast"])
def client(request, smollm2_path):
    with model_server(smollm2_path, fast=request.param == "fast", n_ctx=8 * 256, n_parallel=8) as (server, _):
        yield openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=300)


def chat(client, question: str, **extra):
    return client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": question}], max_tokens=12, temperature=0,
        extra_body={"cache_prompt": False, **extra},
    )


def test_eight_concurrent_chats_equal_one_by_one(client):
    alone = [chat(client, q).choices[0].message.content for q in QUESTIONS]
    with ThreadPoolExecutor(len(QUESTIONS)) as pool:
        together = list(pool.map(lambda q: chat(client, q).choices[0].message.content, QUESTIONS))
    assert all(alone)
    assert together == alone


def test_identical_request_reports_cached_tokens(client):
    question = "Tell me about the moon in one sentence."
    first = chat(client, question, cache_prompt=True)
    second = chat(client, question, cache_prompt=True)
    prompt_tokens = second.usage.prompt_tokens
    assert second.usage.prompt_tokens_details.cached_tokens == prompt_tokens - 1
    assert second.choices[0].message.content == first.choices[0].message.content


def test_concurrent_streams_complete(client):
    def stream(question: str) -> str:
        chunks = client.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": question}], max_tokens=8,
            temperature=0, stream=True, extra_body={"cache_prompt": False},
        )
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    with ThreadPoolExecutor(4) as pool:
        streamed = list(pool.map(stream, QUESTIONS[:4]))
    assert streamed == [chat(client, q, max_tokens=8).choices[0].message.content for q in QUESTIONS[:4]]
