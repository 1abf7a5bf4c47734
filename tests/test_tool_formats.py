"""The native tool-call formats of DeepSeek R1/V3.1, Granite 3.x, Command R7B/R+ and Qwen3-Coder XML: recorded model
replies (written from the real templates in the reference folder) parse to calls, streamed and
not; grammars hold the model to each format; detection follows the template."""

from __future__ import annotations

import json

import pytest
from conftest import reference_text
from test_tools import test_streamed_deltas_reassemble_to_the_final_message as check_streamed_deltas
from test_tools import compile_plan, plan, reassemble, tiny, walk  # noqa: F401 (tiny is a fixture)

from lamplight.chat import ChatTemplate
from lamplight.tools import (
    CommandR7BFormat,
    CommandRPlusFormat,
    DeepSeekR1Format,
    DeepSeekV31Format,
    GlmFormat,
    GraniteFormat,
    QwenXmlFormat,
    ToolCallStream,
    ToolSpec,
    detect_format,
    message_json,
)

DEEPSEEK_R1_TWO = (
    "Let me look.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
    '{"city": "Paris", "days": 2}\n```<｜tool▁call▁end｜>\n'
    "<｜tool▁call▁begin｜>function<｜tool▁sep｜>noop\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>")
DEEPSEEK_V31_TWO = (
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\", \"days\": 2}"
    "<｜tool▁call▁end｜><｜tool▁call▁begin｜>noop<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>")
GRANITE_TWO = '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}, ' \
              '{"name": "noop", "arguments": {}}]'
COMMAND_R7B_TWO = ('<|START_ACTION|>[\n    {"tool_call_id": "0", "tool_name": "get_weather", '
                   '"parameters": {"city": "Paris", "days": 2}},\n    {"tool_call_id": "1", "tool_name": "noop", '
                   '"parameters": {}}\n]<|END_ACTION|>')
# As the Command R+ tool_use template writes an assistant turn with calls (its own format guide).
COMMAND_R_PLUS_TWO = ('I will look up the weather.\nAction:\n```json\n[\n    {\n        "tool_name": "get_weather",\n'
                      '        "parameters": {"city": "Paris", "days": 2}\n    },\n    {\n        "tool_name": "noop",\n'
                      '        "parameters": {}\n    }\n]\n```')
# As Qwen3.5's and Qwen3-Coder's templates write an assistant turn with text and two calls.
QWEN_XML_TWO = ("Let me look.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
                "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=noop>\n"
                "</function>\n</tool_call>")
# As GLM 4.6's template writes them, and GLM 4.7's (no newlines).
GLM_TWO = ("I will check.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
           "<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>\n<tool_call>noop\n</tool_call>")
GLM47_TWO = ("<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value><arg_key>days</arg_key>"
             "<arg_value>2</arg_value></tool_call><tool_call>noop</tool_call>")
TWO_CALLS = [("get_weather", '{"city":"Paris","days":2}'), ("noop", "{}")]

RECORDED = [
    (DeepSeekR1Format(), DEEPSEEK_R1_TWO, "Let me look."),
    (DeepSeekV31Format(), DEEPSEEK_V31_TWO, ""),
    (GraniteFormat(), GRANITE_TWO, ""),
    (CommandR7BFormat(), COMMAND_R7B_TWO, ""),
    (CommandRPlusFormat(), COMMAND_R_PLUS_TWO, "I will look up the weather.\n"),
    (QwenXmlFormat(), QWEN_XML_TWO, "Let me look."),
    (GlmFormat(), GLM_TWO, "I will check."),
    (GlmFormat(), GLM47_TWO, ""),
]


@pytest.mark.parametrize("fmt, text, content", RECORDED)
def test_recorded_replies_parse_to_calls(fmt, text, content):
    parsed = fmt.parse(text)
    assert parsed.content == content
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == TWO_CALLS


def test_command_r7b_ids_are_the_models():
    assert [c.id for c in CommandR7BFormat().parse(COMMAND_R7B_TWO).tool_calls] == ["0", "1"]


@pytest.mark.parametrize("fmt, text", [
    (DeepSeekR1Format(), "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\nnot json"),
    (DeepSeekV31Format(), "<｜tool▁calls▁begin｜>get_weather{}"),
    (GraniteFormat(), '<|tool_call|>{"name": "noop"}'),
    (CommandR7BFormat(), '<|START_ACTION|>[{"tool_call_id": "0", "tool_name": "noop", "parameters": {}}] trailing'),
    (CommandRPlusFormat(), 'Action:\n```json\n[{"tool_name": "noop", "parameters": {}}]\n``` and more'),
    (CommandRPlusFormat(), 'Action:\n```json\n{"tool_name": "noop", "parameters": {}}\n```'),
    (QwenXmlFormat(), "<tool_call>\n<function=noop>\n</function>"),  # cut before </tool_call>
    (QwenXmlFormat(), "<tool_call>\n{\"name\": \"noop\", \"arguments\": {}}\n</tool_call>"),  # Hermes JSON
    (QwenXmlFormat(), "<tool_call>\n<function=noop>\n<parameter=x>\n1\n</function>\n</tool_call>"),
    (GlmFormat(), "<tool_call>\n{\"name\": \"noop\", \"arguments\": {}}\n</tool_call>"),  # Hermes JSON
    (GlmFormat(), "<tool_call>noop<arg_key>x</arg_key>1</tool_call>"),  # no <arg_value>
    (GlmFormat(), "<tool_call>noop<arg_key>x</arg_key><arg_value>1</arg_value>"),  # cut
])
def test_malformed_calls_are_content(fmt, text):
    parsed = fmt.parse(text)
    assert parsed.content == text and not parsed.tool_calls


@pytest.mark.parametrize("fmt, text, _content", RECORDED + [
    (DeepSeekR1Format(), "Plain <｜tool▁calls answer, no calls.", None),
    (GraniteFormat(), "Plain text <|tool_ and more", None),
    (QwenXmlFormat(), "Plain <tool_c text, no calls.", None),
    (GlmFormat(), "Plain <tool_call> as words, not a call.", None),
])
def test_streamed_deltas_reassemble_to_the_final_message(fmt, text, _content):
    check_streamed_deltas(fmt, text)


@pytest.mark.parametrize("fmt, text", [(fmt, text) for fmt, text, _ in RECORDED])
def test_cut_replies_keep_their_finished_calls(fmt, text):
    expected = [(c.name, c.arguments) for c in fmt.parse(text).tool_calls]
    assert len(expected) == 2  # every recorded reply holds two calls
    found = []
    for cut in range(1, len(text)):
        parsed = fmt.parse_cut(text[:cut])
        assert [(c.name, c.arguments) for c in parsed.tool_calls] == expected[:len(parsed.tool_calls)]
        assert fmt.triggers[0] not in parsed.content  # never the wire text
        found.append(len(parsed.tool_calls))
    # Each call appears once it is finished and stays: the first one before the reply ends.
    assert found == sorted(found) and found[-1] >= 1


def one_call(fmt) -> str:
    """The first recorded call alone, as a complete reply."""
    return {
        "deepseek-r1": DEEPSEEK_R1_TWO.split("\n<｜tool▁call▁begin｜>")[0].removeprefix("Let me look.")
        + "<｜tool▁calls▁end｜>",
        "deepseek-v3.1": DEEPSEEK_V31_TWO.split("<｜tool▁call▁begin｜>noop")[0] + "<｜tool▁calls▁end｜>",
        "granite": '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}]',
        "command-r7b": '<|START_ACTION|>[{"tool_call_id": "0", "tool_name": "get_weather", '
                       '"parameters": {"city": "Paris", "days": 2}}]<|END_ACTION|>',
        "command-r-plus": 'Action:\n```json\n[{"tool_name": "get_weather", "parameters": {"city": "Paris", "days": 2}}]'
                          '\n```',
        "qwen3-coder": QWEN_XML_TWO.split("\n<tool_call>\n<function=noop>")[0].removeprefix("Let me look.\n\n"),
        "glm-4.5": GLM_TWO.split("\n<tool_call>noop")[0].removeprefix("I will check.\n"),
    }[fmt.name]


GRAMMAR_FORMATS = [DeepSeekR1Format(), DeepSeekV31Format(), GraniteFormat(), CommandR7BFormat(), CommandRPlusFormat()]


@pytest.mark.parametrize("fmt", GRAMMAR_FORMATS, ids=lambda f: f.name)
def test_grammars(tiny, fmt):
    def check(text, choice="auto", parallel=True):
        return walk(tiny, compile_plan(tiny, plan(fmt, choice, parallel)), text)

    two = {"deepseek-r1": DEEPSEEK_R1_TWO.removeprefix("Let me look."), "deepseek-v3.1": DEEPSEEK_V31_TWO,
           "granite": GRANITE_TWO, "command-r7b": COMMAND_R7B_TWO.replace("\n    ", "").replace("\n", ""),
           "command-r-plus": COMMAND_R_PLUS_TWO.removeprefix("I will look up the weather.\n")}[fmt.name]
    assert check(one_call(fmt), "required", parallel=False) == "done"
    assert check(two, "required") in ("done", "accepting")
    assert check(two, "required", parallel=False) == "refused"
    assert check("Plain text " + one_call(fmt), "required") == "refused"
    assert check("Plain text " + one_call(fmt), "auto") in ("done", "accepting")
    assert check("Only text", "auto") == "accepting"
    bad = one_call(fmt).replace('"Paris"', "3")  # city must be a string
    assert check(bad, "required") == "refused"


@pytest.mark.parametrize("template, name", [
    ("llama-cpp-deepseek-r1.jinja", "deepseek-r1"),
    ("ibm-granite-granite-3.3-2B-Instruct.jinja", "granite"),
    ("CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja", "command-r7b"),
    ("CohereForAI-c4ai-command-r-plus-tool_use.jinja", "command-r-plus"),
    ("openai-gpt-oss-120b.jinja", "gpt-oss"),
    ("ibm-granite-granite-4.0.jinja", "hermes"),  # Granite 4 writes <tool_call> blocks
    ("Qwen-Qwen3-0.6B.jinja", "hermes"),
    ("Qwen3.5-4B.jinja", "qwen3-coder"),  # <tool_call> with <function=...> and <parameter=...> inside
    ("Qwen3-Coder.jinja", "qwen3-coder"),
    ("GLM-4.6.jinja", "glm-4.5"),  # <tool_call>NAME then <arg_key>/<arg_value> pairs
    ("GLM-4.7-Flash.jinja", "glm-4.5"),
    ("poolside-Laguna-XS.2.jinja", "glm-4.5"),
    # These do not render `tools`; llama.cpp checks the DeepSeek markers first all the same
    # (tests/test_tool_detection.py).
    ("deepseek-ai-DeepSeek-V3.1.jinja", "deepseek-v3.1"),
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", "deepseek-r1"),
    ("deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja", "deepseek-r1"),
])
def test_detected_from_the_real_templates(template, name):
    assert detect_format(ChatTemplate(reference_text(f"templates/{template}"))).name == name


def test_deepseek_v31_detection_by_its_source():
    assert detect_format(ChatTemplate("{{ tools }}{{ message['prefix'] }}{% if thinking %}{% endif %}"
                                      "<｜tool▁calls▁begin｜>")).name == "deepseek-v3.1"


@pytest.mark.parametrize("template, tool_calls, parallel", [
    ("Qwen-Qwen2.5-7B-Instruct.jinja", True, True),
    ("llama-cpp-deepseek-r1.jinja", True, True),
    ("CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja", True, True),
    ("meta-llama-Llama-3.1-8B-Instruct.jinja", True, False),  # raises on a second call
    ("google-gemma-2-2b-it.jinja", False, False),
    ("mistralai-Mistral-Nemo-Instruct-2407.jinja", True, True),  # the rest: tests/test_template_caps.py
])
def test_template_caps_for_props(template, tool_calls, parallel):
    from lamplight.server.routes_misc import _template_caps

    caps = _template_caps(ChatTemplate(reference_text(f"templates/{template}")))
    assert (caps["supports_tool_calls"], caps["supports_parallel_tool_calls"]) == (tool_calls, parallel)


def test_qwen_xml_values_follow_the_tools_schema():
    tools = [ToolSpec("f", "", {"type": "object", "properties": {
        "text": {"type": "string"}, "n": {"type": "number"}, "flag": {"type": "boolean"},
        "items": {"type": "array"}, "any": {}}})]
    fmt = QwenXmlFormat().for_tools(tools)
    reply = ("<tool_call>\n<function=f>\n<parameter=text>\n42\n</parameter>\n<parameter=n>\n2.5\n</parameter>\n"
             "<parameter=flag>\nTrue\n</parameter>\n<parameter=items>\n[1, \"a\"]\n</parameter>\n"
             "<parameter=any>\ntwo\nlines\n</parameter>\n</function>\n</tool_call>")
    (call,) = fmt.parse(reply).tool_calls
    assert json.loads(call.arguments) == {"text": "42", "n": 2.5, "flag": True, "items": [1, "a"], "any": "two\nlines"}
    # Without the schema (a bare format) a value that reads as a JSON number is one.
    assert json.loads(QwenXmlFormat().parse(reply).tool_calls[0].arguments)["text"] == 42


ENUMS = ToolSpec("f", "", {"type": "object", "properties": {
    "unit": {"enum": ["c", "f"]}, "mode": {"type": "string", "const": "fast"},
    "n": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
    "either": {"type": ["string", "integer"]}}, "required": ["unit", "mode", "n", "either"]})


def _enums_call(unit: str, mode: str, n: str, either: str) -> str:
    values = {"unit": unit, "mode": mode, "n": n, "either": either}
    return ("<tool_call>\n<function=f>\n" + "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in values.items())
            + "</function>\n</tool_call>")


def test_qwen_xml_values_typed_by_enum_const_and_any_of(tiny):
    """The value types come from `enum`, `const` and `anyOf` when there is no `type` (llama.cpp's
    value_types): string enums are written and read as bare text, as the templates write them."""
    from lamplight.tools import ToolPlan

    fmt = QwenXmlFormat().for_tools([ENUMS])
    (call,) = fmt.parse(_enums_call("c", "fast", "3", "7")).tool_calls
    assert json.loads(call.arguments) == {"unit": "c", "mode": "fast", "n": 3, "either": 7}
    assert json.loads(fmt.parse(_enums_call("f", "fast", "null", "seven")).tool_calls[0].arguments)["either"] == "seven"
    grammar = compile_plan(tiny, ToolPlan(fmt, [ENUMS], [], "required", None, False))
    assert walk(tiny, grammar, _enums_call("c", "fast", "3", "any text")) == "done"
    assert walk(tiny, grammar, _enums_call('"c"', "fast", "3", "7")) == "refused"  # never JSON-quoted
    assert walk(tiny, grammar, _enums_call("k", "fast", "3", "7")) == "refused"  # the enum holds
    assert walk(tiny, grammar, _enums_call("c", "slow", "3", "7")) == "refused"  # so does the const
    assert walk(tiny, grammar, _enums_call("c", "fast", "three", "7")) == "refused"  # integer or null


def test_qwen_xml_grammar_holds_calls_to_their_tools(tiny):
    fmt = QwenXmlFormat()

    def check(text, choice="auto", parallel=True):
        return walk(tiny, compile_plan(tiny, plan(fmt, choice, parallel)), text)

    one = one_call(fmt)
    two = QWEN_XML_TWO.removeprefix("Let me look.\n\n")
    assert check(one, "required", parallel=False) == "done"
    assert check(two, "required") in ("done", "accepting")
    assert check(two, "required", parallel=False) == "refused"
    assert check("Plain text " + one, "auto") in ("done", "accepting")
    assert check("Plain text " + one, "required") == "refused"
    assert check(one.replace("<parameter=city>\nParis\n</parameter>\n", ""), "required") == "refused"  # required
    assert check(one.replace("\n2\n", "\ntwo\n"), "required") == "refused"  # days is an integer
    assert check(one.replace("Paris", "Paris, </para or not"), "required", parallel=False) == "done"  # text up to the tag
    assert check(one.replace("get_weather", "get_news"), "required") == "refused"


def test_glm_grammar_holds_calls_to_their_tools(tiny):
    fmt = GlmFormat()

    def check(text, choice="auto", parallel=True):
        return walk(tiny, compile_plan(tiny, plan(fmt, choice, parallel)), text)

    one = one_call(fmt)
    assert check(one, "required", parallel=False) == "done"
    assert check(GLM47_TWO, "required") in ("done", "accepting")  # no newlines at all (GLM 4.7)
    assert check(GLM_TWO.removeprefix("I will check.\n"), "required") in ("done", "accepting")
    assert check(GLM_TWO.removeprefix("I will check.\n"), "required", parallel=False) == "refused"
    assert check("I will check.\n" + one, "auto") in ("done", "accepting")
    assert check("I will check.\n" + one, "required") == "refused"
    assert check(one.replace("<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n", ""), "required") == "refused"
    assert check(one.replace(">2<", ">two<"), "required") == "refused"  # days is an integer
    assert check(one.replace("get_weather", "get_news"), "required") == "refused"
