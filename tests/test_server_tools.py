"""Tool calling over HTTP. The tiny random model covers the native (Hermes) path, the generic
path, streaming and errors; SmolLM2 (real_model) answers the official openai client with calls
whose arguments validate against the tool's schema."""

from __future__ import annotations

import copy
import json

import httpx
import jsonschema
import openai
import pytest
from test_server_support import ServerThread, sse_events
from tiny_gguf import write_tiny_llama

import lamplight
from lamplight.chat import ChatTemplate
from lamplight.server import ServerSettings, ServerState
from lamplight.server.launcher import EngineOptions, build_engine

# A Hermes/Qwen-style template: tools in the system turn, calls as <tool_call> blocks.
HERMES_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nYou may call these tools:\n"
    "{%- for tool in tools %}\n{{ tool.function | tojson }}{% endfor %}\n"
    'Answer with <tool_call>\n{"name": <name>, "arguments": <args>}\n</tool_call><|im_end|>\n{% endif %}'
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant\n"
    "{%- for c in m.tool_calls %}<tool_call>\n{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}"
    "\n</tool_call>{% endfor %}<|im_end|>\n"
    "{%- elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{%- endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Small, bounded arguments: a random-weight model must finish them within max_tokens.
DIGIT = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9},
                                          "unit": {"enum": ["c", "f"]}}, "required": ["n", "unit"]}
TINY_TOOLS = [
    {"type": "function", "function": {"name": "pick", "description": "Pick a digit", "parameters": DIGIT}},
    {"type": "function", "function": {"name": "flag", "parameters": {
        "type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"]}}},
]
CHAT = [{"role": "user", "content": "Pick a digit."}]


@pytest.fixture(scope="module")
def tiny_loaded(tmp_path_factory):
    return lamplight.load(str(write_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny.gguf", n_ctx=2048)))


@pytest.fixture(scope="module")
def tiny_engine(tiny_loaded):
    engine = build_engine(tiny_loaded, EngineOptions(n_ctx=2048, n_parallel=2, n_ubatch=64))
    yield engine
    engine.stop()


def serve(loaded, engine, template_source: str | None = None) -> ServerThread:
    if template_source is not None:
        loaded = copy.copy(loaded)
        loaded.chat_template = ChatTemplate(template_source)
    state = ServerState(ServerSettings())
    state.attach(loaded, engine)
    return ServerThread(state).start()


@pytest.fixture(scope="module")
def hermes(tiny_loaded, tiny_engine):
    server = serve(tiny_loaded, tiny_engine, HERMES_TEMPLATE)
    with httpx.Client(base_url=server.url, timeout=120) as client:
        yield client
    server.stop()


@pytest.fixture(scope="module")
def chatml(tiny_loaded, tiny_engine):
    """The tiny model's own template, which does not render tools: the generic protocol."""
    server = serve(tiny_loaded, tiny_engine)
    with httpx.Client(base_url=server.url, timeout=120) as client:
        yield client
    server.stop()


def tool_request(**extra) -> dict:
    return {"messages": CHAT, "tools": TINY_TOOLS, "max_tokens": 400, "temperature": 1.0, "seed": 3, **extra}


def check_calls(message: dict, names: set[str]) -> None:
    assert message["tool_calls"], message
    by_name = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TINY_TOOLS}
    for call in message["tool_calls"]:
        assert call["type"] == "function" and len(call["id"]) == 32 and call["id"].isalnum()
        assert call["function"]["name"] in names
        jsonschema.validate(json.loads(call["function"]["arguments"]), by_name[call["function"]["name"]])


def reassemble_stream(events: list) -> tuple[str, list[dict], str]:
    content, calls, finish = "", {}, None
    for event in events:
        if event == "[DONE]" or not event["choices"]:
            continue
        choice = event["choices"][0]
        finish = choice["finish_reason"] or finish
        delta = choice["delta"]
        content += delta.get("content") or ""
        for fragment in delta.get("tool_calls") or []:
            call = calls.setdefault(fragment["index"], {"id": fragment.get("id"), "name": "", "arguments": ""})
            call["name"] += fragment["function"].get("name", "")
            call["arguments"] += fragment["function"]["arguments"]
    return content, [calls[i] for i in sorted(calls)], finish


# -- native format (Hermes template) on the tiny model --------------------------------------------

def test_hermes_template_renders_the_tools(hermes):
    prompt = hermes.post("/apply-template", json=tool_request()).json()["prompt"]
    assert prompt.startswith("<|im_start|>system\nYou may call these tools:")
    assert '"name": "pick"' in prompt and "You can call the following tools" not in prompt


def test_hermes_required_is_a_call_from_the_first_token(hermes):
    body = hermes.post("/v1/chat/completions", json=tool_request(tool_choice="required")).json()
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls", body
    assert choice["message"]["content"] is None
    check_calls(choice["message"], {"pick", "flag"})


def test_hermes_named_function_and_single_call(hermes):
    body = hermes.post("/v1/chat/completions", json=tool_request(
        tool_choice={"type": "function", "function": {"name": "flag"}}, parallel_tool_calls=False)).json()
    message = body["choices"][0]["message"]
    check_calls(message, {"flag"})
    assert len(message["tool_calls"]) == 1 and body["choices"][0]["finish_reason"] == "tool_calls"


def test_hermes_stream_reassembles_to_the_non_stream_answer(hermes):
    request = tool_request(tool_choice="required", seed=11)
    whole = hermes.post("/v1/chat/completions", json=request).json()["choices"][0]
    events = sse_events(hermes.post("/v1/chat/completions", json={**request, "stream": True}).text)
    content, calls, finish = reassemble_stream(events)
    assert finish == whole["finish_reason"] == "tool_calls"
    assert content == ""
    assert [(c["name"], c["arguments"]) for c in calls] == [
        (c["function"]["name"], c["function"]["arguments"]) for c in whole["message"]["tool_calls"]]
    first = next(e for e in events if e != "[DONE]" and e["choices"] and e["choices"][0]["delta"].get("tool_calls"))
    fragment = first["choices"][0]["delta"]["tool_calls"][0]
    assert fragment["function"]["arguments"] == "" and fragment["type"] == "function" and fragment["index"] == 0
    assert len({e["id"] for e in events if e != "[DONE]"}) == 1


def test_hermes_auto_answers_text_until_the_trigger(hermes):
    """auto: the lazy grammar leaves plain text alone (the random model does not write the
    trigger; the switch itself is tested in test_tools.py)."""
    body = hermes.post("/v1/chat/completions", json=tool_request(max_tokens=8, seed=5)).json()
    message = body["choices"][0]["message"]
    assert isinstance(message["content"], str) and "tool_calls" not in message
    assert body["choices"][0]["finish_reason"] in ("stop", "length")


def test_hermes_follow_up_conversation_renders(hermes):
    conversation = CHAT + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "abc", "type": "function", "function": {"name": "pick", "arguments": '{"n": 4, "unit": "c"}'}}]},
        {"role": "tool", "tool_call_id": "abc", "content": "four degrees"},
    ]
    prompt = hermes.post("/apply-template", json=tool_request(messages=conversation)).json()["prompt"]
    assert '<tool_call>\n{"name": "pick", "arguments": {"n": 4, "unit": "c"}}\n</tool_call>' in prompt
    assert "<tool_response>\nfour degrees\n</tool_response>" in prompt
    body = hermes.post("/v1/chat/completions", json=tool_request(messages=conversation, tool_choice="required")).json()
    check_calls(body["choices"][0]["message"], {"pick", "flag"})


# -- generic protocol on the tiny model ------------------------------------------------------------

def test_generic_protocol_over_http(chatml, tiny_loaded):
    # /apply-template renders the template as llama.cpp does: ChatML has no tool text ...
    prompt = chatml.post("/apply-template", json=tool_request()).json()["prompt"]
    assert "You can call the following tools" not in prompt
    # ... the generic protocol's instruction is added to the prompt of a generation only.
    from lamplight.server.chat_prompt import render_chat_prompt

    assert render_chat_prompt(tool_request(), tiny_loaded.chat_template).startswith("<|im_start|>system\nYou can call the following tools")
    body = chatml.post("/v1/chat/completions", json=tool_request(
        tool_choice={"type": "function", "function": {"name": "pick"}})).json()
    check_calls(body["choices"][0]["message"], {"pick"})
    assert body["choices"][0]["finish_reason"] == "tool_calls"


@pytest.mark.parametrize("stream", [False, True])
def test_calls_cut_by_max_tokens_come_back_as_calls(chatml, stream):
    """The generic grammar forces `{"tool_calls": [...]}`; cut two tokens before its end, the
    answer holds the calls finished by then (a prefix of the uncut answer's), never the JSON."""
    request = tool_request(tool_choice="required", seed=7)
    whole = chatml.post("/v1/chat/completions", json=request).json()
    assert whole["choices"][0]["finish_reason"] == "tool_calls"
    uncut = [(c["function"]["name"], c["function"]["arguments"]) for c in whole["choices"][0]["message"]["tool_calls"]]
    cut_request = {**request, "max_tokens": whole["usage"]["completion_tokens"] - 2, "stream": stream}
    response = chatml.post("/v1/chat/completions", json=cut_request)
    if stream:
        content, streamed, finish = reassemble_stream(sse_events(response.text))
        calls = [(c["name"], c["arguments"]) for c in streamed]
        calls = calls[:-1] if calls and calls[-1] not in uncut else calls  # the cut one's fragments went out
    else:
        choice = response.json()["choices"][0]
        content, finish = choice["message"]["content"], choice["finish_reason"]
        calls = [(c["function"]["name"], c["function"]["arguments"]) for c in choice["message"].get("tool_calls", [])]
    assert finish == "length"
    assert not content, content
    assert calls and calls == uncut[:len(calls)]  # this seed's cut falls after the first call's end


def test_tool_choice_none_neither_constrains_nor_parses(chatml):
    body = chatml.post("/v1/chat/completions", json=tool_request(tool_choice="none", max_tokens=4)).json()
    assert "tool_calls" not in body["choices"][0]["message"]
    prompt = chatml.post("/apply-template", json=tool_request(tool_choice="none")).json()["prompt"]
    assert "You can call the following tools" not in prompt


def test_stream_with_logprobs_and_tools(chatml):
    events = sse_events(chatml.post("/v1/chat/completions", json=tool_request(
        tool_choice="required", stream=True, logprobs=True, top_logprobs=2)).text)
    chunks = [e for e in events if e != "[DONE]" and e["choices"]]
    with_probs = [c for c in chunks if c["choices"][0].get("logprobs")]
    final = next(c for c in chunks if c["choices"][0]["finish_reason"])
    assert final["choices"][0]["finish_reason"] == "tool_calls"
    n_tokens = sum(len(c["choices"][0]["logprobs"]["content"]) for c in with_probs)
    assert n_tokens == final["timings"]["predicted_n"]
    _, calls, _ = reassemble_stream(events)
    assert calls and all(json.loads(c["arguments"]) for c in calls)


@pytest.mark.parametrize("extra, message_part", [
    ({"grammar": 'root ::= "x"'}, "Cannot use custom grammar constraints with tools."),
    ({"json_schema": {"type": "object"}}, "Cannot use json_schema with tools."),
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "not among the tools"),
    ({"tool_choice": "sometimes"}, "Invalid tool_choice"),
])
def test_tool_request_errors(chatml, extra, message_part):
    response = chatml.post("/v1/chat/completions", json=tool_request(**extra))
    assert response.status_code == 400, response.text
    assert message_part in response.json()["error"]["message"]


@pytest.mark.parametrize("server_name", ["hermes", "chatml"])
def test_tool_schema_keywords_the_grammar_cannot_enforce_are_ignored(server_name, request):
    """Agents' tool definitions use keywords llguidance cannot enforce (Claude Code's
    `propertyNames`): as llama.cpp, the call follows the rest of the schema instead of the
    request failing (a request's own json_schema is still refused for them)."""
    client = request.getfixturevalue(server_name)
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["n"], "propertyNames": {"pattern": "^n$"}, "not": {"required": ["m"]}}
    tools = [{"type": "function", "function": {"name": "count", "parameters": schema}}]
    body = client.post("/v1/chat/completions", json=tool_request(tools=tools, tool_choice="required")).json()
    (call,) = body["choices"][0]["message"]["tool_calls"][:1]
    assert call["function"]["name"] == "count"
    jsonschema.validate(json.loads(call["function"]["arguments"]), schema)
    refused = client.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 4, "response_format": {
        "type": "json_schema", "json_schema": {"schema": schema}}})
    assert refused.status_code == 400 and "propertyNames" in refused.text


# -- SmolLM2 with the openai client ---------------------------------------------------------------

WEATHER = {
    "type": "object",
    "properties": {"location": {"type": "string", "description": "City name"},
                   "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["location", "unit"],
}
SMOL_TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Get the current weather in a city",
                                      "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "description": "Get the current time in a city",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                     "required": ["city"]}}},
]
QUESTION = [{"role": "user", "content": "What is the weather like in Paris today?"}]


@pytest.fixture(scope="module")
def smol(smollm2_path):
    loaded = lamplight.load(str(smollm2_path))
    engine = build_engine(loaded, EngineOptions(n_ctx=2048, n_parallel=1))
    server = serve(loaded, engine)
    yield openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=300)
    server.stop()
    engine.stop()


def smol_call(client, **extra):
    return client.chat.completions.create(model="smollm2", messages=extra.pop("messages", QUESTION),
                                          tools=SMOL_TOOLS, max_tokens=96, **extra)


@pytest.mark.real_model
def test_smollm2_required_call_validates(smol):
    response = smol_call(smol, tool_choice="required", temperature=0)
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    schema = {t["function"]["name"]: t["function"]["parameters"] for t in SMOL_TOOLS}[call.function.name]
    jsonschema.validate(json.loads(call.function.arguments), schema)
    assert call.type == "function" and len(call.id) == 32

    # The follow-up turn: the call and its result go back in, the model answers.
    follow_up = QUESTION + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.id, "type": "function",
             "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 18, "sky": "cloudy"}'},
    ]
    answer = smol_call(smol, messages=follow_up, temperature=0)
    assert answer.choices[0].finish_reason in ("stop", "tool_calls", "length")
    message = answer.choices[0].message
    assert message.content or message.tool_calls


@pytest.mark.real_model
def test_smollm2_named_function(smol):
    response = smol_call(smol, tool_choice={"type": "function", "function": {"name": "get_time"}}, temperature=0)
    calls = response.choices[0].message.tool_calls
    assert calls and {c.function.name for c in calls} == {"get_time"}
    assert response.choices[0].finish_reason == "tool_calls"
    for c in calls:
        jsonschema.validate(json.loads(c.function.arguments), SMOL_TOOLS[1]["function"]["parameters"])


@pytest.mark.real_model
def test_smollm2_stream_equals_non_stream(smol):
    request = {"tool_choice": "required", "temperature": 1.0, "seed": 42}
    whole = smol_call(smol, **request).choices[0]
    calls: dict[int, dict] = {}
    finish = None
    for chunk in smol_call(smol, stream=True, **request):
        if not chunk.choices:
            continue
        finish = chunk.choices[0].finish_reason or finish
        for fragment in chunk.choices[0].delta.tool_calls or []:
            call = calls.setdefault(fragment.index, {"name": "", "arguments": "", "id": fragment.id})
            call["name"] += fragment.function.name or ""
            call["arguments"] += fragment.function.arguments or ""
    assert finish == whole.finish_reason == "tool_calls"
    assert [(calls[i]["name"], calls[i]["arguments"]) for i in sorted(calls)] == [
        (c.function.name, c.function.arguments) for c in whole.message.tool_calls]
