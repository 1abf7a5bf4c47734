"""Constrained generation end to end with SmolLM2: every grammar and schema of the corpus, five
generations each at temperature 1.0, all valid; constrained and free requests in one batch."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
import pytest
from grammar_corpus import GBNF_CASES, SCHEMA_CASES
from test_server_support import model_server

from lamplight.grammar import GrammarCompiler

pytestmark = pytest.mark.real_model

GENERATIONS = 5
MAX_TOKENS = 256


@pytest.fixture(scope="module")
def server(smollm2_path):
    with model_server(smollm2_path, fast=True, n_ctx=8 * 512, n_parallel=8) as running:
        yield running


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server[0].url, timeout=600) as client:
        yield client


def complete(http, prompt: str, **body) -> list[dict]:
    response = http.post("/v1/completions", json={
        "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 1.0, "n": GENERATIONS, **body})
    assert response.status_code == 200, response.text
    return response.json()["choices"]


def test_corpus_is_large_enough():
    assert len(GBNF_CASES) >= 10 and len(SCHEMA_CASES) >= 15


@pytest.mark.parametrize("case", GBNF_CASES, ids=lambda c: c.name)
def test_gbnf_outputs_are_accepted(http, server, case):
    compiler = GrammarCompiler(server[1].tokenizer)
    tokenizer = server[1].tokenizer
    choices = complete(http, f"Write an example of {case.name.replace('-', ' ')}:\n", grammar=case.grammar, seed=11)
    assert len(choices) == GENERATIONS
    for choice in choices:
        text = choice["text"]
        assert choice["finish_reason"] == "stop", f"{case.name}: cut at max_tokens: {text!r}"
        if case.check is not None:
            assert re.fullmatch(case.check, text, flags=re.S), f"{case.name}: {text!r}"
        matcher = compiler.compile_gbnf(case.grammar).new_matcher()
        ids = tokenizer.encode(text, add_special=False, parse_special=False)
        assert all(matcher.accept(t) for t in ids) and matcher.is_accepting(), f"{case.name}: {text!r}"


@pytest.mark.parametrize("case", SCHEMA_CASES, ids=lambda c: c.name)
def test_schema_outputs_validate(http, case):
    choices = complete(http, f"Produce a JSON document ({case.name.replace('-', ' ')}):\n", json_schema=case.schema, seed=7)
    for choice in choices:
        assert choice["finish_reason"] == "stop", f"{case.name}: cut at max_tokens: {choice['text']!r}"
        document = json.loads(choice["text"])
        jsonschema.validate(document, case.schema if not isinstance(case.schema, bool) else {})


def test_response_format_json_schema_with_openai_client(server):
    import openai

    client = openai.OpenAI(base_url=f"{server[0].url}/v1", api_key="unused", max_retries=0)
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                               "population": {"type": "integer", "minimum": 0, "maximum": 99999999}},
              "required": ["city", "population"]}
    reply = client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Describe Paris as JSON."}], max_tokens=160,
        temperature=1.0, seed=3,
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema, "strict": True}},
    )
    assert reply.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(reply.choices[0].message.content), schema)
    anything = client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Give me a JSON object about cats."}], max_tokens=200,
        temperature=0, response_format={"type": "json_object"},
    )
    content = anything.choices[0].message.content
    assert content.startswith("{")
    if anything.choices[0].finish_reason == "stop":  # an open-ended object may outrun any budget
        assert isinstance(json.loads(anything.choices[0].message.content), dict)


def test_constrained_and_free_requests_in_one_batch(http):
    schemas = [case.schema for case in SCHEMA_CASES[:4]]
    free = [{"prompt": f"Tell a short story number {i}:", "seed": 100 + i} for i in range(4)]
    constrained = [{"prompt": "JSON:\n", "json_schema": s, "seed": 200 + i} for i, s in enumerate(schemas)]

    def one(body):
        response = http.post("/completion", json={"n_predict": 48, "temperature": 1.0, "cache_prompt": False, **body})
        assert response.status_code == 200, response.text
        return response.json()["content"]

    alone = [one(body) for body in free]
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, free + constrained))
    assert results[:4] == alone
    for schema, text in zip(schemas, results[4:]):
        if not text.endswith(("}", "]", '"')) and len(text) > 0:
            continue  # cut at n_predict 48: only complete documents can be validated
        jsonschema.validate(json.loads(text), schema if not isinstance(schema, bool) else {})
