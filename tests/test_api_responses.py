"""OpenAI's Responses API (/v1/responses), stateless, through the official openai client: the tiny
random model answers text, JSON-schema output and grammar-forced function calls; a scripted
engine behind Qwen3's template answers thinking and calls word for word and shows the prompt
each request became. Every streamed event and every Response is also validated strictly
against the client's models (the client itself builds them without validation)."""

from __future__ import annotations

import copy
import itertools
import json
import logging

import httpx
import jsonschema
import openai
import pydantic
import pytest
from conftest import missing_reference, reference_dir
from openai.types.responses import Response, ResponseStreamEvent
from openai.types.responses.input_token_count_response import InputTokenCountResponse
from test_server_support import ScriptedEngine, ServerThread, sse_events
from test_server_tools import DIGIT, HERMES_TEMPLATE, tiny_engine, tiny_loaded  # noqa: F401 (fixtures)
from test_tool_cut import PICK_ARGS, script

from lamplight.chat import ChatTemplate
from lamplight.engine.types import ErrorEvent
from lamplight.server import ServerSettings, ServerState
from lamplight.server.api_responses_request import EFFORT_BUDGETS

STREAM_EVENT = pydantic.TypeAdapter(ResponseStreamEvent)
QWEN3 = reference_dir() / "templates" / "Qwen-Qwen3-0.6B.jinja"

# The tools of test_server_tools, as the Responses API writes them.
TOOLS = [
    {"type": "function", "name": "pick", "description": "Pick a digit", "parameters": DIGIT, "strict": True},
    {"type": "function", "name": "flag",
     "parameters": {"type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"]}},
]
SCHEMAS = {tool["name"]: tool["parameters"] for tool in TOOLS}


def serve(loaded, engine, template_source: str | None = None) -> ServerThread:
    if template_source is not None:
        loaded = copy.copy(loaded)
        loaded.chat_template = ChatTemplate(template_source)
    state = ServerState(ServerSettings())
    state.attach(loaded, engine)
    return ServerThread(state).start()


class Api:
    """One server, through the official client and raw HTTP."""

    def __init__(self, server: ServerThread):
        self.server = server
        self.client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=120)
        self.http = httpx.Client(base_url=server.url, timeout=120)

    def raw(self, **body) -> dict:
        """The JSON Response, validated strictly against the client's model."""
        response = self.http.post("/v1/responses", json=body)
        assert response.status_code == 200, response.text
        Response.model_validate(response.json())
        return response.json()

    def events(self, **body) -> list[dict]:
        """The streamed events, each validated strictly, numbered 0, 1, 2 ..."""
        response = self.http.post("/v1/responses", json={**body, "stream": True})
        assert response.status_code == 200, response.text
        assert response.headers["content-type"].startswith("text/event-stream")
        events = sse_events(response.text)
        for event in events:
            STREAM_EVENT.validate_python(event)
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        assert response.text.startswith(f"event: {events[0]['type']}\ndata: ")
        return events

    def close(self) -> None:
        self.http.close()
        self.server.stop()


@pytest.fixture(scope="module")
def chatml(tiny_loaded, tiny_engine):  # noqa: F811
    api = Api(serve(tiny_loaded, tiny_engine))
    yield api
    api.close()


@pytest.fixture(scope="module")
def hermes(tiny_loaded, tiny_engine):  # noqa: F811
    api = Api(serve(tiny_loaded, tiny_engine, HERMES_TEMPLATE))
    yield api
    api.close()


@pytest.fixture(scope="module")
def qwen3(tiny_loaded):  # noqa: F811
    """(api, engine): Qwen3's template (it thinks, and calls tools as Hermes does) on a scripted engine."""
    if not QWEN3.is_file():
        pytest.skip(missing_reference(QWEN3))
    engine = ScriptedEngine()
    api = Api(serve(tiny_loaded, engine, QWEN3.read_text(encoding="utf-8")))
    yield api, engine
    api.close()


def prompt_of(engine: ScriptedEngine, loaded) -> str:
    """The prompt text of the scripted engine's latest request."""
    return loaded.tokenizer.decode(list(engine.requests[-1].prompt_tokens))


def collapsed(events: list[dict]) -> list[str]:
    """The event types with each run of one delta type written once."""
    return [kind for kind, _ in itertools.groupby(e["type"] for e in events)]


def without_ids(item: dict) -> dict:
    """An output item without its ids (new each reply); a reasoning item's text stripped (the chat stream sends
    the newline before `</think>` before it knows the thinking ends there; the JSON answer
    strips it)."""
    item = {k: v for k, v in item.items() if k not in ("id", "call_id")}
    if item["type"] == "reasoning":
        item["content"] = [{**part, "text": part["text"].strip()} for part in item["content"]]
    return item


def joined_deltas(events: list[dict], kind: str) -> str:
    return "".join(e["delta"] for e in events if e["type"] == kind)


# -- text ------------------------------------------------------------------------------------------

def test_text_reply_through_the_official_client(chatml):
    reply = chatml.client.responses.create(model="my-model", input="hello", max_output_tokens=6, temperature=0)
    assert reply.object == "response" and reply.id.startswith("resp_") and reply.model == "my-model"
    [message] = reply.output
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    assert reply.output_text == message.content[0].text and message.content[0].annotations == []
    assert reply.usage.input_tokens > 0 and 0 < reply.usage.output_tokens <= 6
    assert reply.usage.total_tokens == reply.usage.input_tokens + reply.usage.output_tokens
    assert reply.status == ("incomplete" if reply.usage.output_tokens == 6 else "completed")
    assert (reply.max_output_tokens, reply.temperature, reply.tools, reply.tool_choice) == (6, 0, [], "auto")
    chatml.raw(model="my-model", input="hello", max_output_tokens=6, temperature=0)


def test_streamed_text_is_the_json_reply(chatml):
    request = {"input": [{"role": "developer", "content": "Be brief."},
                         {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
               "max_output_tokens": 6, "temperature": 0}
    whole = chatml.raw(**request)
    events = chatml.events(**request)
    text = whole["output"][0]["content"][0]["text"]
    assert joined_deltas(events, "response.output_text.delta") == text
    assert events[0]["type"] == "response.created" and events[0]["response"]["status"] == "in_progress"
    final = events[-1]["response"]
    assert events[-1]["type"] == f"response.{whole['status']}" and final["status"] == whole["status"]
    assert final["output"][0]["content"][0]["text"] == text
    assert [final["usage"][k] for k in ("input_tokens", "output_tokens")] == \
        [whole["usage"][k] for k in ("input_tokens", "output_tokens")]  # cached_tokens: the slot reused the prompt
    # The client's own stream helper accumulates the same text.
    streamed = "".join(event.delta for event in chatml.client.responses.create(**request, model="m", stream=True)
                       if event.type == "response.output_text.delta")
    assert streamed == text


def test_max_output_tokens_makes_the_response_incomplete(chatml):
    reply = chatml.client.responses.create(model="m", input="hello", max_output_tokens=3, temperature=0)
    assert reply.status == "incomplete" and reply.incomplete_details.reason == "max_output_tokens"
    assert reply.usage.output_tokens == 3 and reply.output[0].status == "incomplete"
    events = chatml.events(input="hello", max_output_tokens=3, temperature=0)
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert events[-2]["type"] == "response.output_item.done" and events[-2]["item"]["status"] == "incomplete"


def test_json_schema_format_output_follows_the_schema(chatml):
    text = {"format": {"type": "json_schema", "name": "digit", "schema": DIGIT, "strict": True}}
    reply = chatml.client.responses.create(model="m", input="A digit?", text=text, max_output_tokens=200,
                                           temperature=0)
    assert reply.status == "completed"
    jsonschema.validate(json.loads(reply.output_text), DIGIT)
    assert reply.text.format.name == "digit"
    events = chatml.events(input="A digit?", text=text, max_output_tokens=200, temperature=0)
    jsonschema.validate(json.loads(joined_deltas(events, "response.output_text.delta")), DIGIT)


# -- function calls ------------------------------------------------------------------------------------

def test_forced_function_calls_follow_their_schemas(hermes):
    reply = hermes.client.responses.create(model="m", input="Pick a digit.", tools=TOOLS, tool_choice="required",
                                           max_output_tokens=400, temperature=0)
    assert reply.status == "completed" and reply.output and reply.output_text == ""
    for call in reply.output:
        assert call.type == "function_call" and call.status == "completed" and call.id.startswith("fc_")
        assert call.call_id and call.name in SCHEMAS
        jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
    hermes.raw(input="Pick a digit.", tools=TOOLS, tool_choice="required", max_output_tokens=400, temperature=0)


def test_streamed_function_call_events(hermes):
    """One named call: the exact event sequence (runs of deltas written once), and the same call
    as the JSON answer and as the client's stream helper assembles it."""
    request = {"input": "Flag it.", "tools": TOOLS, "tool_choice": {"type": "function", "name": "flag"},
               "max_output_tokens": 400, "temperature": 0}
    events = hermes.events(**request)
    assert collapsed(events) == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "response.completed",
    ]
    added, done = events[2]["item"], events[-2]["item"]
    arguments = joined_deltas(events, "response.function_call_arguments.delta")
    assert (added["status"], added["arguments"], added["name"]) == ("in_progress", "", "flag")
    assert done == {**added, "status": "completed", "arguments": arguments}
    assert events[-3]["arguments"] == arguments and events[-1]["response"]["output"] == [done]
    jsonschema.validate(json.loads(arguments), SCHEMAS["flag"])
    [whole] = hermes.raw(**request)["output"]
    assert (whole["name"], whole["arguments"]) == ("flag", arguments)
    with hermes.client.responses.stream(model="m", **request) as stream:
        final = stream.get_final_response()
    assert [(c.name, c.arguments) for c in final.output] == [("flag", arguments)]


def test_function_call_round_trip(hermes):
    """The calls sent back with their outputs: the model is asked again, and the request counts
    the tokens of the chat conversation it stands for."""
    question = {"role": "user", "content": "Pick a digit."}
    first = hermes.client.responses.create(model="m", input=[question], tools=TOOLS, tool_choice="required",
                                           max_output_tokens=400, temperature=0)
    calls = [item.model_dump(exclude_none=True) for item in first.output]
    outputs = [{"type": "function_call_output", "call_id": call["call_id"], "output": f"result {n}"}
               for n, call in enumerate(calls)]
    second = hermes.client.responses.create(model="m", input=[question, *calls, *outputs], tools=TOOLS,
                                            max_output_tokens=4, temperature=0)
    assert second.status in ("completed", "incomplete") and second.output
    as_chat = {"messages": [question, {"role": "assistant", "content": None, "tool_calls": [
        {"id": c["call_id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
        for c in calls]}, *[{"role": "tool", "tool_call_id": o["call_id"], "content": o["output"]} for o in outputs]],
        "tools": [{"type": "function", "function": {k: v for k, v in t.items() if k in ("name", "description",
                                                                                       "parameters")}}
                  for t in TOOLS]}
    chat_count = hermes.http.post("/v1/chat/completions/input_tokens", json=as_chat).json()["input_tokens"]
    assert second.usage.input_tokens == chat_count


def test_built_in_tools_are_skipped_with_a_warning(hermes, caplog):
    built_in = [{"type": "web_search"}, {"type": "code_interpreter", "container": {"type": "auto"}}]
    with caplog.at_level(logging.WARNING, logger="lamplight"):
        reply = hermes.client.responses.create(model="m", input="Pick a digit.", tools=[*built_in, TOOLS[0]],
                                               tool_choice="required", max_output_tokens=400, temperature=0)
    assert [item.name for item in reply.output] == ["pick"] * len(reply.output) and reply.output
    assert [tool.name for tool in reply.tools] == ["pick"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    for tool in built_in:
        assert sum(tool["type"] in line for line in warnings) == 1, warnings


# -- thinking and the prompt (scripted engine, Qwen3's template) ---------------------------------

THOUGHT = "<think>\nThe user wants a digit.\n</think>\n\n"
CALL = '<tool_call>\n{"name": "pick", "arguments": {"n": 1, "unit": "c"}}\n</tool_call>'


def test_thinking_becomes_a_reasoning_item(qwen3):
    api, engine = qwen3
    engine.script = script(THOUGHT + "One.", stop_type="eos", piece=4)
    chat = api.http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}).json()
    engine.script = script(THOUGHT + "One.", stop_type="eos", piece=4)
    reply = api.client.responses.create(model="m", input="hi")
    reasoning, message = reply.output
    assert reasoning.type == "reasoning" and reasoning.id.startswith("rs_") and reasoning.summary == []
    assert [part.text for part in reasoning.content] == [chat["choices"][0]["message"]["reasoning_content"]]
    assert reasoning.content[0].text.strip() == "The user wants a digit."
    assert reply.output_text == chat["choices"][0]["message"]["content"] == "One."
    assert 0 < reply.usage.output_tokens_details.reasoning_tokens <= reply.usage.output_tokens


def test_streamed_thinking_text_and_call(qwen3):
    """Thinking, text and a call in one reply: the exact event sequence, the items as the JSON
    answer has them."""
    api, engine = qwen3
    reply = THOUGHT + "Picking." + CALL
    engine.script = script(reply, stop_type="eos", piece=4)
    events = api.events(input="Pick a digit.", tools=TOOLS)
    assert collapsed(events) == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
        "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.completed",
    ]
    engine.script = script(reply, stop_type="eos", piece=4)
    whole = api.raw(input="Pick a digit.", tools=TOOLS)["output"]
    streamed = events[-1]["response"]["output"]
    assert [without_ids(item) for item in streamed] == [without_ids(item) for item in whole]
    assert [item["type"] for item in whole] == ["reasoning", "message", "function_call"]
    assert joined_deltas(events, "response.reasoning_text.delta") == streamed[0]["content"][0]["text"]
    assert (whole[2]["name"], whole[2]["arguments"]) == ("pick", PICK_ARGS)
    assert [e["item"] for e in events if e["type"] == "response.output_item.done"] == streamed


def test_conversation_items_render_as_the_template_expects(qwen3, tiny_loaded):  # noqa: F811
    """Reasoning, a call and its output sent back: Qwen3's template writes the thinking, the
    <tool_call> and the <tool_response> of the chat messages they become."""
    api, engine = qwen3
    engine.script = script("Seven.", stop_type="eos")
    items = [
        {"role": "user", "content": "Pick a digit."},
        {"type": "reasoning", "id": "rs_1", "summary": [],
         "content": [{"type": "reasoning_text", "text": "Use the tool."}]},
        {"type": "function_call", "call_id": "call_7", "name": "pick", "arguments": PICK_ARGS},
        {"type": "function_call_output", "call_id": "call_7", "output": "seven"},
    ]
    reply = api.client.responses.create(model="m", input=items, tools=TOOLS, instructions="Be exact.")
    assert reply.output_text == "Seven." and reply.instructions == "Be exact."
    prompt = prompt_of(engine, tiny_loaded)
    assert prompt.startswith("<|im_start|>system\nBe exact.\n\n# Tools")
    assert ("<|im_start|>assistant\n<think>\nUse the tool.\n</think>\n\n<tool_call>\n"
            '{"name": "pick", "arguments": {"n": 1, "unit": "c"}}\n</tool_call><|im_end|>\n') in prompt
    assert "<|im_start|>user\n<tool_response>\nseven\n</tool_response><|im_end|>\n<|im_start|>assistant\n" in prompt


@pytest.mark.parametrize("effort", ["none", "minimal", "low", "medium", "high"])
def test_reasoning_effort_sets_the_thinking_budget(qwen3, tiny_loaded, effort):  # noqa: F811
    api, engine = qwen3
    engine.script = script("One.", stop_type="eos")
    reply = api.client.responses.create(model="m", input="hi", reasoning={"effort": effort, "summary": "auto"})
    assert reply.reasoning.effort == effort and reply.reasoning.summary == "auto"
    budget = engine.requests[-1].reasoning_budget
    expected = EFFORT_BUDGETS[effort]
    closed = prompt_of(engine, tiny_loaded).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert closed == (expected == 0)  # thinking off: the template's enable_thinking false
    assert (budget.budget if budget is not None else None) == (expected if expected not in (None, -1) else None)


@pytest.mark.parametrize("format_type", ["text", "json_object"])
def test_text_format_json_object_is_a_grammar(qwen3, format_type):
    api, engine = qwen3
    engine.script = script('{"a": 1}', stop_type="eos")
    reply = api.client.responses.create(model="m", input="JSON?", text={"format": {"type": format_type}})
    assert reply.text.format.type == format_type and json.loads(reply.output_text) == {"a": 1}
    assert (engine.requests[-1].grammar is not None) == (format_type == "json_object")


def test_a_failure_mid_stream_is_response_failed(qwen3):
    api, engine = qwen3
    engine.script = script("Hello there", piece=3)[:2] + [ErrorEvent(choice=0, message="the engine broke")]
    events = api.events(input="hi")
    assert [e["type"] for e in events[-2:]] == ["error", "response.failed"]
    assert events[-2]["message"] == "the engine broke"
    assert events[-1]["response"]["status"] == "failed"
    assert events[-1]["response"]["error"]["message"] == "the engine broke"


# -- token counts ------------------------------------------------------------------------------------

@pytest.mark.parametrize("request_body", [
    {"input": "hello"},
    {"input": [{"role": "user", "content": "Pick a digit."}], "instructions": "Be exact.", "tools": TOOLS},
])
def test_input_tokens_equal_the_responses_usage(hermes, request_body):
    count = hermes.client.responses.input_tokens.count(model="m", **request_body)
    assert isinstance(count, InputTokenCountResponse) and count.object == "response.input_tokens"
    reply = hermes.client.responses.create(model="m", max_output_tokens=2, temperature=0, **request_body)
    assert count.input_tokens == reply.usage.input_tokens > 0


def test_chat_input_tokens_equal_the_chat_prompt_tokens(hermes):
    chat = {"messages": [{"role": "system", "content": "Be exact."}, {"role": "user", "content": "Pick one."}],
            "tools": [{"type": "function", "function": {"name": "pick", "parameters": DIGIT}}]}
    count = hermes.client.post("/chat/completions/input_tokens", body=chat, cast_to=InputTokenCountResponse)
    reply = hermes.client.chat.completions.create(model="m", max_tokens=2, **chat)
    assert count.object == "response.input_tokens" and count.input_tokens == reply.usage.prompt_tokens > 0


# -- refusals ------------------------------------------------------------------------------------------

STATEFUL = [
    ({"previous_response_id": "resp_1"}, "previous_response_id"),
    ({"store": True}, "store"),
    ({"conversation": "conv_1"}, "conversation"),
    ({"background": True}, "background"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
]

BAD = [
    ({"input": None}, "input"),
    ({"input": 5}, "input"),
    ({"input": []}, "input"),
    ({"input": [5]}, "input[0]"),
    ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
    ({"input": [{"role": "user", "content": 5}]}, "input[0].content"),
    ({"input": [{"role": "user", "content": [{"type": "audio"}]}]}, "input[0].content[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_text", "text": 3}]}]}, "input[0].content[0].text"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "input[0].content[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]},
     "input[0].content[0].file_id"),
    ({"input": [{"type": "web_search_call", "id": "ws_1"}]}, "input[0].type"),
    ({"input": [{"type": "function_call_output", "call_id": "nowhere", "output": "x"}]}, "input[0].call_id"),
    ({"input": [{"type": "function_call", "call_id": "c1", "arguments": "{}"}]}, "input[0].name"),
    ({"input": [{"type": "function_call", "call_id": "c1", "name": "f", "arguments": {}}]}, "input[0].arguments"),
    ({"input": [{"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": 7}]}, "input[1].output"),
    ({"input": [{"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text"}]}]},
     "input[0].content[0].text"),
    ({"tools": 5}, "tools"),
    ({"tools": [5]}, "tools[0]"),
    ({"tools": [{"type": "function", "parameters": {}}]}, "tools[0].name"),
    ({"tools": [{"type": "function", "name": "f", "parameters": "x"}]}, "tools[0].parameters"),
    ({"tool_choice": {"type": "web_search"}}, "tool_choice"),
    ({"tool_choice": "always"}, "tool_choice"),
    ({"text": {"format": {"type": "yaml"}}}, "text.format.type"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
    ({"text": {"format": {"type": "json_schema", "schema": {"type": "object"}}}}, "text.format.name"),
    ({"text": {"verbosity": "loud"}}, "text.verbosity"),
    ({"reasoning": {"effort": "extreme"}}, "reasoning.effort"),
    ({"reasoning": {"summary": ["auto"]}}, "reasoning.summary"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"max_output_tokens": "ten"}, "max_output_tokens"),
    ({"temperature": "hot"}, "temperature"),
    ({"top_p": -1}, "top_p"),
    ({"parallel_tool_calls": "yes", "tools": TOOLS}, "parallel_tool_calls"),
    ({"metadata": {"a": 1}}, "metadata"),
    ({"truncation": "middle"}, "truncation"),
    ({"instructions": 5}, "instructions"),
    ({"stream": "yes"}, "stream"),
]


@pytest.mark.parametrize("path", ["/v1/responses", "/v1/responses/input_tokens"])
def test_bad_and_stateful_requests_are_400s_naming_the_field(chatml, path):
    for extra, param in STATEFUL + BAD:
        with pytest.raises(openai.BadRequestError) as refused:
            chatml.client.post(path.removeprefix("/v1"), body={"model": "m", "input": "hi", **extra},
                               cast_to=Response)
        assert refused.value.param == param, (extra, refused.value.body)
        assert refused.value.status_code == 400 and refused.value.body["type"] == "invalid_request_error"
        assert isinstance(refused.value.body["message"], str)
    assert chatml.client.responses.input_tokens.count(model="m", input="still serving").input_tokens > 0
    assert chatml.client.responses.create(model="m", input="still serving", max_output_tokens=2).output


def test_images_reach_the_chat_pipeline(chatml):
    content = [{"type": "input_text", "text": "What is this?"},
               {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}]
    with pytest.raises(openai.BadRequestError, match="multimodal projector"):
        chatml.client.responses.create(model="m", input=[{"role": "user", "content": content}])


def test_responses_are_not_stored(chatml):
    with pytest.raises(openai.NotFoundError, match="stateless"):
        chatml.client.responses.retrieve("resp_123")
    with pytest.raises(openai.BadRequestError, match="stateless") as refused:
        chatml.client.responses.create(model="m", input="hi", previous_response_id="resp_123")
    assert refused.value.param == "previous_response_id"
    assert chatml.client.responses.create(model="m", input="hi", store=False, max_output_tokens=2).output
