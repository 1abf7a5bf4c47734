"""The HTTP API end to end: the real app, engine and tokenizer on a tiny random-weight model,
served by uvicorn on 127.0.0.1, exercised with httpx and the official openai client."""

from __future__ import annotations

import copy
import functools
import json
import re

import httpx
import openai
import pytest
from conftest import load_jsonl, reference_params
from test_server_support import ServerThread, assert_error, sse_events
from tiny_gguf import write_tiny_llama

import lamplight
from lamplight.server import ServerSettings, ServerState
from lamplight.server.launcher import EngineOptions, build_engine

CHAT = [{"role": "user", "content": "What is the capital of France?"}]
API_KEY = "sekret"


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    return lamplight.load(str(write_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny.gguf")))


@pytest.fixture(scope="module")
def engine(loaded):
    engine = build_engine(loaded, EngineOptions(n_ctx=1024, n_parallel=4, n_ubatch=64))
    yield engine
    engine.stop()


def _serve(loaded, engine, settings: ServerSettings):
    state = ServerState(settings)
    if engine is not None:
        state.attach(loaded, engine)
    return ServerThread(state).start()


@pytest.fixture(scope="module")
def server(loaded, engine):
    server = _serve(loaded, engine, ServerSettings())
    yield server
    server.stop()


@pytest.fixture(scope="module")
def keyed_server(loaded, engine):
    """Same engine; --api-key, --cors-origins, --metrics and --no-slots."""
    settings = ServerSettings(api_keys=("other", API_KEY), cors_origins=("http://good.example",),
                              metrics=True, slots_endpoint=False)
    server = _serve(loaded, engine, settings)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)


# lamplight's own additions to llama-server's shapes: /props' "lamplight" (kernels, memory).
OUR_EXTENSIONS = {"lamplight"}
# Jan's dialect: a non-streamed chat completion also carries these /completion fields.
CHAT_COMPLETION_EXTENSIONS = {"generation_settings", "prompt", "truncated", "tokens_cached", "tokens_evaluated"}


def assert_same_shape(ours, theirs, path="$"):
    """Same keys in every object, recursively (lists: their first elements), but for our
    documented extensions."""
    if isinstance(theirs, dict):
        assert isinstance(ours, dict), f"{path}: expected an object, got {ours!r}"
        allowed = OUR_EXTENSIONS | (CHAT_COMPLETION_EXTENSIONS if theirs.get("object") == "chat.completion" else set())
        extra = (set(ours) - set(theirs)) & allowed
        assert set(ours) - extra == set(theirs), f"{path}: keys differ: {sorted((set(ours) - extra) ^ set(theirs))}"
        for key in theirs:
            assert_same_shape(ours[key], theirs[key], f"{path}.{key}")
    elif isinstance(theirs, list) and theirs and isinstance(theirs[0], (dict, list)):
        assert isinstance(ours, list) and ours, f"{path}: expected a non-empty array, got {ours!r}"
        assert_same_shape(ours[0], theirs[0], f"{path}[0]")


def chunk_kinds(events: list) -> list:
    """Each SSE payload reduced to its key structure, so streams compare by shape."""
    def shape(value):
        if isinstance(value, dict):
            return tuple(sorted((k, shape(v)) for k, v in value.items()))
        return "list" if isinstance(value, list) else None
    return [e if e == "[DONE]" else shape(e) for e in events]


# -- matching the captured llama-server examples ---------------------------------------------

EXAMPLES_FILE = "llama-server-examples.jsonl"
SKIPPED_EXAMPLES = {"slots"}  # /slots is the engine's slots_json(); see test_slots


@functools.cache
def _captured_examples() -> dict[str, dict]:
    return {e["name"]: e for e in load_jsonl(EXAMPLES_FILE)}


def captured_example(name: str) -> dict:
    """A captured llama-server exchange, read when a test needs it: the rest run without the data."""
    return _captured_examples()[name]


def _adapted_request(example: dict):
    request = copy.deepcopy(example["request"])
    if example["name"] == "completion_multi_prompt":
        request["prompt"] = ["A", [1, 100]]  # token 504 is outside the tiny vocabulary
    if example["name"] == "detokenize":
        request["tokens"] = [100, 101]
    if isinstance(request, dict) and "n_predict" in request or isinstance(request, dict) and "max_tokens" in request:
        request["ignore_eos"] = True  # the tiny model may pick EOS at once; keep the shapes comparable
    return request


@pytest.mark.parametrize("name", reference_params(
    EXAMPLES_FILE, lambda rows: [r["name"] for r in rows if r["name"] not in SKIPPED_EXAMPLES]))
def test_matches_llama_server_example(client, name):
    example = captured_example(name)
    response = client.request(example["method"], example["path"], json=_adapted_request(example))
    assert response.status_code == example["status"], response.text
    if "sse" in example:
        ours = sse_events(response.text)
        theirs = sse_events("\n\n".join(example["sse"]) + "\n\n")
        assert ours[-1] == "[DONE]" if theirs[-1] == "[DONE]" else ours[-1] != "[DONE]"
        our_kinds, their_kinds = chunk_kinds(ours), chunk_kinds(theirs)
        assert our_kinds[0] == their_kinds[0]
        assert our_kinds[-2:] == their_kinds[-2:]
        assert set(our_kinds) == set(their_kinds)
    else:
        assert_same_shape(response.json(), example["response"])


# -- OpenAI endpoints --------------------------------------------------------------------------

def test_chat_completion(client, server):
    body = client.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 3, "ignore_eos": True}).json()
    assert re.fullmatch(r"chatcmpl-[A-Za-z0-9]{32}", body["id"])
    assert body["object"] == "chat.completion" and body["system_fingerprint"].startswith("b")
    assert body["model"] == "tiny.gguf"
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 3 and body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + 3
    assert client.post("/chat/completions", json={"messages": CHAT, "max_tokens": 1}).status_code == 200


def test_chat_stream_ids_and_order(client):
    response = client.post("/v1/chat/completions", json={
        "messages": CHAT, "max_tokens": 4, "ignore_eos": True, "stream": True,
        "stream_options": {"include_usage": True}})
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response.text)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert chunks[-2]["choices"][0]["finish_reason"] == "length" and "timings" not in chunks[-2]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4 and "timings" in chunks[-1]
    no_usage = sse_events(client.post("/v1/chat/completions", json={
        "messages": CHAT, "max_tokens": 2, "stream": True}).text)
    assert "usage" not in no_usage[-2] and "timings" in no_usage[-2] and no_usage[-1] == "[DONE]"


def test_chat_n_choices_and_logprobs(client):
    body = client.post("/v1/chat/completions", json={
        "messages": CHAT, "max_tokens": 2, "n": 2, "ignore_eos": True, "logprobs": True, "top_logprobs": 3}).json()
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert body["usage"]["completion_tokens"] == 4
    for choice in body["choices"]:
        content = choice["logprobs"]["content"]
        assert len(content) == 2 and len(content[0]["top_logprobs"]) == 3
        assert set(content[0]) == {"id", "token", "bytes", "logprob", "top_logprobs"}


def test_chat_template_options(client):
    def prompt(**extra):
        return client.post("/apply-template", json={"messages": CHAT, **extra}).json()["prompt"]

    assert prompt().endswith("<|im_start|>assistant\n")
    assert not prompt(add_generation_prompt=False).endswith("<|im_start|>assistant\n")
    prefill = prompt(messages=CHAT + [{"role": "assistant", "content": "Paris is"}])
    assert prefill.endswith("<|im_start|>assistant\nParis is")


def test_chat_template_kwargs_reach_the_template(loaded, engine):
    loaded = copy.copy(loaded)
    loaded.chat_template = type(loaded.chat_template)("{{ greeting }}:{{ messages[0]['content'] }}")
    server = _serve(loaded, engine, ServerSettings())
    try:
        body = httpx.post(f"{server.url}/apply-template",
                          json={"messages": CHAT, "chat_template_kwargs": {"greeting": "hey"}}).json()
        assert body["prompt"] == "hey:What is the capital of France?"
    finally:
        server.stop()


@pytest.mark.parametrize("body, message_part", [
    ({"max_tokens": 2}, "'messages' is required"),
    ({"messages": []}, "'messages' must be a non-empty array"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "unknown role 'wizard'"),
    ({"messages": [{"role": "user"}]}, "must have 'content'"),
    ({"messages": "hi"}, "'messages' must be a non-empty array"),
    ({"messages": CHAT + [{"role": "assistant", "content": "a"}] * 2}, "Cannot have 2 or more assistant messages"),
    ({"messages": CHAT, "chat_template_kwargs": "x"}, "Field 'chat_template_kwargs': must be an object"),
    ({"messages": CHAT, "top_p": 2}, "Field 'top_p': must be a number in [0, 1]"),
    ({"messages": CHAT, "temperature": "hot"}, "Field 'temperature'"),
    ({"messages": CHAT, "n": 9}, "Field 'n': must be an integer in [1, 4]"),
    ({"messages": CHAT, "top_logprobs": 2}, "top_logprobs requires logprobs to be set to true"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}]},
     "no multimodal projector"),
    ({"messages": CHAT, "response_format": {"type": "yaml"}}, "response_format type must be one of"),
    ({"messages": CHAT, "tools": [{"type": "function", "function": {"name": "f"}}],
      "tool_choice": {"type": "function", "function": {"name": "g"}}}, "Field 'tool_choice'"),
    ({"messages": CHAT, "grammar": "root ::= x"}, "Field 'grammar'"),
])
def test_chat_request_errors(client, body, message_part):
    assert_error(client.post("/v1/chat/completions", json=body), 400, "invalid_request_error", message_part)


def test_grammar_and_schema_constrain_the_output(client):
    body = client.post("/completion", json={"prompt": "hi", "grammar": 'root ::= "x" [0-9]{3}', "n_predict": 20,
                                            "temperature": 1.0, "seed": 4}).json()
    assert re.fullmatch(r"x[0-9]{3}", body["content"]) and body["stop_type"] == "eos"
    assert body["generation_settings"]["grammar"] == 'root ::= "x" [0-9]{3}'
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    chat = client.post("/v1/chat/completions", json={
        "messages": CHAT, "max_tokens": 40, "temperature": 1.0, "seed": 2,
        "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}}}).json()
    assert json.loads(chat["choices"][0]["message"]["content"]) in ({"ok": True}, {"ok": False})
    assert chat["choices"][0]["finish_reason"] == "stop"


def test_tools_with_tool_choice_none_proceed(client):
    response = client.post("/v1/chat/completions", json={
        "messages": CHAT, "max_tokens": 1, "tool_choice": "none",
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]})
    assert response.status_code == 200, response.text


def test_completions_multi_prompt(client):
    body = client.post("/v1/completions", json={"prompt": ["The", "sky"], "max_tokens": 2, "ignore_eos": True}).json()
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert body["usage"]["completion_tokens"] == 4 and body["object"] == "text_completion"
    assert_error(client.post("/v1/completions", json={"max_tokens": 2}), 400, "invalid_request_error",
                 '"prompt" is required')
    assert_error(client.post("/v1/completions", json={"prompt": []}), 400, "invalid_request_error",
                 '"prompt" must not be empty')


def test_completions_logprobs(client):
    body = client.post("/v1/completions", json={"prompt": "The", "max_tokens": 2, "logprobs": 2}).json()
    content = body["choices"][0]["logprobs"]["content"]
    assert len(content[0]["top_logprobs"]) == 2


# -- native endpoints ------------------------------------------------------------------------

def test_native_completion_options(client):
    body = client.post("/completion", json={"prompt": "The sky", "n_predict": 3, "ignore_eos": True,
                                            "return_tokens": True, "samplers": "kt", "top_k": 5}).json()
    assert len(body["tokens"]) == 3 and body["tokens_predicted"] == 3 and body["stop_type"] == "limit"
    assert body["generation_settings"]["samplers"] == ["top_k", "temperature"]
    assert body["generation_settings"]["top_k"] == 5 and body["prompt"] == "The sky"
    assert client.post("/completions", json={"prompt": "x", "n_predict": 1}).status_code == 200


def test_native_multi_prompt_and_n(client):
    body = client.post("/completion", json={"prompt": ["A", [1, 100]], "n_predict": 1, "n": 2}).json()
    assert isinstance(body, list) and [r["index"] for r in body] == [0, 1, 2, 3]
    assert body[2]["prompt"] == "<|im_start|>" + client.post("/detokenize", json={"tokens": [100]}).json()["content"]


def test_native_stream_multi_prompt(client):
    events = sse_events(client.post("/completion", json={
        "prompt": ["A", "B"], "n_predict": 2, "ignore_eos": True, "stream": True}).text)
    assert "[DONE]" not in events
    finals = [e for e in events if e["stop"]]
    assert sorted(f["index"] for f in finals) == [0, 1]
    for index in (0, 1):
        partials = [e for e in events if e["index"] == index and not e["stop"]]
        assert [p["tokens_predicted"] for p in partials] == [1, 2]


def test_unknown_lora_adapter(client):
    assert_error(client.post("/completion", json={"prompt": "x", "lora": [{"id": 0, "scale": 1.0}]}), 400,
                 "invalid_request_error", "no adapter with id 0")
    assert client.post("/completion", json={"prompt": "x", "n_predict": 1, "lora": []}).status_code == 200


def test_empty_string_prompt_gives_an_empty_result(client):
    body = client.post("/completion", json={"prompt": "", "n_predict": 4}).json()
    assert body["content"] == "" and body["tokens_predicted"] == 0


def test_prompt_too_long(client):
    error = assert_error(client.post("/completion", json={"prompt": "hello " * 400}), 400,
                         "exceed_context_size_error", "exceeds the available context size")
    assert error["n_ctx"] == 256 and error["n_prompt_tokens"] > 256
    stream = client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hello " * 400}], "stream": True})
    assert_error(stream, 400, "exceed_context_size_error")  # before the stream starts: a plain error


def test_tokenize_detokenize(client):
    tokens = client.post("/tokenize", json={"content": "the <|im_end|>"}).json()["tokens"]
    assert 2 in tokens  # parse_special defaults to true
    assert 2 not in client.post("/tokenize", json={"content": "<|im_end|>", "parse_special": False}).json()["tokens"]
    # "é" is two byte tokens in the tiny vocabulary: pieces that are not UTF-8 come back as bytes.
    pieces = client.post("/tokenize", json={"content": "é the", "with_pieces": True}).json()["tokens"]
    assert [p["piece"] for p in pieces] == [[0xC3], [0xA9], " the"]
    assert client.post("/detokenize", json={"tokens": tokens}).json()["content"] == "the <|im_end|>"
    assert_error(client.post("/detokenize", json={"tokens": [99999]}), 400, "invalid_request_error", "Field 'tokens'")


def test_props_models_slots(client):
    props = client.get("/props").json()
    assert props["total_slots"] == 4 and props["default_generation_settings"]["n_ctx"] == 256
    assert props["bos_token"] == "<|endoftext|>" and props["eos_token"] == "<|im_end|>"
    assert props["build_info"].startswith("b")
    models = client.get("/models").json()
    assert models["data"][0]["id"] == "tiny.gguf" and models["data"][0]["meta"]["n_vocab"] == 267
    slots = client.get("/slots").json()
    assert [s["id"] for s in slots] == [0, 1, 2, 3]
    assert client.get("/slots?fail_on_no_slot=1").status_code == 200
    assert_error(client.get("/metrics"), 501, "not_supported_error", "--metrics")
    assert_error(client.post("/props", json={}), 501, "not_supported_error")


# -- stop strings ----------------------------------------------------------------------------

def _pick_stop(text: str) -> str:
    for start in range(3, len(text) - 2):
        candidate = text[start:start + 2]
        if "\ufffd" not in candidate and candidate.strip():
            return candidate
    pytest.skip(f"no usable stop string in {text!r}")


@pytest.mark.parametrize("path", ["/completion", "/v1/completions", "/v1/chat/completions"])
def test_stop_strings_never_leak(client, path):
    base = {"n_predict": 24, "temperature": 0, "cache_prompt": False, "ignore_eos": True}
    base.update({"messages": CHAT} if "chat" in path else {"prompt": "The sky is"})

    def text_of(body):
        if "chat" in path:
            return body["choices"][0]["message"]["content"]
        return body["content"] if path == "/completion" else body["choices"][0]["text"]

    full = text_of(client.post(path, json=base).json())
    stop = _pick_stop(full)
    expected = full[:full.index(stop)]
    stopped = client.post(path, json={**base, "stop": [stop, "never-there"]}).json()
    assert text_of(stopped) == expected
    events = sse_events(client.post(path, json={**base, "stop": stop, "stream": True}).text)
    pieces = []
    for event in events:
        if event == "[DONE]":
            continue
        if path == "/completion":
            pieces.append(event["content"])
        elif event["choices"]:
            choice = event["choices"][0]
            pieces.append(choice.get("text") or (choice.get("delta") or {}).get("content") or "")
    assert "".join(pieces) == expected
    assert all(stop not in piece for piece in pieces)


# -- HTTP behaviour --------------------------------------------------------------------------

def test_http_errors_use_the_error_shape(client):
    assert client.get("/health").json() == {"status": "ok"}
    assert client.get("/health").headers["server"] == "lamplight"
    for method, path in [("GET", "/nope"), ("GET", "/v1/chat/completions"), ("GET", "/docs"),
                         ("GET", "/openapi.json"), ("DELETE", "/completion")]:
        error = assert_error(client.request(method, path), 404, "not_found_error")
        assert error["message"] == "File Not Found"
    bad_bodies = [b"{not json", b"[1, 2]", b"", b'{"prompt": NaN}', b"\xff\xfe"]
    for raw in bad_bodies:
        response = client.post("/completion", content=raw, headers={"content-type": "application/json"})
        assert_error(response, 400, "invalid_request_error")


def test_api_key(keyed_server):
    url = keyed_server.url
    assert httpx.get(f"{url}/health").status_code == 200  # public
    error = assert_error(httpx.get(f"{url}/v1/models"), 401, "authentication_error", "Invalid API Key")
    assert error == {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}
    assert_error(httpx.get(f"{url}/v1/models", headers={"Authorization": "Bearer wrong"}), 401, "authentication_error")
    assert httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {API_KEY}"}).status_code == 200
    assert httpx.get(f"{url}/v1/models", headers={"X-Api-Key": "other"}).status_code == 200
    metrics = httpx.get(f"{url}/metrics", headers={"X-Api-Key": API_KEY})
    assert metrics.status_code == 200 and "llamacpp:prompt_tokens_total" in metrics.text
    assert_error(httpx.get(f"{url}/slots", headers={"X-Api-Key": API_KEY}), 501, "not_supported_error")
    keyed = openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        keyed.models.list()


def test_cors(client, keyed_server):
    response = client.get("/health", headers={"Origin": "http://any.example"})
    assert response.headers["access-control-allow-origin"] == "http://any.example"
    assert response.headers["access-control-allow-credentials"] == "true"
    preflight = client.options("/v1/chat/completions", headers={
        "Origin": "http://any.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert preflight.status_code == 200
    assert "POST" in preflight.headers["access-control-allow-methods"]
    assert "authorization" in preflight.headers["access-control-allow-headers"]
    assert httpx.options(f"{keyed_server.url}/v1/models").status_code == 200  # preflight needs no key
    other = httpx.get(f"{keyed_server.url}/health", headers={"Origin": "http://evil.example"})
    assert "access-control-allow-origin" not in other.headers
    good = httpx.get(f"{keyed_server.url}/health", headers={"Origin": "http://good.example"})
    assert good.headers["access-control-allow-origin"] == "http://good.example"


def test_loading_answers_503(loaded):
    server = _serve(loaded, None, ServerSettings(api_keys=(API_KEY,)))
    try:
        for path in ("/health", "/v1/health", "/v1/models", "/props"):
            assert_error(httpx.get(f"{server.url}{path}"), 503, "unavailable_error", "Loading model")
    finally:
        server.stop()


# -- the official openai client --------------------------------------------------------------

def test_openai_client(oai):
    chat = oai.chat.completions.create(model="tiny", messages=CHAT, max_tokens=3, extra_body={"ignore_eos": True})
    assert chat.choices[0].message.role == "assistant" and chat.usage.completion_tokens == 3
    stream = oai.chat.completions.create(model="tiny", messages=CHAT, max_tokens=3, stream=True,
                                         stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].usage.completion_tokens == 3
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert isinstance(text, str)
    completion = oai.completions.create(model="tiny", prompt="The sky", max_tokens=2, extra_body={"ignore_eos": True})
    assert completion.usage.completion_tokens == 2
    # ignore_eos: with an unseeded sampler the random tiny model may otherwise draw its EOS first.
    streamed = list(oai.completions.create(model="tiny", prompt="The sky", max_tokens=2, stream=True,
                                           extra_body={"ignore_eos": True}))
    assert streamed[-1].choices[0].finish_reason == "length"
    assert oai.models.list().data[0].id == "tiny.gguf"
    with pytest.raises(openai.BadRequestError) as info:
        oai.chat.completions.create(model="tiny", messages=CHAT, top_p=3)
    assert "top_p" in str(info.value)


def test_slots_match_llama_server_example_after_a_task(client):
    for slot in range(4):
        client.post("/completion", json={"prompt": "hi", "n_predict": 2, "id_slot": slot, "ignore_eos": True})
    ours = client.get("/slots").json()
    theirs = captured_example("slots")["response"]
    for entry in ours:
        assert entry["is_processing"] is False
        assert_same_shape(entry, theirs[0])
