"""Answer markers of Command R7B (`<|START_RESPONSE|>`) and Granite 3.x (`<response>`) are taken
off the chat content, as llama.cpp's parsers do: detected from the real templates, on every
streamed prefix, and over the API (streamed and not, with the thinking split off first)."""

from __future__ import annotations

import copy

import httpx
import pytest
from conftest import reference_text
from test_server_support import ScriptedEngine, ServerThread, sse_events
from test_tool_cut import script
from tiny_gguf import write_tiny_llama

import lamplight
from lamplight.chat import ChatTemplate
from lamplight.chat.answer_wrappers import COMMAND_R7B, GRANITE
from lamplight.server import ServerSettings, ServerState

R7B = "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja"
GRANITE_33 = "ibm-granite-granite-3.3-2B-Instruct.jinja"


def template(name: str) -> ChatTemplate:
    return ChatTemplate(reference_text(f"templates/{name}"))


@pytest.mark.parametrize("name, wrapper", [(R7B, COMMAND_R7B), (GRANITE_33, GRANITE),
                                           ("Qwen-Qwen3-0.6B.jinja", None), ("ibm-granite-granite-4.0.jinja", None)])
def test_detected_from_the_real_templates(name, wrapper):
    assert template(name).answer_wrapper == wrapper


@pytest.mark.parametrize("wrapper, text, answer", [
    (COMMAND_R7B, "<|START_RESPONSE|>Hello!<|END_RESPONSE|>", "Hello!"),
    (COMMAND_R7B, "<|START_RESPONSE|>Hello, cut", "Hello, cut"),
    (GRANITE, "<response>Paris is the capital.</response>", "Paris is the capital."),
    (GRANITE, "No markers at all.", "No markers at all."),
])
def test_unwrap_streamed_and_not(wrapper, text, answer):
    assert wrapper.unwrap(text) == answer
    previous = ""
    for n in range(1, len(text) + 1):  # every streamed prefix only extends the answer
        streamed = wrapper.unwrap(text[:n], partial=True)
        assert streamed.startswith(previous) and answer.startswith(streamed)
        previous = streamed


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    loaded = lamplight.load(str(write_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny.gguf")))
    engine, urls, threads = ScriptedEngine(), {}, []
    for name in (R7B, GRANITE_33):
        model = copy.copy(loaded)
        model.chat_template = template(name)
        state = ServerState(ServerSettings())
        state.attach(model, engine)
        threads.append(ServerThread(state).start())
        urls[name] = threads[-1].url
    yield engine, urls
    for thread in threads:
        thread.stop()


API_CASES = [
    (R7B, "<|START_THINKING|>Greet back.<|END_THINKING|><|START_RESPONSE|>Hello!<|END_RESPONSE|>",
     "Greet back.", "Hello!"),
    (GRANITE_33, "<think>Greet back.</think><response>Hello!</response>", "Greet back.", "Hello!"),
]


@pytest.mark.parametrize("name, reply, reasoning, content", API_CASES)
@pytest.mark.parametrize("stream", [False, True])
def test_answer_markers_are_off_the_content(servers, name, reply, reasoning, content, stream):
    engine, urls = servers
    engine.script = script(reply, stop_type="eos", piece=4)
    request = {"messages": [{"role": "user", "content": "hi"}], "stream": stream}
    response = httpx.post(f"{urls[name]}/v1/chat/completions", json=request, timeout=30)
    if stream:
        deltas = [e["choices"][0]["delta"] for e in sse_events(response.text) if e != "[DONE]" and e["choices"]]
        got = ("".join(d.get("reasoning_content") or "" for d in deltas), "".join(d.get("content") or "" for d in deltas))
    else:
        message = response.json()["choices"][0]["message"]
        got = (message.get("reasoning_content"), message["content"])
    assert got == (reasoning, content)
