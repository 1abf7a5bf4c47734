"""Template capabilities (lamplight.chat.caps) over every real template of
shared/reference/templates/, as /props reports them in `chat_template_caps`.

supports_tool_calls: the template renders an assistant turn's tool call (its function name shows).
The expectation is derived from the source: a template that never names `tool_calls` cannot render
one; every other reference template does, in some conversation llama.cpp probes with (Mistral's
need 9-character ids and user/assistant alternation outside tool turns, DeepSeek R1 distills a
call turn without content, functionary v3.2 text arguments)."""

from __future__ import annotations

import pytest
from conftest import reference_path

from lamplight.chat import ChatTemplate
from lamplight.server.routes_misc import _template_caps

TEMPLATES = reference_path("templates")  # every test here reads them: absent, the module skips
NAMES = sorted(path.name for path in TEMPLATES.glob("*.jinja"))

# Templates that never render a tool call: none names `tool_calls`.
NO_TOOL_CALLS = {
    "HuggingFaceTB-SmolLM3-3B.jinja": "renders content only (its tools go in as xml_tools)",
    "LFM2-8B-A1B.jinja": "the model writes its calls into the content; the template renders content only",
    "LFM2.5-Instruct.jinja": "as LFM2",
    "google-gemma-2-2b-it.jinja": "no tools at all",
    # Granite 3.3 lists `tools` but renders an assistant turn as its content alone: a call is lost
    # (llama.cpp renders the tool_result conversation the same way, renderings.jsonl), and
    # llama.cpp's probe (common/jinja/caps.cpp) marks tool calls as supported only when the
    # template reads `tool_calls`.
    "ibm-granite-granite-3.3-2B-Instruct.jinja": "renders content only",
    "llama-cpp-rwkv-world.jinja": "no tools at all",
    "microsoft-Phi-3.5-mini-instruct.jinja": "no tools at all",
}

# Templates that render one call per assistant turn only.
ONE_CALL_ONLY = {
    "meta-llama-Llama-3.1-8B-Instruct.jinja": "raises 'This model only supports single tool-calls at once!'",
    "meta-llama-Llama-3.2-3B-Instruct.jinja": "raises likewise",
    "meta-llama-Llama-3.3-70B-Instruct.jinja": "raises likewise",
    "GigaChat3-10B-A1.8B.jinja": "renders tool_calls[0] only",
    "GigaChat3.1-10B-A1.8B.jinja": "renders tool_calls[0] only",
    "openai-gpt-oss-120b.jinja": "renders tool_calls[0] only",
}

# Templates whose calls the old probe (a user turn right after the tool results, ids "call_0___",
# arguments as JSON text) could not render, and which now report tool calls.
NEWLY_SUPPORTED = {
    "mistralai-Mistral-Nemo-Instruct-2407.jinja",  # user/assistant alternation outside tool turns
    "Mistral-Small-3.2-24B-Instruct-2506.jinja",  # likewise
    "mistralai-Ministral-3-14B-Reasoning-2512.jinja",  # likewise
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja",  # renders calls only when content is null
    "meetkai-functionary-medium-v3.2.jinja",  # `'...' + arguments`: arguments as text only
}

_CAPS: dict[str, dict] = {}


def caps(name: str) -> dict:
    if name not in _CAPS:
        source = (TEMPLATES / name).read_text(encoding="utf-8")
        _CAPS[name] = _template_caps(ChatTemplate(source, bos_token="<s>", eos_token="</s>", name=name))
    return _CAPS[name]


def test_the_expected_sets_name_reference_templates():
    assert set(NO_TOOL_CALLS) | set(ONE_CALL_ONLY) | NEWLY_SUPPORTED <= set(NAMES)
    assert len(NAMES) == 68


def test_tool_calls_are_supported_exactly_where_the_template_renders_them():
    reported = {name for name in NAMES if caps(name)["supports_tool_calls"]}
    never_named = {name for name in NAMES if "tool_calls" not in (TEMPLATES / name).read_text(encoding="utf-8")}
    assert never_named == set(NO_TOOL_CALLS)
    assert reported == set(NAMES) - set(NO_TOOL_CALLS)
    assert NEWLY_SUPPORTED <= reported


def test_parallel_tool_calls_are_supported_where_two_calls_render():
    reported = {name for name in NAMES if caps(name)["supports_parallel_tool_calls"]}
    assert reported == set(NAMES) - set(NO_TOOL_CALLS) - set(ONE_CALL_ONLY)


@pytest.mark.parametrize("name, tool_calls, parallel", [
    ("mistralai-Mistral-Nemo-Instruct-2407.jinja", True, True),
    ("ibm-granite-granite-3.3-2B-Instruct.jinja", False, False),
    ("google-gemma-2-2b-it.jinja", False, False),
    ("microsoft-Phi-3.5-mini-instruct.jinja", False, False),
    ("meta-llama-Llama-3.1-8B-Instruct.jinja", True, False),
    ("Qwen-Qwen2.5-7B-Instruct.jinja", True, True),
])
def test_props_caps_of_named_templates(name, tool_calls, parallel):
    reported = caps(name)
    assert (reported["supports_tool_calls"], reported["supports_parallel_tool_calls"]) == (tool_calls, parallel)


@pytest.mark.parametrize("name, object_arguments", [
    # Mistral's templates write `arguments|tojson`: an object, as the model wrote it (text
    # arguments would show as a JSON string of JSON).
    ("mistralai-Mistral-Nemo-Instruct-2407.jinja", True),
    ("Mistral-Small-3.2-24B-Instruct-2506.jinja", True),
    ("mistralai-Ministral-3-14B-Reasoning-2512.jinja", True),
    # `'...' + arguments` takes text only.
    ("meetkai-functionary-medium-v3.2.jinja", False),
    ("deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja", False),
    ("llama-cpp-deepseek-r1.jinja", True),
    ("Qwen-Qwen2.5-7B-Instruct.jinja", True),
])
def test_object_arguments(name, object_arguments):
    assert caps(name)["supports_object_arguments"] is object_arguments


def test_mistral_nemo_renders_a_past_call_with_its_id():
    """What the caps make possible: a conversation with calls renders for Nemo, arguments as an
    object, when the ids are Mistral's 9 characters and turns alternate."""
    source = (TEMPLATES / "mistralai-Mistral-Nemo-Instruct-2407.jinja").read_text(encoding="utf-8")
    chat = ChatTemplate(source, bos_token="<s>", eos_token="</s>")
    prompt = chat.render([
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "a1b2c3d4e", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "a1b2c3d4e", "content": "3C"},
        {"role": "assistant", "content": "It is 3C."},
        {"role": "user", "content": "Thanks"},
    ])
    assert '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo"}, "id": "a1b2c3d4e"}]' in prompt


NULL_CONTENT_CALL = [
    {"role": "user", "content": "Weather in Oslo?"},
    {"role": "assistant", "content": None, "tool_calls": [  # as the openai client sends it back
        {"id": "call00001", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
    {"role": "tool", "tool_call_id": "call00001", "content": '{"temp": 3}'},
    {"role": "user", "content": "And tomorrow?"},
]


@pytest.mark.parametrize("name", NAMES)
def test_a_call_with_null_content_renders_as_one_with_empty_content(name):
    """llama-server holds a message's content as a string, so every template gets "" for null:
    Qwen3's (`'</think>' in content`) no longer fails, GLM's no longer prints "None", the DeepSeek
    R1 distills render what llama.cpp renders for ""."""
    from lamplight.server.chat_prompt import render_chat_prompt
    from lamplight.server.errors import ApiError

    chat = ChatTemplate((TEMPLATES / name).read_text(encoding="utf-8"))
    empty = [dict(m) for m in NULL_CONTENT_CALL]
    empty[1]["content"] = ""
    try:
        with_empty = render_chat_prompt({"messages": empty}, chat)
    except ApiError:
        pytest.skip("the template refuses this conversation (as llama.cpp does: Mistral's, Gemma 2's alternation)")
    with_null = render_chat_prompt({"messages": NULL_CONTENT_CALL}, chat)
    assert with_null == with_empty and "None" not in with_null
    if name == "Qwen-Qwen3-0.6B.jinja":
        assert "<function" not in with_null and "get_weather" in with_null


def _weather_call(call_id: str, city: str) -> dict:
    return {"id": call_id, "type": "function",
            "function": {"name": "get_weather", "arguments": f'{{"city": "{city}"}}'}}


def test_r1_distill_renders_a_null_content_round_trip_as_llama_cpp():
    """Issue 24: with `content: null`, llama.cpp's rendering has the empty assistant turn after
    the calls (`<｜Assistant｜><｜end▁of▁sentence｜>`, the template's `content is not none` branch)."""
    from lamplight.server.chat_prompt import render_chat_prompt

    chat = ChatTemplate((TEMPLATES / "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja").read_text(encoding="utf-8"),
                        bos_token="<|im_start|>")
    body = {"messages": [
        {"role": "user", "content": "Weather in Oslo and Rome?"},
        {"role": "assistant", "content": None,
         "tool_calls": [_weather_call("call_1", "Oslo"), _weather_call("call_2", "Rome")]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 3}'},
        {"role": "tool", "tool_call_id": "call_2", "content": '{"temp": 18}'},
        {"role": "user", "content": "Thanks. And tomorrow?"},
    ]}
    expected = ("<|im_start|><｜User｜>Weather in Oslo and Rome?"
                "<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
                '```json\n{"city": "Oslo"}\n```<｜tool▁call▁end｜>'
                "\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
                '```json\n{"city": "Rome"}\n```<｜tool▁call▁end｜>'
                "<｜tool▁calls▁end｜><｜end▁of▁sentence｜>"
                "<｜Assistant｜><｜end▁of▁sentence｜>"
                '<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>{"temp": 3}<｜tool▁output▁end｜>'
                '\n<｜tool▁output▁begin｜>{"temp": 18}<｜tool▁output▁end｜>'
                "<｜User｜>Thanks. And tomorrow?<｜Assistant｜><think>\n")
    assert render_chat_prompt(body, chat, for_generation=False) == expected  # /apply-template
    assert render_chat_prompt(body, chat) == expected  # the prompt of a generation without tools
