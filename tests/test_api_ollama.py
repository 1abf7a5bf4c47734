"""Ollama's API through the official `ollama` client: /api/chat and /api/generate (streamed and
not, raw, infill) answer what /v1/chat/completions and /completion answer for the same request
(one generation path), options reach the sampler, thinking and tool calls come back in Ollama's
fields, the model endpoints describe the served GGUF, /api/pull downloads into the cache (a local
stand-in for the Hub; offline it fails fast), and every refusal is `{"error": ...}` with a 4xx.

The tiny random-weight model answers the real generations; a scripted engine plays exact replies
where a random model cannot be made to think or call a tool."""

from __future__ import annotations

import copy
import json
import logging
import os
from contextlib import contextmanager

import httpx
import jsonschema
import ollama
import pytest
from conftest import reference_dir
from fake_hub import FakeHub, FakeRepo
from test_reasoning_openai import THINKING_TEMPLATE
from test_seed_fields import FIM
from test_server_support import ScriptedEngine, ServerThread
from test_server_tools import HERMES_TEMPLATE, TINY_TOOLS, tiny_engine, tiny_loaded  # noqa: F401 (fixtures)
from test_tool_cut import script

import lamplight
from lamplight.chat import ChatTemplate
from lamplight.engine.types import ErrorEvent, TokenEvent
from lamplight.server import ServerSettings, ServerState
from lamplight.server.api_ollama_request import THINK_BUDGETS
from lamplight.server.settings import RequestLimits

USER = [{"role": "user", "content": "the cat"}]
GREEDY = {"temperature": 0, "num_predict": 12, "ignore_eos": True}


@contextmanager
def served(model, engine, template: str | None = None, **settings):
    if template is not None:
        model = copy.copy(model)
        model.chat_template = ChatTemplate(template)
    state = ServerState(ServerSettings(**settings))
    state.attach(model, engine)
    server = ServerThread(state).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def server(tiny_loaded, tiny_engine):  # noqa: F811
    with served(tiny_loaded, tiny_engine) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    return ollama.Client(host=server.url, timeout=60)


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=60) as session:
        yield session


def assert_metrics(reply, n_decoded: int | None = None) -> None:
    """Counts and durations: positive integers in nanoseconds that add up to at most the total."""
    durations = [reply.total_duration, reply.load_duration, reply.prompt_eval_duration, reply.eval_duration]
    assert all(isinstance(value, int) and value > 0 for value in durations), reply
    assert reply.prompt_eval_duration + reply.eval_duration + reply.load_duration == reply.total_duration
    assert reply.prompt_eval_count > 0 and reply.eval_count > 0
    if n_decoded is not None:
        assert reply.eval_count == n_decoded


def ndjson(response: httpx.Response) -> list[dict]:
    assert response.headers["content-type"].startswith("application/x-ndjson"), response.text
    return [json.loads(line) for line in response.text.splitlines() if line]


# -- generation on the tiny model ---------------------------------------------------------------

def test_chat_streamed_and_not_agree_with_v1_chat_completions(client, http):
    whole = client.chat(model="any", messages=USER, options=GREEDY)
    assert whole.done and whole.done_reason == "length" and whole.message.role == "assistant"
    assert_metrics(whole, n_decoded=12)
    parts = list(client.chat(model="any", messages=USER, options=GREEDY, stream=True))
    assert [part.done for part in parts] == [False] * (len(parts) - 1) + [True]
    assert "".join(part.message.content for part in parts) == whole.message.content
    assert parts[-1].message.content == "" and parts[-1].done_reason == "length"
    assert_metrics(parts[-1], n_decoded=12)
    openai = http.post("/v1/chat/completions", json={"messages": USER, "temperature": 0, "max_tokens": 12,
                                                     "ignore_eos": True}).json()
    assert openai["choices"][0]["message"]["content"] == whole.message.content
    assert whole.model == openai["model"]  # the served model answers whatever `model` names


def test_stream_is_the_default(http):
    lines = ndjson(http.post("/api/chat", json={"model": "m", "messages": USER, "options": {"num_predict": 3}}))
    assert len(lines) >= 2 and lines[-1]["done"] is True and not any(line["done"] for line in lines[:-1])
    assert all(set(line["message"]) == {"role", "content"} for line in lines)
    lines = ndjson(http.post("/api/generate", json={"prompt": "the", "options": {"num_predict": 3}}))
    assert lines[-1]["done"] is True and all("response" in line for line in lines)


def test_generate_is_a_chat_turn(client):
    system = "You are terse."
    chat = client.chat(model="m", messages=[{"role": "system", "content": system}, *USER], options=GREEDY)
    generated = client.generate(model="m", prompt=USER[0]["content"], system=system, options=GREEDY)
    assert generated.response == chat.message.content and generated.context is None
    assert_metrics(generated, n_decoded=12)
    streamed = list(client.generate(model="m", prompt=USER[0]["content"], system=system, options=GREEDY, stream=True))
    assert "".join(part.response for part in streamed) == chat.message.content and streamed[-1].done
    without_system = client.generate(model="m", prompt=USER[0]["content"], options=GREEDY)
    assert without_system.response == client.chat(model="m", messages=USER, options=GREEDY).message.content


def test_raw_generate_is_completion_and_its_context_continues(client, http):
    native = http.post("/completion", json={"prompt": "in the", "n_predict": 8, "temperature": 0, "ignore_eos": True,
                                            "return_tokens": True}).json()
    raw = client.generate(model="m", prompt="in the", raw=True, options={**GREEDY, "num_predict": 8})
    assert raw.response == native["content"] and raw.done_reason == "length"
    prompt_tokens = http.post("/tokenize", json={"content": "in the", "add_special": True}).json()["tokens"]
    assert list(raw.context) == prompt_tokens + native["tokens"]
    streamed = list(client.generate(model="m", prompt="in the", raw=True, options={**GREEDY, "num_predict": 8},
                                    stream=True))
    assert "".join(p.response for p in streamed) == raw.response and streamed[-1].context == raw.context
    follow = client.generate(model="m", prompt=" a", raw=True, context=raw.context, options=GREEDY)
    expected = http.post("/completion", json={"prompt": [*raw.context, " a"], "n_predict": 12, "temperature": 0,
                                              "ignore_eos": True}).json()
    assert follow.response == expected["content"]


def test_empty_prompt_is_the_load_call(client):
    for keep_alive in (None, 0, "5m"):
        loaded = client.generate(model="m", prompt="", keep_alive=keep_alive)
        assert (loaded.done, loaded.done_reason, loaded.response) == (True, "load", "")
    chat = client.chat(model="m", messages=[])
    assert chat.done and chat.done_reason == "load" and chat.message.content == ""


def test_options_reach_the_sampler(client):
    def reply(**options):
        return client.chat(model="m", messages=USER, options={"num_predict": 16, "ignore_eos": True, **options})

    greedy = reply(temperature=0).message.content
    assert reply(temperature=1.0, top_k=1, seed=5).message.content == greedy  # top_k 1 is greedy
    sampled = [reply(temperature=1.5, seed=seed).message.content for seed in (1, 1, 2)]
    assert sampled[0] == sampled[1] != sampled[2]
    stop = next(char for char in greedy[1:] if char != "\ufffd")
    stopped = reply(temperature=0, stop=[stop])
    assert stopped.done_reason == "stop" and stopped.message.content == greedy[:greedy.index(stop)]
    cut = reply(temperature=0, num_predict=5)
    assert cut.done_reason == "length" and cut.eval_count == 5


def test_num_ctx_must_fit_a_slot(client, tiny_engine):  # noqa: F811
    assert client.chat(model="m", messages=USER, options={"num_ctx": tiny_engine.n_ctx_slot, "num_predict": 2}).done
    with pytest.raises(ollama.ResponseError) as error:
        client.chat(model="m", messages=USER, options={"num_ctx": tiny_engine.n_ctx_slot + 1})
    assert error.value.status_code == 400 and f"slot's context of {tiny_engine.n_ctx_slot}" in error.value.error


def test_unknown_and_load_time_options_are_accepted_and_logged(client, caplog):
    with caplog.at_level(logging.INFO, logger="lamplight.server"):
        reply = client.chat(model="m", messages=USER, options={"num_predict": 2, "tfs_z": 1.0, "banana": 3,
                                                                "num_gpu": 1, "num_thread": 2})
    assert reply.done and reply.eval_count <= 2
    logged = " ".join(record.getMessage() for record in caplog.records)
    assert "unknown to lamplight: tfs_z, banana" in logged and "fixed by the serve flags: num_gpu, num_thread" in logged


@pytest.mark.parametrize("value", [0, -1, 300, 1.5, "5m", "1h30m", "0", "-1s", "300ms", "2.5h"])
def test_keep_alive_values_are_accepted(client, value):
    assert client.chat(model="m", messages=USER, options={"num_predict": 1}, keep_alive=value).done


BAD_REQUESTS = [
    ("/api/chat", {"messages": USER, "keep_alive": "5 minutes"}, "keep_alive"),
    ("/api/chat", {"messages": USER, "keep_alive": ""}, "keep_alive"),
    ("/api/chat", {"messages": USER, "keep_alive": "10"}, "keep_alive"),
    ("/api/chat", {"messages": USER, "keep_alive": True}, "keep_alive"),
    ("/api/chat", {"messages": USER, "keep_alive": [1]}, "keep_alive"),
    ("/api/chat", {"messages": "hi"}, "messages"),
    ("/api/chat", {"messages": ["hi"]}, "messages[0] must be an object"),
    ("/api/chat", {"messages": [{"role": "wizard", "content": "x"}]}, "unknown role 'wizard'"),
    ("/api/chat", {"messages": [{"content": "x"}]}, "missing 'role'"),
    ("/api/chat", {"messages": [{"role": "user", "content": 5}]}, "messages[0].content must be a string"),
    ("/api/chat", {"messages": [{"role": "user", "content": "x", "images": [5]}]}, "base64 strings"),
    ("/api/chat", {"messages": [{"role": "assistant", "tool_calls": [{"function": {"arguments": {}}}]}]}, "'name'"),
    ("/api/chat", {"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "x"}}]}]},
     "arguments must be an object"),
    ("/api/chat", {"messages": USER, "options": [1]}, "options"),
    ("/api/chat", {"messages": USER, "options": {"temperature": "hot"}}, "temperature"),
    ("/api/chat", {"messages": USER, "options": {"top_p": 2}}, "top_p"),
    ("/api/chat", {"messages": USER, "options": {"num_predict": "x"}}, "num_predict"),
    ("/api/chat", {"messages": USER, "options": {"num_predict": -3}}, "num_predict"),
    ("/api/chat", {"messages": USER, "options": {"stop": 5}}, "stop"),
    ("/api/chat", {"messages": USER, "options": {"mirostat": 7}}, "mirostat"),
    ("/api/chat", {"messages": USER, "format": "xml"}, "format"),
    ("/api/chat", {"messages": USER, "format": {"type": "object"}, "tools": TINY_TOOLS}, "'format' cannot be combined"),
    ("/api/chat", {"messages": USER, "think": "extreme"}, "think"),
    ("/api/chat", {"messages": USER, "think": True}, "does not support thinking"),
    ("/api/chat", {"messages": USER, "logprobs": True}, "logprobs"),
    ("/api/chat", {"messages": USER, "stream": "yes"}, "stream"),
    ("/api/chat", {"messages": USER, "model": 5}, "model"),
    ("/api/generate", {"prompt": 5}, "prompt"),
    ("/api/generate", {"prompt": "x", "template": "{{ .Prompt }}"}, "chat template of the GGUF"),
    ("/api/generate", {"prompt": "x", "raw": True, "system": "s"}, "system"),
    ("/api/generate", {"prompt": "x", "raw": True, "think": True}, "think"),
    ("/api/generate", {"prompt": "x", "context": [1, 2]}, "only accepted with raw: true"),
    ("/api/generate", {"prompt": "x", "raw": True, "context": ["a"]}, "context"),
    ("/api/generate", {"prompt": "x", "raw": True, "context": [10**6]}, "out of range"),
    ("/api/generate", {"prompt": "x", "suffix": "y"}, "Infill is not supported by this model"),
    ("/api/generate", {"prompt": "x", "images": ["iVBORw0KGgo="]}, "multimodal projector"),
    ("/api/generate", {"prompt": "x", "raw": True, "images": ["iVBORw0KGgo="]}, "multimodal projector"),
    ("/api/show", {"model": 5}, "model"),
    ("/api/pull", {"model": "llama3.2"}, "Hugging Face Hub"),
    ("/api/pull", {}, "model"),
]


@pytest.mark.parametrize("path, body, message", BAD_REQUESTS)
def test_bad_requests_are_400_in_ollama_shape(http, path, body, message):
    response = http.post(path, json=body)
    assert response.status_code == 400, response.text
    assert list(response.json()) == ["error"] and message in response.json()["error"], response.text


def test_errors_reach_the_official_client_and_the_server_keeps_serving(client):
    with pytest.raises(ollama.ResponseError) as error:
        client.chat(model="m", messages=[{"role": "wizard", "content": "x"}])
    assert error.value.status_code == 400 and "unknown role" in error.value.error
    with pytest.raises(ollama.ResponseError) as error:
        list(client.chat(model="m", messages=USER, options={"temperature": "hot"}, stream=True))
    assert error.value.status_code == 400
    for call in (lambda: client.embed(model="m", input="x"), lambda: client.embeddings(model="m", prompt="x")):
        with pytest.raises(ollama.ResponseError) as error:
            call()
        assert error.value.status_code == 501 and "--embeddings" in error.value.error  # not started for them
    for call in (lambda: client.copy("a", "b"), lambda: client.delete("m"), lambda: client.push("m")):
        with pytest.raises(ollama.ResponseError) as error:
            call()
        assert error.value.status_code == 501 and "not supported" in error.value.error
    assert client.chat(model="m", messages=USER, options={"num_predict": 2}).done


def test_format_json_and_schema(client):
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9},
                                               "unit": {"enum": ["c", "f"]}},
              "required": ["n", "unit"], "additionalProperties": False}
    for stream in (False, True):
        parts = client.chat(model="m", messages=USER, format=schema, options={"num_predict": 200, "seed": 3},
                            stream=stream)
        parts = list(parts) if stream else [parts]
        assert parts[-1].done_reason == "stop"
        jsonschema.validate(json.loads("".join(p.message.content for p in parts)), schema)
    generated = client.generate(model="m", prompt="JSON:", format=schema, options={"num_predict": 200, "seed": 4})
    jsonschema.validate(json.loads(generated.response), schema)
    raw = client.generate(model="m", prompt="JSON:", raw=True, format=schema, options={"num_predict": 200, "seed": 4})
    jsonschema.validate(json.loads(raw.response), schema)
    anything = client.chat(model="m", messages=USER, format="json", options={"num_predict": 60, "seed": 1})
    assert anything.message.content.startswith("{")
    if anything.done_reason == "stop":  # an open-ended object may outrun any budget
        assert isinstance(json.loads(anything.message.content), dict)


def test_tags_show_ps_and_version(client, http, tiny_loaded, tiny_engine):  # noqa: F811
    listed = client.list().models
    size = os.path.getsize(tiny_loaded.path)
    assert [(m.model, m.size, m.details.format, m.details.family) for m in listed] == \
        [(tiny_loaded.name, size, "gguf", "llama")]
    assert len(listed[0].digest) == 64 and listed[0].modified_at is not None
    shown = client.show("whatever")
    assert shown.template == tiny_loaded.chat_template.source and shown.capabilities == ["completion"]
    metadata = tiny_loaded.gguf.metadata
    assert shown.modelinfo["general.architecture"] == "llama"
    assert shown.modelinfo["llama.context_length"] == metadata["llama.context_length"]
    assert shown.modelinfo["general.parameter_count"] > 0 and "tokenizer.ggml.tokens" not in shown.modelinfo
    assert f"num_ctx              {tiny_engine.n_ctx_slot}" in shown.parameters and "FROM " in shown.modelfile
    running = client.ps().models
    assert [(m.model, m.size, m.size_vram, m.expires_at.year) for m in running] == [(tiny_loaded.name, size, 0, 9999)]
    assert http.get("/api/version").json() == {"version": lamplight.__version__}


def test_root_keeps_the_chat_page_or_answers_the_probe(http, tiny_loaded, tiny_engine):  # noqa: F811
    page = http.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert http.head("/").status_code == 200
    with served(tiny_loaded, tiny_engine, webui=False) as bare, httpx.Client(base_url=bare.url) as probe:
        assert probe.get("/").text == "Ollama is running" and probe.head("/").status_code == 200


def test_every_layer_refuses_in_ollama_shape(tiny_loaded, tiny_engine):  # noqa: F811
    limits = RequestLimits(max_body_bytes=2000)
    with served(tiny_loaded, tiny_engine, api_keys=("sesame",), limits=limits) as locked:
        with httpx.Client(base_url=locked.url) as http:
            refused = http.post("/api/chat", json={"messages": USER})
            assert (refused.status_code, refused.json()) == (401, {"error": "Invalid API Key"})
            key = {"Authorization": "Bearer sesame"}
            big = http.post("/api/chat", headers=key, json={"messages": [{"role": "user", "content": "x" * 3000}]})
            assert big.status_code == 413 and list(big.json()) == ["error"]
            broken = http.post("/api/chat", headers={**key, "Content-Type": "application/json"}, content=b"{")
            assert broken.status_code == 400 and list(broken.json()) == ["error"]
            assert http.get("/api/nowhere", headers=key).json() == {"error": "File Not Found"}
        assert ollama.Client(host=locked.url, headers={"Authorization": "Bearer sesame"}).chat(
            model="m", messages=USER, options={"num_predict": 1}).done


def test_infill_with_suffix(tiny_loaded, tiny_engine):  # noqa: F811
    model = copy.copy(tiny_loaded)
    tokenizer = model.tokenizer = copy.copy(tiny_loaded.tokenizer)
    tokenizer.fim_prefix_id, tokenizer.fim_suffix_id, tokenizer.fim_middle_id = FIM.prefix, FIM.suffix, FIM.middle
    with served(model, tiny_engine) as fim, httpx.Client(base_url=fim.url, timeout=60) as http:
        client = ollama.Client(host=fim.url)
        assert "insert" in client.show("m").capabilities
        reply = client.generate(model="m", prompt="def f(", suffix="):", options=GREEDY)
        infill = http.post("/infill", json={"input_prefix": "def f(", "input_suffix": "):", "n_predict": 12,
                                            "temperature": 0, "ignore_eos": True}).json()
        assert reply.response == infill["content"] and reply.context is None and reply.done_reason == "length"


# -- pull --------------------------------------------------------------------------------------

@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    return constants


def test_pull_offline_fails_fast_with_the_cause(client, http, hub_cache, monkeypatch):
    monkeypatch.setattr(hub_cache, "HF_HUB_OFFLINE", True)
    with pytest.raises(ollama.ResponseError) as error:
        list(client.pull("hf.co/tester/Missing-GGUF:Q8_0", stream=True))
    assert "not in the Hugging Face cache and HF_HUB_OFFLINE is set" in error.value.error
    refused = http.post("/api/pull", json={"model": "tester/Missing-GGUF", "stream": False})
    assert refused.status_code == 400 and "HF_HUB_OFFLINE" in refused.json()["error"]


def test_pull_downloads_into_the_cache_without_swapping(client, tiny_loaded, hub_cache, monkeypatch):  # noqa: F811
    data = open(tiny_loaded.path, "rb").read()
    with FakeHub({"tester/Tiny-GGUF": FakeRepo({"tiny-Q8_0.gguf": data, "tiny-Q4_K_M.gguf": data})}) as hub:
        monkeypatch.setattr(hub_cache, "ENDPOINT", hub.url)
        monkeypatch.setattr(hub_cache, "HUGGINGFACE_CO_URL_TEMPLATE",
                            hub.url + "/{repo_id}/resolve/{revision}/{filename}")
        statuses = [part.status for part in client.pull("hf.co/tester/Tiny-GGUF:Q8_0", stream=True)]
        again = client.pull("tester/Tiny-GGUF:latest")  # cached now; :latest is the default quant
    assert statuses[0] == "pulling manifest" and statuses[-1] == "success"
    assert any(status.startswith("downloading tester/Tiny-GGUF/tiny-Q8_0.gguf") for status in statuses)
    note = statuses[-2]
    assert "not loaded: this server keeps serving" in note and "lamplight serve -hf tester/Tiny-GGUF:Q8_0" in note
    downloaded = note.split("downloaded ")[1].split(" into")[0]
    assert open(downloaded, "rb").read() == data and downloaded.startswith(hub_cache.HF_HUB_CACHE)
    assert again.status == "success"
    assert [m.model for m in client.list().models] == [tiny_loaded.name]


# -- scripted replies: tool calls, thinking, a failure mid-stream ------------------------------

REAL_TEMPLATES = {"qwen3": "Qwen-Qwen3-0.6B.jinja", "mistral": "mistralai-Mistral-Nemo-Instruct-2407.jinja"}
PICK_CALL = '<tool_call>\n{"name": "pick", "arguments": {"n": 1, "unit": "c"}}\n</tool_call>'


@pytest.fixture(scope="module")
def scripted(tiny_loaded):  # noqa: F811
    engine = ScriptedEngine()
    sources = {"hermes": HERMES_TEMPLATE, "thinking": THINKING_TEMPLATE}
    for name, file in REAL_TEMPLATES.items():
        if (reference_dir() / "templates" / file).is_file():
            sources[name] = (reference_dir() / "templates" / file).read_text(encoding="utf-8")
    servers = {}
    for name, source in sources.items():
        model = copy.copy(tiny_loaded)
        model.chat_template = ChatTemplate(source)
        state = ServerState(ServerSettings())
        state.attach(model, engine)
        servers[name] = ServerThread(state).start()
    yield engine, {name: ollama.Client(host=server.url, timeout=30) for name, server in servers.items()}
    for server in servers.values():
        server.stop()


def client_for(scripted, name: str) -> ollama.Client:
    if name not in scripted[1]:
        pytest.skip(f"reference template for {name} is not present under {reference_dir()}")
    return scripted[1][name]


def last_prompt(engine, tokenizer) -> str:
    return tokenizer.decode(engine.requests[-1].prompt_tokens, special=True)


def test_tool_call_round_trip(scripted, tiny_loaded):  # noqa: F811
    engine, clients = scripted
    client = clients["hermes"]
    engine.script = script(PICK_CALL, stop_type="eos")
    reply = client.chat(model="m", messages=USER, tools=TINY_TOOLS)
    assert reply.done_reason == "stop" and reply.message.content == ""
    calls = [(call.function.name, call.function.arguments) for call in reply.message.tool_calls]
    assert calls == [("pick", {"n": 1, "unit": "c"})]
    assert '"name": "pick"' in last_prompt(engine, tiny_loaded.tokenizer)  # the tools were in the prompt

    engine.script = script(PICK_CALL, stop_type="eos", piece=4)
    parts = list(client.chat(model="m", messages=USER, tools=TINY_TOOLS, stream=True))
    with_calls = [part for part in parts if part.message.tool_calls]
    assert len(with_calls) == 1 and not with_calls[0].done and parts[-1].done and parts[-1].done_reason == "stop"
    assert with_calls[0].message.tool_calls == reply.message.tool_calls
    assert "".join(part.message.content for part in parts) == ""

    engine.script = script("It is 21 degrees.", stop_type="eos")
    history = [*USER, reply.message, {"role": "tool", "content": "21", "tool_name": "pick"}]
    answer = client.chat(model="m", messages=history, tools=TINY_TOOLS)
    assert answer.message.content == "It is 21 degrees." and not answer.message.tool_calls
    prompt = last_prompt(engine, tiny_loaded.tokenizer)
    assert prompt.endswith('<|im_start|>assistant<tool_call>\n{"name": "pick", "arguments": {"n": 1, "unit": "c"}}\n'
                           '</tool_call><|im_end|><|im_start|>user\n<tool_response>\n21\n</tool_response><|im_end|>'
                           '<|im_start|>assistant\n')


def test_tool_results_get_the_ids_templates_render(scripted, tiny_loaded):  # noqa: F811
    engine, _ = scripted
    client = client_for(scripted, "mistral")
    engine.script = script("Done.", stop_type="eos")
    calls = [{"function": {"name": "pick", "arguments": {"n": 1, "unit": "c"}}},
             {"function": {"name": "flag", "arguments": {"on": True}}}]
    history = [*USER, {"role": "assistant", "content": "", "tool_calls": calls},
               {"role": "tool", "content": "yes", "tool_name": "flag"},
               {"role": "tool", "content": "1", "tool_name": "pick"}]
    assert client.chat(model="m", messages=history, tools=TINY_TOOLS).message.content == "Done."
    prompt = last_prompt(engine, tiny_loaded.tokenizer)
    assert '"id": "call00000"' in prompt and '"id": "call00001"' in prompt  # nine characters, as Mistral's wants
    # Each result answers the call of its tool, in the template's own (unquoted) rendering.
    assert prompt.endswith('[TOOL_RESULTS]{"content": yes, "call_id": "call00001"}[/TOOL_RESULTS]'
                           '[TOOL_RESULTS]{"content": 1, "call_id": "call00000"}[/TOOL_RESULTS]')


def test_thinking_comes_back_as_thinking(scripted):
    engine, clients = scripted
    client = clients["thinking"]
    engine.script = script("<think>Count the letters.</think>Five.", stop_type="eos", piece=3)
    reply = client.chat(model="m", messages=USER)
    assert (reply.message.thinking, reply.message.content) == ("Count the letters.", "Five.")
    parts = list(client.chat(model="m", messages=USER, think=True, stream=True))
    assert "".join(p.message.thinking or "" for p in parts) == "Count the letters."
    assert "".join(p.message.content for p in parts) == "Five."
    generated = client.generate(model="m", prompt="hello", think=True)
    assert (generated.thinking, generated.response) == ("Count the letters.", "Five.")


def test_think_switches_and_levels(scripted, tiny_loaded):  # noqa: F811
    engine, clients = scripted
    client = clients["thinking"]
    engine.script = script("Five.", stop_type="eos")
    assert client.chat(model="m", messages=USER, think=False).message.content == "Five."
    assert last_prompt(engine, tiny_loaded.tokenizer).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert engine.requests[-1].reasoning_budget.budget == 0
    for level, budget in THINK_BUDGETS.items():
        client.chat(model="m", messages=USER, think=level)
        spec = engine.requests[-1].reasoning_budget  # None: thinking unlimited
        assert (spec.budget if spec is not None else -1) == budget
        assert last_prompt(engine, tiny_loaded.tokenizer).endswith("<|im_start|>assistant\n")


def test_think_with_qwen3s_template(scripted, tiny_loaded):  # noqa: F811
    engine, _ = scripted
    client = client_for(scripted, "qwen3")
    engine.script = script("<think>\nShort.\n</think>\n\nHello!", stop_type="eos")
    reply = client.chat(model="m", messages=USER, think=True)
    assert (reply.message.thinking, reply.message.content) == ("Short.", "Hello!")
    assert "thinking" in client.show("m").capabilities and "tools" in client.show("m").capabilities
    engine.script = script("Hello!", stop_type="eos")
    assert client.chat(model="m", messages=USER, think=False).message.content == "Hello!"
    assert last_prompt(engine, tiny_loaded.tokenizer).endswith("<think>\n\n</think>\n\n")


def test_a_failure_mid_stream_is_a_last_error_line(scripted):
    engine, clients = scripted
    engine.script = [TokenEvent(choice=0, token_id=100, text="Fi", n_decoded=1),
                     ErrorEvent(choice=0, message="the engine failed", code=500)]
    with pytest.raises(ollama.ResponseError) as error:
        list(clients["hermes"].chat(model="m", messages=USER, stream=True))
    assert error.value.error == "the engine failed"
    engine.script = script("Fine.", stop_type="eos")
    assert clients["hermes"].chat(model="m", messages=USER).message.content == "Fine."


def test_keep_alive_is_told_to_the_router_in_seconds(http):
    """In router mode the router sets the model's unload timer from this header (lamplight/router)."""
    for keep_alive, seconds in (("5m", "300"), ("1h30m", "5400"), (0, "0"), (-1, "-1"), ("-1s", "-1")):
        answer = http.post("/api/chat", json={"model": "m", "messages": USER, "stream": False, "keep_alive": keep_alive,
                                              "options": {"num_predict": 1}})
        assert answer.status_code == 200 and answer.headers["x-lamplight-unload-after"] == seconds, keep_alive
    plain = http.post("/api/generate", json={"model": "m", "prompt": "hi", "stream": False, "options": {"num_predict": 1}})
    assert "x-lamplight-unload-after" not in plain.headers
    streamed = http.post("/api/generate", json={"model": "m", "prompt": "hi", "keep_alive": "2s", "options": {"num_predict": 1}})
    assert streamed.headers["x-lamplight-unload-after"] == "2"
