"""gpt-oss (harmony) tool calls: recorded replies in the shapes of OpenAI's harmony format guide
and of llama.cpp's gpt-oss handler parse to calls, streamed and not, cut or not; the grammar holds
the model to a call after the recipient; the thinking (analysis channel) goes to
reasoning_content over the API (detection: test_tool_formats.py)."""

from __future__ import annotations

import copy

import httpx
import pytest
from conftest import reference_text
from test_server_support import ScriptedEngine, ServerThread, sse_events
from test_server_tools import reassemble_stream
from test_tool_cut import script
from test_tools import test_streamed_deltas_reassemble_to_the_final_message as check_streamed_deltas
from test_tools import compile_plan, plan, tiny, walk  # noqa: F401 (tiny is a fixture)
from tiny_gguf import write_tiny_llama

import lamplight
from lamplight.chat import ChatTemplate
from lamplight.server import ServerSettings, ServerState
from lamplight.tools import HarmonyFormat

TEMPLATE = "templates/openai-gpt-oss-120b.jinja"  # in the reference data
HARMONY = HarmonyFormat()

# The harmony guide's function call: thinking, then the call in the commentary channel (the
# generation prompt already wrote `<|start|>assistant`; `<|call|>` ends the generation).
GUIDE_CALL = ("<|channel|>analysis<|message|>Need to use function get_weather.<|end|>"
              "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
              '<|message|>{"location":"San Francisco"}<|call|>')
IN_CHANNEL = ('<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>'
              '{"city": "Paris", "days": 2}')
IN_ROLE = ' to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris", "days": 2}'
PREAMBLE = "<|channel|>commentary<|message|>Checking the weather.<|end|><|start|>assistant" + IN_CHANNEL
FINAL = "<|channel|>analysis<|message|>Just greet.<|end|><|start|>assistant<|channel|>final<|message|>Hello!"
PARIS = [("get_weather", '{"city":"Paris","days":2}')]

RECORDED = [
    # reply (as the tool parser sees it), content, calls
    (GUIDE_CALL.split("<|end|>", 1)[1], "", [("get_weather", '{"location":"San Francisco"}')]),
    (IN_CHANNEL, "", PARIS),
    (IN_ROLE, "", PARIS),
    (IN_ROLE + "<|call|>", "", PARIS),
    (PREAMBLE, "Checking the weather.", PARIS),
    ("Hello there.", "Hello there.", []),
    # reasoning_format none: the analysis message stays in content with its markers (llama.cpp)
    (FINAL, "<|channel|>analysis<|message|>Just greet.<|end|>Hello!", []),
]


@pytest.mark.parametrize("text, content, calls", RECORDED)
def test_recorded_replies(text, content, calls):
    parsed = HARMONY.parse(text)
    assert parsed.content == content
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == calls


@pytest.mark.parametrize("text", [
    '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>not json',
    '<|channel|>commentary to=functions.get_weather<|message|>{"city": "Paris"} trailing',
    "<|channel|>nonsense<|message|>x",
])
def test_malformed_replies_are_content(text):
    parsed = HARMONY.parse(text)
    assert parsed.content == text and not parsed.tool_calls


@pytest.mark.parametrize("text", [text for text, _, _ in RECORDED])
def test_streamed_deltas_reassemble_to_the_final_message(text):
    check_streamed_deltas(HARMONY, text)


@pytest.mark.parametrize("text", [IN_CHANNEL, IN_ROLE, PREAMBLE])
def test_cut_replies_never_show_the_wire_text(text):
    for cut in range(1, len(text)):
        parsed = HARMONY.parse_cut(text[:cut])
        # (a cut inside the recipient marker itself is text, as a cut `<tool_c` is for Hermes)
        assert " to=functions." not in parsed.content and "<|message|>" not in parsed.content
        assert [(c.name, c.arguments) for c in parsed.tool_calls] in ([], PARIS)
    assert [(c.name, c.arguments) for c in HARMONY.parse_cut(text).tool_calls] == PARIS


def test_grammar(tiny):
    def check(text, choice="auto"):
        return walk(tiny, compile_plan(tiny, plan(HARMONY, choice)), text)

    thinking = "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant"
    assert check(IN_CHANNEL, "required") == "done"
    assert check(IN_ROLE, "required") == "done"
    assert check(thinking + IN_CHANNEL, "required") == "done"
    assert check("Plain text " + IN_CHANNEL, "required") == "refused"
    assert check(thinking + IN_CHANNEL, "auto") == "done"
    assert check("Only text", "auto") == "accepting"
    assert check(IN_CHANNEL.replace('"Paris"', "3"), "auto") == "refused"  # city must be a string
    assert check(IN_CHANNEL.replace("get_weather", "get_time"), "auto") == "refused"


# -- through the API: the analysis channel is reasoning_content, the call a tool call -------------

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}]
THOUGHT_CALL = "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant" + IN_CHANNEL


@pytest.fixture(scope="module")
def harmony_server(tmp_path_factory):
    model = copy.copy(lamplight.load(str(write_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny.gguf"))))
    model.chat_template = ChatTemplate(reference_text(TEMPLATE))
    engine = ScriptedEngine()
    state = ServerState(ServerSettings())
    state.attach(model, engine)
    server = ServerThread(state).start()
    yield engine, server.url
    server.stop()


@pytest.mark.parametrize("stream", [False, True])
def test_thinking_then_call_over_the_api(harmony_server, stream):
    engine, url = harmony_server
    engine.script = script(THOUGHT_CALL, stop_type="eos", piece=3)
    request = {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": TOOLS, "stream": stream}
    response = httpx.post(f"{url}/v1/chat/completions", json=request, timeout=30)
    if stream:
        events = sse_events(response.text)
        content, calls, finish = reassemble_stream(events)
        reasoning = "".join((e["choices"][0]["delta"].get("reasoning_content") or "")
                            for e in events if e != "[DONE]" and e["choices"])
        calls = [(c["name"], c["arguments"]) for c in calls]
    else:
        choice = response.json()["choices"][0]
        message, finish = choice["message"], choice["finish_reason"]
        content, reasoning = message["content"], message["reasoning_content"]
        calls = [(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]]
    assert (reasoning, calls, finish) == ("Need the weather.", PARIS, "tool_calls")
    assert not content
    assert response.status_code == 200
