"""Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens) through the official
anthropic client. The tiny random model answers text, stop sequences, max_tokens, grammar-forced
tool calls and structured output; a scripted engine plays exact replies in a template family's
format (Hermes tool calls, Qwen3 thinking) and keeps each request's prompt, for tool round trips,
thinking settings, pings and failures. Errors come in Anthropic's shape as the client's
exception types, and the server goes on serving."""

from __future__ import annotations

import copy
import json

import anthropic
import httpx
import jsonschema
import pytest
from conftest import reference_text
from test_server_support import ScriptedEngine, ServerThread, sse_events
from test_server_tools import DIGIT, HERMES_TEMPLATE, tiny_engine, tiny_loaded  # noqa: F401 (fixtures)
from test_tool_cut import script

from lamplight.chat import ChatTemplate
from lamplight.engine.types import ErrorEvent, QueueFullError, TokenEvent
from lamplight.server import ServerSettings, ServerState

KEY = "anthropic-test-key"
PING_INTERVAL = 0.1
MODEL = "claude-test"
FLAG = {"type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"]}
TOOLS = [{"name": "pick", "description": "Pick a digit", "input_schema": DIGIT},
         {"name": "flag", "input_schema": FLAG}]
SCHEMAS = {"pick": DIGIT, "flag": FLAG}
ASK = [{"role": "user", "content": "Pick a digit."}]
PICK_ARGUMENTS = {"n": 4, "unit": "c"}
PICK_CALL = "<tool_call>\n" + json.dumps({"name": "pick", "arguments": PICK_ARGUMENTS}) + "\n</tool_call>"
GREEDY = {"temperature": 0, "ignore_eos": True}  # llama-server's fields pass through extra_body
THINKING_REPLY = "<think>\nCount the letters.\n</think>\n\nFive."


def start(model, engine, template: str | None = None, **settings) -> ServerThread:
    if template is not None:
        model = copy.copy(model)
        model.chat_template = ChatTemplate(template)
    state = ServerState(ServerSettings(**settings))
    state.attach(model, engine)
    return ServerThread(state).start()


def client_of(server: ServerThread, key: str = KEY) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key=key, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def tiny(tiny_loaded, tiny_engine):  # noqa: F811
    """The tiny random model behind Hermes's template (it renders tools); the server has a key."""
    server = start(tiny_loaded, tiny_engine, HERMES_TEMPLATE, api_keys=(KEY,))
    yield client_of(server)
    server.stop()


@pytest.fixture(scope="module")
def scripted_engine() -> ScriptedEngine:
    return ScriptedEngine()


@pytest.fixture
def engine(scripted_engine) -> ScriptedEngine:
    scripted_engine.script, scripted_engine.submit_error, scripted_engine.requests = [], None, []
    return scripted_engine


@pytest.fixture(scope="module")
def hermes_server(tiny_loaded, scripted_engine):  # noqa: F811
    server = start(tiny_loaded, scripted_engine, HERMES_TEMPLATE, sse_ping_interval=PING_INTERVAL)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def hermes(hermes_server) -> anthropic.Anthropic:
    return client_of(hermes_server)


@pytest.fixture(scope="module")
def qwen3_server(tiny_loaded, scripted_engine):  # noqa: F811
    server = start(tiny_loaded, scripted_engine, reference_text("templates/Qwen-Qwen3-0.6B.jinja"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def qwen3(qwen3_server) -> anthropic.Anthropic:
    return client_of(qwen3_server)


def last_prompt(engine: ScriptedEngine, tiny_loaded) -> str:  # noqa: F811
    """The prompt the engine got last, as text."""
    return tiny_loaded.tokenizer.decode(engine.requests[-1].prompt_tokens, special=True)


def sse_pairs(text: str) -> list[tuple[str, dict]]:
    """(event name, data) of each SSE event; every one must name its data's type."""
    pairs = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.split("\n"))
        pairs.append((lines["event"], json.loads(lines["data"])))
        assert pairs[-1][0] == pairs[-1][1]["type"], block
    return pairs


def streamed(url: str, body: dict, key: str | None = None) -> list[tuple[str, dict]]:
    headers = {"x-api-key": key} if key else {}
    response = httpx.post(f"{url}/v1/messages", json={**body, "stream": True}, headers=headers, timeout=60)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    return sse_pairs(response.text)


def collapsed(names: list[str]) -> list[str]:
    """Runs of one event type as one."""
    return [name for i, name in enumerate(names) if i == 0 or names[i - 1] != name]


def text_of(message) -> str:
    return "".join(block.text for block in message.content if block.type == "text")


def calls_of(message) -> list[tuple[str, dict]]:
    return [(block.name, block.input) for block in message.content if block.type == "tool_use"]


# -- text, stop sequences, max_tokens, usage (the tiny model) ---------------------------------------

def test_text_reply_and_its_stream_agree(tiny):
    asked = dict(model=MODEL, max_tokens=6, messages=[{"role": "user", "content": "hello"}], extra_body=GREEDY,
                 extra_headers={"anthropic-beta": "interleaved-thinking-2025-05-14"})
    message = tiny.messages.create(**asked)
    assert message.id.startswith("msg_") and message.model == MODEL and message.role == "assistant"
    assert [block.type for block in message.content] == ["text"] and message.content[0].text
    assert (message.stop_reason, message.stop_sequence) == ("max_tokens", None)
    assert message.usage.output_tokens == 6 and message.usage.input_tokens > 0
    with tiny.messages.stream(**asked) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(pieces) > 1 and "".join(pieces) == text_of(final) == text_of(message)
    assert final.id.startswith("msg_") and final.id != message.id and final.model == MODEL
    assert (final.stop_reason, final.usage.output_tokens) == ("max_tokens", 6)


def _pick_stop(text: str) -> str:
    for start_at in range(3, len(text) - 2):
        candidate = text[start_at:start_at + 2]
        if "\ufffd" not in candidate and candidate.strip():
            return candidate
    pytest.skip(f"no usable stop sequence in {text!r}")


def test_stop_sequence_ends_the_reply_and_is_named(tiny):
    asked = dict(model=MODEL, max_tokens=24, messages=[{"role": "user", "content": "the sky"}], extra_body=GREEDY)
    full = text_of(tiny.messages.create(**asked))
    stop = _pick_stop(full)
    stopped = tiny.messages.create(**asked, stop_sequences=["never-there", stop])
    assert text_of(stopped) == full[:full.index(stop)]
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", stop)
    with tiny.messages.stream(**asked, stop_sequences=[stop]) as stream:
        final = stream.get_final_message()
    assert (text_of(final), final.stop_reason, final.stop_sequence) == (text_of(stopped), "stop_sequence", stop)


def test_end_turn_when_the_model_stops(hermes, engine):
    engine.script = script("Five.", stop_type="eos")
    message = hermes.messages.create(model=MODEL, max_tokens=30, messages=ASK)
    assert (text_of(message), message.stop_reason, message.stop_sequence) == ("Five.", "end_turn", None)


def test_count_tokens_is_the_replys_input(tiny):
    asked = dict(model=MODEL, system="You count tokens.", messages=[{"role": "user", "content": "one two three"}])
    count = tiny.messages.count_tokens(**asked).input_tokens
    with_tools = tiny.messages.count_tokens(**asked, tools=TOOLS).input_tokens
    assert with_tools > count > 0  # the template renders the tools into the prompt
    first = tiny.messages.create(**asked, max_tokens=2, extra_body=GREEDY).usage
    again = tiny.messages.create(**asked, max_tokens=2, extra_body=GREEDY).usage
    # Anthropic counts cache reads apart from input_tokens; the second reply reuses the prompt.
    assert first.input_tokens + first.cache_read_input_tokens == count
    assert again.input_tokens + again.cache_read_input_tokens == count and again.cache_read_input_tokens > 0
    assert (first.cache_creation_input_tokens, again.cache_creation_input_tokens) == (0, 0)
    used = tiny.messages.create(**asked, tools=TOOLS, max_tokens=2, extra_body=GREEDY).usage
    assert used.input_tokens + used.cache_read_input_tokens == with_tools


# -- tool calls ------------------------------------------------------------------------------------

def test_forced_tool_calls_are_tool_use_blocks(tiny):
    asked = dict(model=MODEL, max_tokens=400, messages=ASK, tools=TOOLS, tool_choice={"type": "any"},
                 extra_body={"temperature": 1.0, "seed": 3})
    message = tiny.messages.create(**asked)
    assert message.stop_reason == "tool_use" and message.content
    assert all(block.type == "tool_use" and block.id for block in message.content)
    for name, arguments in calls_of(message):
        jsonschema.validate(arguments, SCHEMAS[name])
    with tiny.messages.stream(**asked) as stream:
        final = stream.get_final_message()
    assert calls_of(final) == calls_of(message) and final.stop_reason == "tool_use"


def test_named_tool_without_parallel_calls_is_one_call(tiny):
    message = tiny.messages.create(model=MODEL, max_tokens=400, messages=ASK, tools=TOOLS,
                                   tool_choice={"type": "tool", "name": "flag", "disable_parallel_tool_use": True},
                                   extra_body={"temperature": 1.0, "seed": 5})
    [(name, arguments)] = calls_of(message)
    assert name == "flag" and message.stop_reason == "tool_use"
    jsonschema.validate(arguments, FLAG)


def test_structured_output_follows_the_schema(tiny):
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["n"], "additionalProperties": False}
    message = tiny.messages.create(model=MODEL, max_tokens=400, messages=ASK,
                                   output_config={"format": {"type": "json_schema", "schema": schema}},
                                   extra_body={"temperature": 1.0, "seed": 2})
    assert message.stop_reason == "end_turn"
    jsonschema.validate(json.loads(text_of(message)), schema)


def test_tool_round_trip_renders_the_call_and_its_result(hermes, engine, tiny_loaded):  # noqa: F811
    engine.script = script("Let me pick.\n" + PICK_CALL, stop_type="eos")
    first = hermes.messages.create(model=MODEL, max_tokens=60, messages=ASK, tools=TOOLS)
    assert first.stop_reason == "tool_use" and [block.type for block in first.content] == ["text", "tool_use"]
    assert text_of(first).strip() == "Let me pick." and calls_of(first) == [("pick", PICK_ARGUMENTS)]
    call_id = first.content[1].id
    engine.script = script("It is four degrees.", stop_type="eos")
    follow_up = ASK + [first.to_param(), {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": call_id, "content": "four degrees"},
        {"type": "tool_result", "tool_use_id": call_id, "content": [{"type": "text", "text": "no such unit"}],
         "is_error": True}]}]
    answer = hermes.messages.create(model=MODEL, max_tokens=60, messages=follow_up, tools=TOOLS)
    assert (text_of(answer), answer.stop_reason) == ("It is four degrees.", "end_turn")
    prompt = last_prompt(engine, tiny_loaded)
    assert PICK_CALL in prompt
    assert "<tool_response>\nfour degrees\n</tool_response>" in prompt
    assert "<tool_response>\nError:\nno such unit\n</tool_response>" in prompt


def test_streamed_tool_call_event_sequence(hermes_server, hermes, engine):
    engine.script = script("Let me pick.\n" + PICK_CALL, stop_type="eos", piece=4)
    events = streamed(hermes_server.url, {"model": MODEL, "max_tokens": 60, "messages": ASK, "tools": TOOLS})
    assert collapsed([name for name, _ in events]) == [
        "message_start",
        "content_block_start", "content_block_delta", "content_block_stop",  # the text
        "content_block_start", "content_block_delta", "content_block_stop",  # the tool call
        "message_delta", "message_stop",
    ]
    starts = [data for name, data in events if name == "content_block_start"]
    assert [(s["index"], s["content_block"]["type"]) for s in starts] == [(0, "text"), (1, "tool_use")]
    assert starts[1]["content_block"]["name"] == "pick" and starts[1]["content_block"]["input"] == {}
    pieces = [data["delta"]["partial_json"] for name, data in events
              if name == "content_block_delta" and data["delta"]["type"] == "input_json_delta"]
    assert len(pieces) > 1 and json.loads("".join(pieces)) == PICK_ARGUMENTS
    assert {data["index"] for name, data in events if name == "content_block_delta"} == {0, 1}
    delta = next(data for name, data in events if name == "message_delta")
    assert delta["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert events[0][1]["message"]["content"] == [] and events[0][1]["message"]["stop_reason"] is None
    engine.script = script("Let me pick.\n" + PICK_CALL, stop_type="eos", piece=4)
    with hermes.messages.stream(model=MODEL, max_tokens=60, messages=ASK, tools=TOOLS) as stream:
        final = stream.get_final_message()
    assert calls_of(final) == [("pick", PICK_ARGUMENTS)] and final.stop_reason == "tool_use"


def test_assistant_prefill_is_continued(hermes, engine, tiny_loaded):  # noqa: F811
    engine.script = script("B) Helios", stop_type="eos")
    prefilled = ASK + [{"role": "assistant", "content": [{"type": "text", "text": "The best answer is ("}]}]
    message = hermes.messages.create(model=MODEL, max_tokens=20, messages=prefilled)
    assert last_prompt(engine, tiny_loaded).endswith("<|im_start|>assistant\nThe best answer is (")
    assert text_of(message) == "B) Helios"  # the reply continues the prefill, without repeating it


def test_billing_checksum_does_not_change_the_prompt(hermes, engine, tiny_loaded):  # noqa: F811
    prompts = []
    for checksum in ("ab12c", "9f00e"):
        engine.script = script("ok", stop_type="eos")
        system = [{"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.3; cch={checksum};"},
                  {"type": "text", "text": "You are a helper."}]
        hermes.messages.create(model=MODEL, max_tokens=5, system=system, messages=ASK)
        prompts.append(last_prompt(engine, tiny_loaded))
    assert prompts[0] == prompts[1] and "cch=fffff;" in prompts[0] and "You are a helper." in prompts[0]


def test_system_messages_among_the_turns_join_the_system_prompt(hermes, engine, tiny_loaded):  # noqa: F811
    """Claude Code sends `system` messages inside `messages`; templates take one system message,
    first: their text follows the request's `system` there, in order."""
    engine.script = script("ok", stop_type="eos")
    messages = [ASK[0], {"role": "system", "content": "Agents: claude, Explore."},
                {"role": "system", "content": [{"type": "text", "text": "Be brief."}]}]
    hermes.messages.create(model=MODEL, max_tokens=5, system="You are a helper.", messages=messages)
    prompt = last_prompt(engine, tiny_loaded)
    system = prompt[:prompt.index("<|im_end|>")]
    assert system.index("You are a helper.") < system.index("Agents: claude, Explore.") < system.index("Be brief.")
    assert prompt.count("<|im_start|>system") == 1 and prompt.count("<|im_start|>user") == 1


# -- thinking (Qwen3's template) ----------------------------------------------------------------------

def chat_split(url: str, engine: ScriptedEngine, stream: bool) -> tuple[str, str]:
    """(reasoning_content, content) of the scripted reply on /v1/chat/completions."""
    engine.script = script(THINKING_REPLY, stop_type="eos", piece=3)
    response = httpx.post(f"{url}/v1/chat/completions", json={"messages": ASK, "max_tokens": 80, "stream": stream},
                          timeout=30)
    if not stream:
        message = response.json()["choices"][0]["message"]
        return message["reasoning_content"], message["content"]
    deltas = [event["choices"][0]["delta"] for event in sse_events(response.text)
              if event != "[DONE]" and event["choices"]]
    return "".join(d.get("reasoning_content") or "" for d in deltas), "".join(d.get("content") or "" for d in deltas)


def test_thinking_comes_back_as_thinking_blocks(qwen3_server, qwen3, engine):
    asked = dict(model=MODEL, max_tokens=80, messages=ASK, thinking={"type": "enabled", "budget_tokens": 40})
    engine.script = script(THINKING_REPLY, stop_type="eos", piece=3)
    message = qwen3.messages.create(**asked)
    assert [block.type for block in message.content] == ["thinking", "text"]
    thinking, text = message.content
    assert (thinking.thinking, text.text) == chat_split(qwen3_server.url, engine, stream=False)
    assert "Count the letters." in thinking.thinking and isinstance(thinking.signature, str) and thinking.signature
    # Streamed, the blocks hold what the chat pipeline streams (its reasoning_content deltas).
    engine.script = script(THINKING_REPLY, stop_type="eos", piece=3)
    with qwen3.messages.stream(**asked) as stream:
        final = stream.get_final_message()
    assert [(block.type, block.signature) for block in final.content[:1]] == [("thinking", thinking.signature)]
    assert (final.content[0].thinking, text_of(final)) == chat_split(qwen3_server.url, engine, stream=True)
    engine.script = script(THINKING_REPLY, stop_type="eos", piece=3)
    events = streamed(qwen3_server.url, asked)
    first_block = [(data["type"], data.get("delta", {}).get("type")) for _, data in events
                   if data.get("index") == 0]
    assert collapsed(first_block) == [("content_block_start", None), ("content_block_delta", "thinking_delta"),
                                      ("content_block_delta", "signature_delta"), ("content_block_stop", None)]


def test_thinking_settings_reach_the_prompt(qwen3, engine, tiny_loaded):  # noqa: F811
    def ask(**thinking):
        engine.script = script(THINKING_REPLY, stop_type="eos")
        message = qwen3.messages.create(model=MODEL, max_tokens=80, messages=ASK, **thinking)
        return message, engine.requests[-1], last_prompt(engine, tiny_loaded)

    _, request, prompt = ask(thinking={"type": "enabled", "budget_tokens": 7})
    assert request.reasoning_budget.budget == 7 and not prompt.endswith("</think>\n\n")
    _, request, prompt = ask(thinking={"type": "disabled"})
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    _, request, prompt = ask(thinking={"type": "adaptive"})
    assert request.reasoning_budget is None and not prompt.endswith("</think>\n\n")
    message, _, _ = ask(thinking={"type": "enabled", "budget_tokens": 30, "display": "omitted"})
    assert [(block.type, block.thinking) for block in message.content[:1]] == [("thinking", "")]
    assert message.content[0].signature


def test_thinking_sent_back_is_rendered(qwen3, engine, tiny_loaded):  # noqa: F811
    engine.script = script("Four.", stop_type="eos")
    conversation = ASK + [
        {"role": "assistant", "content": [
            {"type": "redacted_thinking", "data": "opaque-ciphertext"},
            {"type": "thinking", "thinking": "I should pick four.", "signature": "sig"},
            {"type": "tool_use", "id": "call-1", "name": "pick", "input": PICK_ARGUMENTS}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call-1", "content": "four degrees"}]},
    ]
    qwen3.messages.create(model=MODEL, max_tokens=20, messages=conversation, tools=TOOLS)
    prompt = last_prompt(engine, tiny_loaded)
    assert "<think>\nI should pick four.\n</think>" in prompt and "opaque-ciphertext" not in prompt
    assert '"name": "pick"' in prompt and "<tool_response>\nfour degrees\n</tool_response>" in prompt


# -- errors --------------------------------------------------------------------------------------------

OK = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
TOOL_TURN = {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "pick", "input": {}}]}
IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
BAD_BODIES = [
    # (what the body changes, text the 400's message holds: the field it names)
    ({"max_tokens": None}, "'max_tokens'"),
    ({"max_tokens": "ten"}, "'max_tokens'"),
    ({"max_tokens": 0}, "'max_tokens'"),
    ({"max_tokens": 1.5}, "'max_tokens'"),
    ({"model": 5}, "'model'"),
    ({"system": 5}, "'system'"),
    ({"system": [{"type": "image"}]}, "'system.0.type'"),
    ({"messages": "hi"}, "'messages'"),
    ({"messages": []}, "'messages'"),
    ({"messages": [{"role": "system", "content": "hi"}]}, "'messages'"),
    ({"messages": [{"role": "system", "content": 5}, OK["messages"][0]]}, "'messages.0.content'"),
    ({"messages": [{"role": "tool", "content": "hi"}]}, "'messages.0.role'"),
    ({"messages": [{"role": "user", "content": 5}]}, "'messages.0.content'"),
    ({"messages": [{"role": "user"}]}, "'messages.0.content'"),
    ({"messages": [{"role": "user", "content": [{"type": "video"}]}]}, "'messages.0.content.0.type'"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, "'messages.0.content.0.text'"),
    ({"messages": [{"role": "user", "content": [TOOL_TURN["content"][0]]}]}, "'messages.0.content.0.type'"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t9", "content": "x"}]}]},
     "'messages.0.content.0.tool_use_id'"),
    ({"messages": [{"role": "user", "content": "hi"}, TOOL_TURN,
                   {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t2"}]}]},
     "'messages.2.content.0.tool_use_id'"),
    ({"messages": [{"role": "user", "content": "hi"},
                   {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": "x"}]}]},
     "'messages.1.content.0.input'"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [IMAGE]}]},
     "'messages.1.content.0.type'"),
    ({"messages": [{"role": "user", "content": [{**IMAGE, "source": {"type": "file", "file_id": "f"}}]}]},
     "'messages.0.content.0.source.type'"),
    ({"tools": {"name": "f"}}, "'tools'"),
    ({"tools": [{"name": "f"}]}, "'tools.0.input_schema'"),
    ({"tools": [{"name": "", "input_schema": {"type": "object"}}]}, "'tools.0.name'"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "'tools.0.type'"),
    ({"tools": TOOLS, "tool_choice": {"type": "tool"}}, "'tool_choice.name'"),
    ({"tools": TOOLS, "tool_choice": {"type": "tool", "name": "nowhere"}}, "'tool_choice'"),
    ({"tools": TOOLS, "tool_choice": {"type": "sometimes"}}, "'tool_choice.type'"),
    ({"tools": TOOLS, "tool_choice": "auto"}, "'tool_choice'"),
    ({"tool_choice": {"type": "any"}}, "'tool_choice'"),
    ({"stop_sequences": "x"}, "'stop_sequences'"),
    ({"stop_sequences": ["x"] * 40}, "'stop_sequences'"),  # the pipeline's limit, under Anthropic's name
    ({"temperature": 1.5}, "'temperature'"),
    ({"top_p": "high"}, "'top_p'"),
    ({"top_k": -1}, "'top_k'"),
    ({"stream": "yes"}, "'stream'"),
    ({"thinking": {"type": "enabled"}}, "'thinking.budget_tokens'"),
    ({"thinking": {"type": "enabled", "budget_tokens": "lots"}}, "'thinking.budget_tokens'"),
    ({"thinking": {"type": "sometimes"}}, "'thinking.type'"),
    ({"thinking": {"type": "adaptive", "display": "loud"}}, "'thinking.display'"),
    ({"metadata": "me"}, "'metadata'"),
    ({"output_config": {"format": {"type": "json_schema", "schema": "x"}}}, "'output_config.format.schema'"),
    ({"output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}, "tools": TOOLS},
     "with tools"),
    ({"seed": "random"}, "'seed'"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "look"}, IMAGE]}]}, "multimodal projector"),
]


def bad_request(client: anthropic.Anthropic, path: str, body: dict) -> dict:
    """The 400 a body gets, as the client raises it: Anthropic's error JSON."""
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.post(path, body=body, cast_to=anthropic.types.Message)
    error = caught.value
    assert error.status_code == 400 and error.body["type"] == "error"
    assert error.body["error"]["type"] == "invalid_request_error"
    return error.body["error"]


@pytest.mark.parametrize("change, named", BAD_BODIES)
def test_bad_bodies_are_400s_naming_the_field(tiny, change, named):
    body = {key: value for key, value in {**OK, **change}.items() if value is not None}
    assert named in bad_request(tiny, "/v1/messages", body)["message"]
    if "max_tokens" not in change:
        assert named in bad_request(tiny, "/v1/messages/count_tokens", body)["message"]


def test_the_server_serves_after_bad_bodies(tiny):
    for change, _ in BAD_BODIES:
        with pytest.raises(anthropic.BadRequestError):
            tiny.post("/v1/messages", body={**OK, "stream": True, **change}, cast_to=anthropic.types.Message)
    message = tiny.messages.create(**OK)
    assert message.content and message.stop_reason in ("max_tokens", "end_turn")


def test_body_that_is_not_a_json_object(tiny):
    for raw in (b"{", b"[1]", b""):
        response = httpx.post(str(tiny.base_url).rstrip("/") + "/v1/messages", content=raw, timeout=10,
                              headers={"x-api-key": KEY, "content-type": "application/json"})
        assert response.status_code == 400
        assert response.json()["type"] == "error" and response.json()["error"]["type"] == "invalid_request_error"


def test_api_key(tiny):
    wrong = anthropic.Anthropic(base_url=str(tiny.base_url), api_key="not-the-key", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as caught:
        wrong.messages.create(**OK)
    assert caught.value.body == {"type": "error", "error": {"type": "authentication_error",
                                                            "message": "Invalid API Key"}}
    with pytest.raises(anthropic.AuthenticationError):
        wrong.messages.count_tokens(model=MODEL, messages=OK["messages"])
    bearer = anthropic.Anthropic(base_url=str(tiny.base_url), auth_token=KEY, max_retries=0)
    assert bearer.messages.count_tokens(model=MODEL, messages=OK["messages"]).input_tokens > 0


def test_unknown_path_below_messages(tiny):
    with pytest.raises(anthropic.NotFoundError) as caught:
        tiny.post("/v1/messages/batches", body=OK, cast_to=anthropic.types.Message)
    assert caught.value.body["error"]["type"] == "not_found_error"


def test_loading_server_is_overloaded():
    server = ServerThread(ServerState(ServerSettings())).start()  # no model attached yet
    try:
        with pytest.raises(anthropic.ServiceUnavailableError) as caught:
            client_of(server).messages.create(**OK)
        assert caught.value.body["error"] == {"type": "overloaded_error", "message": "Loading model"}
    finally:
        server.stop()


def test_full_queue_is_overloaded(hermes, engine):
    engine.submit_error = QueueFullError("the server is busy")
    with pytest.raises(anthropic.ServiceUnavailableError) as caught:
        hermes.messages.create(**OK)
    assert caught.value.body["error"] == {"type": "overloaded_error", "message": "the server is busy"}
    engine.submit_error = None
    engine.script = script("back", stop_type="eos")
    assert text_of(hermes.messages.create(**OK)) == "back"


def test_failure_mid_stream_is_an_error_event(hermes_server, hermes, engine):
    failing = [TokenEvent(choice=0, token_id=100, text="Hi", n_decoded=1),
               ErrorEvent(choice=0, message="the engine broke", code=500)]
    engine.script = failing
    events = streamed(hermes_server.url, OK)
    assert [name for name, _ in events] == ["message_start", "content_block_start", "content_block_delta", "error"]
    assert events[-1][1] == {"type": "error", "error": {"type": "api_error", "message": "the engine broke"}}
    engine.script = failing
    with pytest.raises(anthropic.APIStatusError, match="the engine broke"):
        with hermes.messages.stream(**OK) as stream:
            list(stream.text_stream)
    engine.script = script("fine", stop_type="eos")
    assert text_of(hermes.messages.create(**OK)) == "fine"


def test_pings_while_the_engine_is_silent(hermes_server, hermes, engine):
    engine.script = [PING_INTERVAL * 3.5, *script("late", stop_type="eos")]
    names = [name for name, _ in streamed(hermes_server.url, OK)]
    assert names[0] == "message_start" and names[1:3] == ["ping", "ping"]
    assert names.index("content_block_start") > names.index("ping") and names[-1] == "message_stop"
    engine.script = [PING_INTERVAL * 2.5, *script("late", stop_type="eos")]
    with hermes.messages.stream(**OK) as stream:
        assert "".join(stream.text_stream) == "late"
