"""`grammar`, `json_schema`, `response_format` and tool grammars constrain the answer of a thinking
template, not its thinking (lamplight/server/answer_grammar.py), as llama.cpp's chat grammars do.

Through the API: a scripted engine keeps the GenerationRequest each request produced, and its
grammar is run over candidate replies; then the tiny random model, whose free thinking is no
longer forced into the answer."""

from __future__ import annotations

import copy
import json

import httpx
import pytest
from test_server_support import ScriptedEngine, ServerThread, sse_events
from test_server_tools import HERMES_TEMPLATE, TINY_TOOLS, serve, tiny_engine, tiny_loaded  # noqa: F401
from test_tool_cut import script
from tiny_gguf import write_tiny_llama_with_controls

import lamplight
from lamplight.chat import ChatTemplate
from lamplight.server import ServerSettings, ServerState
from lamplight.server.launcher import EngineOptions, build_engine

# A thinking template whose generation prompt does not open the thinking (the model may), and
# one whose generation prompt opens it (DeepSeek R1 style).
MAY_THINK = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}{# <think> #}"
)
OPENS_THINKING = MAY_THINK.replace("assistant\n{% endif %}{# <think> #}", "assistant\n<think>\n{% endif %}")
assert OPENS_THINKING != MAY_THINK
NO_THINKING = MAY_THINK.replace("{# <think> #}", "")
HERMES_THINKING = HERMES_TEMPLATE + "{# <think> #}"

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
CONSTRAINTS = {
    "grammar": {"grammar": 'root ::= "{\\"n\\": " [0-9] "}"'},
    "json_schema": {"json_schema": SCHEMA},
    "response_format": {"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}}},
}
ANSWER = '{"n": 7}'


@pytest.fixture(scope="module")
def scripted(tiny_loaded):  # noqa: F811
    engine, servers = ScriptedEngine(), {}
    for name, source in (("may", MAY_THINK), ("opens", OPENS_THINKING), ("plain", NO_THINKING),
                         ("hermes", HERMES_THINKING)):
        model = copy.copy(tiny_loaded)
        model.chat_template = ChatTemplate(source)
        state = ServerState(ServerSettings())
        state.attach(model, engine)
        servers[name] = ServerThread(state).start()
    engine.script = script("ok", stop_type="eos")
    yield engine, {name: server.url for name, server in servers.items()}, tiny_loaded.tokenizer
    for server in servers.values():
        server.stop()


def submitted_grammar(scripted, server: str, path: str = "/v1/chat/completions", **body):
    """The grammar the engine got for a (streamed or not) request."""
    engine, urls, _ = scripted
    request = {"messages": [{"role": "user", "content": "hi"}], "prompt": "hi", **body}
    response = httpx.post(urls[server] + path, json=request, timeout=30)
    assert response.status_code == 200, response.text
    if body.get("stream"):
        assert sse_events(response.text)[-1] == "[DONE]"
    return engine.requests[-1].grammar


def accepts(scripted, grammar, text: str) -> bool:
    tokenizer = scripted[2]
    matcher = grammar.new_matcher()
    ids = tokenizer.encode(text, add_special=False, parse_special=True)
    return all(matcher.accept(token) for token in ids) and matcher.is_accepting()


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("constraint", CONSTRAINTS)
def test_thinking_may_come_before_the_constrained_answer(scripted, constraint, stream):
    grammar = submitted_grammar(scripted, "may", stream=stream, **CONSTRAINTS[constraint])
    assert accepts(scripted, grammar, ANSWER)
    assert accepts(scripted, grammar, "<think>free text, {not JSON</think>\n\n" + ANSWER)
    assert not accepts(scripted, grammar, "<think>free text</think>not the answer")
    assert not accepts(scripted, grammar, "free text" + ANSWER)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("constraint", CONSTRAINTS)
def test_an_opened_thinking_must_close_before_the_answer(scripted, constraint, stream):
    grammar = submitted_grammar(scripted, "opens", stream=stream, **CONSTRAINTS[constraint])
    assert accepts(scripted, grammar, "Let me see.\n</think>\n\n" + ANSWER)
    assert not accepts(scripted, grammar, ANSWER)  # still inside the thinking


@pytest.mark.parametrize("stream", [False, True])
def test_tool_calls_come_after_the_thinking(scripted, stream):
    grammar = submitted_grammar(scripted, "hermes", stream=stream, tools=TINY_TOOLS, tool_choice="required")
    call = '<tool_call>\n{"name": "flag", "arguments": {"on": true}}\n</tool_call>'
    assert accepts(scripted, grammar, call)
    assert accepts(scripted, grammar, "<think>I could write <tool_call> here.</think>" + call)
    assert not accepts(scripted, grammar, "<think>hmm</think>no call")


@pytest.mark.parametrize("server, body", [
    ("may", {"reasoning_format": "none"}),  # the thinking is not split: the grammar holds from the start
    ("plain", {}),  # a template that cannot think
])
@pytest.mark.parametrize("stream", [False, True])
def test_unchanged_without_split_thinking(scripted, server, body, stream):
    grammar = submitted_grammar(scripted, server, stream=stream, **body, **CONSTRAINTS["json_schema"])
    assert accepts(scripted, grammar, ANSWER)
    assert not accepts(scripted, grammar, "<think>hmm</think>" + ANSWER)


@pytest.mark.parametrize("path", ["/completion", "/v1/completions"])
def test_completions_are_unchanged(scripted, path):
    grammar = submitted_grammar(scripted, "may", path, **CONSTRAINTS["json_schema"])
    assert not accepts(scripted, grammar, "<think>hmm</think>" + ANSWER)


# -- the tiny model: thinking runs free ------------------------------------------------------

@pytest.fixture(scope="module")
def opens_thinking(tiny_loaded, tiny_engine):  # noqa: F811
    server = serve(tiny_loaded, tiny_engine, OPENS_THINKING)
    with httpx.Client(base_url=server.url, timeout=120) as client:
        yield client
    server.stop()


@pytest.mark.parametrize("stream", [False, True])
def test_the_model_thinks_freely_before_a_grammar(opens_thinking, stream):
    """Before, the grammar forced "Five." from the first token; now the thinking comes first,
    with nothing to close it within 6 tokens."""
    request = {"messages": [{"role": "user", "content": "hi"}], "grammar": 'root ::= "Five."',
               "max_tokens": 6, "temperature": 1.0, "seed": 5, "stream": stream}
    response = opens_thinking.post("/v1/chat/completions", json=request)
    assert response.status_code == 200, response.text
    if stream:
        chunks = [event for event in sse_events(response.text) if event != "[DONE]" and event["choices"]]
        deltas = [chunk["choices"][0]["delta"] for chunk in chunks]
        reasoning = "".join(delta.get("reasoning_content") or "" for delta in deltas)
        content = "".join(delta.get("content") or "" for delta in deltas)
        finish = chunks[-1]["choices"][0]["finish_reason"]
    else:
        choice = response.json()["choices"][0]
        reasoning, content = choice["message"].get("reasoning_content", ""), choice["message"]["content"]
        finish = choice["finish_reason"]
    assert (finish, content) == ("length", "") and reasoning, json.dumps(response.text)[:300]


# -- Gemma 4: thinking opens with a control token and text ------------------------------------
# Gemma 4 writes `<|channel>thought\n...<channel|>`: `<|channel>` and `<channel|>` are control
# tokens of its vocabulary, "thought" is text. The tiny model here has both tokens (ids 267, 268).

CHANNEL, CHANNEL_END = "<|channel>", "<channel|>"
GEMMA4_MAY_THINK = MAY_THINK.replace("{# <think> #}", "{# <|channel>thought #}")
GEMMA4_HERMES = HERMES_TEMPLATE + "{# <|channel>thought #}"
GEMMA4_REPLY = '<|channel>thought\nThe user wants a small number: 7.<channel|>' + ANSWER


def _serve_model(loaded, engine, source: str) -> ServerThread:
    model = copy.copy(loaded)
    model.chat_template = ChatTemplate(source)
    state = ServerState(ServerSettings())
    state.attach(model, engine)
    return ServerThread(state).start()


@pytest.fixture(scope="module")
def gemma4_loaded(tmp_path_factory):
    path = write_tiny_llama_with_controls(tmp_path_factory.mktemp("gemma4") / "tiny.gguf", [CHANNEL, CHANNEL_END],
                                          n_ctx=2048)
    return lamplight.load(str(path))


@pytest.fixture(scope="module")
def gemma4_scripted(gemma4_loaded):
    engine = ScriptedEngine()
    servers = {name: _serve_model(gemma4_loaded, engine, source)
               for name, source in (("may", GEMMA4_MAY_THINK), ("hermes", GEMMA4_HERMES))}
    yield engine, {name: server.url for name, server in servers.items()}, gemma4_loaded.tokenizer
    for server in servers.values():
        server.stop()


def test_the_gemma4_fixture_has_the_control_tokens(gemma4_loaded):
    tokenizer = gemma4_loaded.tokenizer
    assert ChatTemplate(GEMMA4_MAY_THINK).reasoning.family == "gemma4"
    ids = tokenizer.encode(GEMMA4_REPLY, add_special=False, parse_special=True)
    assert ids[0] == 267 and tokenizer.is_control(267) and 268 in ids and tokenizer.is_control(268)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("constraint", CONSTRAINTS)
def test_gemma4_thinking_may_open_before_the_constrained_answer(gemma4_scripted, constraint, stream):
    """The thinking lead opens with the token `<|channel>` then the text "thought" (as one text
    literal it could never match: llguidance matches no control token with text)."""
    engine, _, _ = gemma4_scripted
    engine.script = script("ok", stop_type="eos")
    grammar = submitted_grammar(gemma4_scripted, "may", stream=stream, **CONSTRAINTS[constraint])
    assert accepts(gemma4_scripted, grammar, ANSWER)
    assert accepts(gemma4_scripted, grammar, GEMMA4_REPLY)
    assert accepts(gemma4_scripted, grammar, "<|channel>thought\nfree text, {not JSON<channel|>\n\n" + ANSWER)
    assert not accepts(gemma4_scripted, grammar, "<|channel>thought\nhmm<channel|>not the answer")
    assert not accepts(gemma4_scripted, grammar, "<|channel>thinking\nhmm<channel|>" + ANSWER)  # "thought" only
    assert not accepts(gemma4_scripted, grammar, "<|channel>thought\nno end " + ANSWER)


@pytest.mark.parametrize("stream", [False, True])
def test_gemma4_tool_calls_come_after_the_thinking(gemma4_scripted, stream):
    engine, _, _ = gemma4_scripted
    engine.script = script("ok", stop_type="eos")
    grammar = submitted_grammar(gemma4_scripted, "hermes", stream=stream, tools=TINY_TOOLS, tool_choice="required")
    call = '<tool_call>\n{"name": "flag", "arguments": {"on": true}}\n</tool_call>'
    assert accepts(gemma4_scripted, grammar, call)
    assert accepts(gemma4_scripted, grammar, "<|channel>thought\nI could write <tool_call> here.<channel|>" + call)
    assert not accepts(gemma4_scripted, grammar, "<|channel>thought\nhmm<channel|>no call")


def _reply(response: httpx.Response, stream: bool) -> tuple[str | None, str, str]:
    """(reasoning_content, content, finish_reason) of a chat reply, streamed or not."""
    assert response.status_code == 200, response.text
    if not stream:
        choice = response.json()["choices"][0]
        return choice["message"].get("reasoning_content"), choice["message"]["content"], choice["finish_reason"]
    chunks = [event for event in sse_events(response.text) if event != "[DONE]" and event["choices"]]
    deltas = [chunk["choices"][0]["delta"] for chunk in chunks]
    reasoning = "".join(delta.get("reasoning_content") or "" for delta in deltas)
    content = "".join(delta.get("content") or "" for delta in deltas)
    return reasoning, content, chunks[-1]["choices"][0]["finish_reason"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_gemma4_thinking_then_json_reply_splits(gemma4_scripted, stream):
    """The reply the grammar accepts (thinking opened by the control token, then the JSON) comes
    back as reasoning_content and content."""
    engine, urls, _ = gemma4_scripted
    grammar = submitted_grammar(gemma4_scripted, "may", **CONSTRAINTS["json_schema"])
    assert accepts(gemma4_scripted, grammar, GEMMA4_REPLY)
    engine.script = script(GEMMA4_REPLY, stop_type="eos")
    try:
        response = httpx.post(urls["may"] + "/v1/chat/completions", timeout=30, json={
            "messages": [{"role": "user", "content": "hi"}], "json_schema": SCHEMA, "stream": stream})
    finally:
        engine.script = script("ok", stop_type="eos")
    reasoning, content, finish = _reply(response, stream)
    assert (reasoning, content, finish) == ("The user wants a small number: 7.", ANSWER, "stop")


@pytest.fixture(scope="module")
def gemma4_model(gemma4_loaded):
    engine = build_engine(gemma4_loaded, EngineOptions(n_ctx=2048, n_parallel=2, n_ubatch=64))
    server = _serve_model(gemma4_loaded, engine, GEMMA4_MAY_THINK)
    with httpx.Client(base_url=server.url, timeout=120) as client:
        yield client
    server.stop()
    engine.stop()


# The tiny model thinks when pushed: a logit bias makes it open the thinking with `<|channel>`
# (the grammar then forces "thought"), makes `<channel|>` likely enough to end it after a few
# tokens, and keeps whitespace out (the space after the thinking could run on forever).
FORCED_THINKING = {"267": 100, "268": 10, "16": -100, "13": -100, "12": -100, "35": -100}
SEVEN = {"type": "object", "properties": {"n": {"enum": [7]}}, "required": ["n"]}


@pytest.mark.parametrize("stream", [False, True])
def test_the_tiny_model_thinks_then_answers_in_json(gemma4_model, stream):
    request = {"messages": [{"role": "user", "content": "hi"}], "json_schema": SEVEN, "max_tokens": 60,
               "temperature": 1.0, "seed": 5, "logit_bias": FORCED_THINKING, "stream": stream}
    reasoning, content, finish = _reply(gemma4_model.post("/v1/chat/completions", json=request), stream)
    assert finish == "stop" and json.loads(content) == {"n": 7}
    assert reasoning and CHANNEL not in reasoning and CHANNEL_END not in reasoning
    # deepseek-legacy keeps the whole reply in content: the markers are the model's tokens.
    whole = gemma4_model.post("/v1/chat/completions", json={**request, "stream": False,
                                                           "reasoning_format": "deepseek-legacy"})
    text = whole.json()["choices"][0]["message"]["content"]
    assert text.startswith("<|channel>thought") and text.endswith(CHANNEL_END + content)
