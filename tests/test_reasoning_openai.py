"""reasoning_content through the official openai client, on the tiny model's server with a scripted
engine reply (a grammar constrains only the answer of a thinking template, so it cannot force the
thinking): the thinking and the answer come apart, streamed and not."""

from __future__ import annotations

import copy

import openai
import pytest
from test_server_support import ScriptedEngine, ServerThread
from test_server_tools import tiny_loaded  # noqa: F401 (fixture)
from test_tool_cut import script

from lamplight.chat import ChatTemplate
from lamplight.server import ServerSettings, ServerState

# ChatML with a thinking switch: the `<think>` in its source makes it a thinking template.
THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)
REPLY = "<think>Count the letters.</think>Five."


@pytest.fixture(scope="module")
def client(tiny_loaded):  # noqa: F811
    engine = ScriptedEngine()
    engine.script = script(REPLY, stop_type="eos", piece=3)
    model = copy.copy(tiny_loaded)
    model.chat_template = ChatTemplate(THINKING_TEMPLATE)
    state = ServerState(ServerSettings())
    state.attach(model, engine)
    server = ServerThread(state).start()
    yield openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=60)
    server.stop()


def ask(client, **extra):
    return client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=60, **extra)


def test_thinking_and_answer_split(client):
    message = ask(client).choices[0].message
    assert message.content == "Five."
    assert message.model_extra["reasoning_content"] == "Count the letters."


def test_streamed_thinking_and_answer_split(client):
    reasoning, content = "", ""
    for chunk in ask(client, stream=True):
        if chunk.choices:
            delta = chunk.choices[0].delta
            reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
            content += delta.content or ""
    assert (reasoning, content) == ("Count the letters.", "Five.")


def test_reasoning_format_none_keeps_the_thinking_in_content(client):
    message = ask(client, extra_body={"reasoning_format": "none"}).choices[0].message
    assert message.content == "<think>Count the letters.</think>Five."
    assert "reasoning_content" not in (message.model_extra or {})
