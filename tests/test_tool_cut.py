"""Tool calls cut by max_tokens: the complete calls come back as `tool_calls` with
finish_reason "length", never the wire text of a half-written call, streamed or not. Parsers are
checked on recorded cut replies of every format, the API on a scripted engine (exact replies);
test_server_tools.py cuts the tiny model's grammar-forced calls."""

from __future__ import annotations

import copy

import httpx
import pytest
from conftest import missing_reference, reference_dir
from test_server_support import ScriptedEngine, ServerThread, sse_events
from test_server_tools import HERMES_TEMPLATE, TINY_TOOLS, reassemble_stream
from tiny_gguf import write_tiny_llama

import lamplight
from lamplight.chat import ChatTemplate
from lamplight.engine.types import FinalEvent, Timings, TokenEvent
from lamplight.server import ServerSettings, ServerState
from lamplight.tools import GenericFormat, HermesFormat, Llama3Format, MistralFormat

PICK = '{"name": "pick", "arguments": {"n": 1, "unit": "c"}}'
PICK_ARGS = '{"n":1,"unit":"c"}'
# The same call as Qwen3.5's template writes it (Qwen3-Coder's XML).
PICK_XML = ("<tool_call>\n<function=pick>\n<parameter=n>\n1\n</parameter>\n<parameter=unit>\nc\n</parameter>\n"
            "</function>\n</tool_call>")

CUT_REPLIES = [
    # (format, reply cut by max_tokens, expected content, expected complete calls)
    (GenericFormat(), '{"tool_calls": [' + PICK + ', {"name": "flag", "argum', "", [("pick", PICK_ARGS)]),
    (GenericFormat(), '{"tool_calls": [{"name": "pi', "", []),
    (GenericFormat(), '{"tool_call": {"name": "pick", "arguments": {"n": 1', "", []),
    (GenericFormat(), '{"response": "Hello wor', "Hello wor", []),
    (HermesFormat(), "Sure.\n<tool_call>\n" + PICK + "\n</tool_call>\n<tool_call>\n{\"name\": \"fl",
     "Sure.\n", [("pick", PICK_ARGS)]),
    (HermesFormat(), "<tool_call>\n" + PICK + "\n</tool", "", [("pick", PICK_ARGS)]),
    (HermesFormat(), "Just text, cut ", "Just text, cut ", []),
    (Llama3Format(), '{"name": "pick", "parameters": {"n": ', "", []),
    (MistralFormat(), '[TOOL_CALLS][{"name": "pick", "arguments": {"n": 1, "unit": "c"}, "id": "abcdefghi"}, {"na',
     "", [("pick", PICK_ARGS)]),
]


@pytest.mark.parametrize("fmt, text, content, calls", CUT_REPLIES)
def test_cut_reply_keeps_complete_calls_only(fmt, text, content, calls):
    parsed = fmt.parse_cut(text)
    assert parsed.content == content
    assert [(call.name, call.arguments) for call in parsed.tool_calls] == calls


# -- through the API, scripted -----------------------------------------------------------------

def _final(content: str, n_decoded: int, stop_type: str) -> FinalEvent:
    return FinalEvent(choice=0, content=content, token_ids=tuple(range(100, 100 + n_decoded)),
                      stop_type=stop_type, stopping_word="", truncated=False, n_prompt=3, n_cached=0,
                      n_decoded=n_decoded, tokens_cached=3 + n_decoded, id_slot=0,
                      timings=Timings(0, 3, 1.0, n_decoded, 2.0), has_new_line=False)


def script(text: str, stop_type: str = "limit", piece: int = 5) -> list:
    """The engine's events for `text`, `piece` characters a token."""
    pieces = [text[i:i + piece] for i in range(0, len(text), piece)]
    tokens = [TokenEvent(choice=0, token_id=100 + n, text=p, n_decoded=n + 1) for n, p in enumerate(pieces)]
    return tokens + [_final(text, len(pieces), stop_type)]


REAL_TEMPLATES = {"qwen-xml": "Qwen3.5-4B.jinja", "glm": "GLM-4.7-Flash.jinja", "qwen3": "Qwen-Qwen3-0.6B.jinja"}


class ServerUrls(dict):
    """Each server's URL by template. A real template absent from the reference data has no
    server: only the tests asking for it skip, naming the missing file."""

    def __missing__(self, name: str):
        __tracebackhide__ = True  # reported at the test's line
        pytest.skip(missing_reference(reference_dir() / "templates" / REAL_TEMPLATES[name]))


@pytest.fixture(scope="module")
def scripted(tmp_path_factory):
    loaded = lamplight.load(str(write_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny.gguf")))
    engine = ScriptedEngine()
    servers = {}
    sources = {"generic": None, "hermes": HERMES_TEMPLATE}
    for name, file in REAL_TEMPLATES.items():
        path = reference_dir() / "templates" / file
        if path.is_file():
            sources[name] = path.read_text(encoding="utf-8")
    for name, source in sources.items():
        model = copy.copy(loaded)
        if source is not None:
            model.chat_template = ChatTemplate(source)
        state = ServerState(ServerSettings())
        state.attach(model, engine)
        servers[name] = ServerThread(state).start()
    yield engine, ServerUrls({name: server.url for name, server in servers.items()})
    for server in servers.values():
        server.stop()


CUT_CASES = [
    ("generic", '{"tool_calls": [' + PICK + ', {"name": "flag", "arguments": {"o', "required"),
    ("hermes", "<tool_call>\n" + PICK + "\n</tool_call>\n<tool_call>\n{\"name\": \"flag\", \"arguments\": {\"o", "required"),
    ("hermes", "<tool_call>\n" + PICK + "\n</tool_call>\n<tool_call>\n{\"name\": \"flag\", \"arg", "auto"),
    # Qwen3.5's generation prompt opens the thinking: the calls come after it.
    ("qwen-xml", "Hm.</think>\n\n" + PICK_XML + "\n<tool_call>\n<function=flag>\n<parameter=on>\ntr", "required"),
    ("qwen-xml", "Hm.</think>\n\n" + PICK_XML + "\n<tool_call>\n<funct", "auto"),
]


@pytest.mark.parametrize("template, reply, choice", CUT_CASES)
def test_cut_calls_over_the_api(scripted, template, reply, choice):
    engine, urls = scripted
    request = {"messages": [{"role": "user", "content": "hi"}], "tools": TINY_TOOLS, "tool_choice": choice,
               "max_tokens": 30}
    engine.script = script(reply)
    body = httpx.post(f"{urls[template]}/v1/chat/completions", json=request, timeout=10).json()
    choice_json = body["choices"][0]
    assert choice_json["finish_reason"] == "length"
    assert choice_json["message"]["content"] is None
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in choice_json["message"]["tool_calls"]] \
        == [("pick", PICK_ARGS)]

    engine.script = script(reply)
    events = sse_events(httpx.post(f"{urls[template]}/v1/chat/completions", json={**request, "stream": True},
                                   timeout=10).text)
    content, calls, finish = reassemble_stream(events)
    assert finish == "length" and content == ""
    # The cut call's name and first fragments went out before the cut; the finished one is whole.
    assert (calls[0]["name"], calls[0]["arguments"]) == ("pick", PICK_ARGS)
    assert all("tool_calls\"" not in c["arguments"] for c in calls)


def test_cut_response_text_is_content(scripted):
    engine, urls = scripted
    engine.script = script('{"response": "Hello wor')
    body = httpx.post(f"{urls['generic']}/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "tools": TINY_TOOLS, "max_tokens": 9}, timeout=10).json()
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "Hello wor"}
    assert body["choices"][0]["finish_reason"] == "length"


def test_a_qwen_xml_reply_is_a_tool_call_over_the_api(scripted):
    engine, urls = scripted
    request = {"messages": [{"role": "user", "content": "hi"}], "tools": TINY_TOOLS, "max_tokens": 100}
    reply = "The user wants a digit.\n</think>\n\nPicking.\n\n" + PICK_XML  # after the opened thinking
    engine.script = script(reply, stop_type="eos")
    message = httpx.post(f"{urls['qwen-xml']}/v1/chat/completions", json=request, timeout=10).json()["choices"][0]
    assert message["finish_reason"] == "tool_calls" and message["message"]["content"] == "Picking."
    assert message["message"]["reasoning_content"] == "The user wants a digit."
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in message["message"]["tool_calls"]] \
        == [("pick", PICK_ARGS)]
    engine.script = script(reply, stop_type="eos")
    events = sse_events(httpx.post(f"{urls['qwen-xml']}/v1/chat/completions", json={**request, "stream": True},
                                   timeout=10).text)
    content, calls, finish = reassemble_stream(events)
    assert (content, finish) == ("Picking.", "tool_calls")
    assert [(c["name"], c["arguments"]) for c in calls] == [("pick", PICK_ARGS)]


def test_a_glm_reply_is_a_tool_call_over_the_api(scripted):
    engine, urls = scripted
    request = {"messages": [{"role": "user", "content": "hi"}], "tools": TINY_TOOLS, "max_tokens": 100}
    reply = ("A digit.</think><tool_call>pick<arg_key>n</arg_key><arg_value>1</arg_value>"
             "<arg_key>unit</arg_key><arg_value>c</arg_value></tool_call>")  # as GLM 4.7 writes it
    for stream in (False, True):
        engine.script = script(reply, stop_type="eos")
        response = httpx.post(f"{urls['glm']}/v1/chat/completions", json={**request, "stream": stream}, timeout=10)
        if stream:
            content, calls, finish = reassemble_stream(sse_events(response.text))
            calls = [(c["name"], c["arguments"]) for c in calls]
        else:
            choice = response.json()["choices"][0]
            content, finish = choice["message"]["content"], choice["finish_reason"]
            calls = [(c["function"]["name"], c["function"]["arguments"]) for c in choice["message"]["tool_calls"]]
        assert (finish, calls) == ("tool_calls", [("pick", PICK_ARGS)]) and not content


def test_a_call_turn_with_null_content_is_accepted_by_qwen3s_template(scripted):
    """What the openai client sends back after a call: Qwen3's template tests `'</think>' in
    content` and failed on null."""
    engine, urls = scripted
    history = [{"role": "user", "content": "Pick one."},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "call_1", "type": "function", "function": {"name": "pick", "arguments": PICK_ARGS}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "7"}]
    engine.script = script("It is 7.", stop_type="eos")
    response = httpx.post(f"{urls['qwen3']}/v1/chat/completions", timeout=10,
                          json={"messages": history, "tools": TINY_TOOLS, "max_tokens": 20})
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == "It is 7."
