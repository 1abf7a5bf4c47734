"""lamplight.tools without a server: the partial JSON scanner, every format's parser (complete,
streamed prefixes, several calls, malformed), stream deltas, grammars (with lazy activation),
format detection and the generic protocol's prompt."""

from __future__ import annotations

import json

import pytest
from tiny_gguf import write_tiny_llama

import lamplight
from lamplight.chat import ChatTemplate
from lamplight.grammar import GrammarCompiler, fill_masks
from lamplight.tools import (
    GenericFormat,
    HermesFormat,
    Llama3Format,
    MistralFormat,
    ToolCallStream,
    ToolPlan,
    ToolRequestError,
    ToolSpec,
    detect_format,
    message_json,
    plan_tool_calling,
    prompt_inputs,
)
from lamplight.tools.json_scan import JsonMalformed, minify, partial_string_value, scan_value

WEATHER = ToolSpec("get_weather", "The weather in a city", {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]})
NOOP = ToolSpec("noop", "", {"type": "object"})
TOOLS = [WEATHER, NOOP]
RAW_TOOLS = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                               "parameters": t.parameters}} for t in TOOLS]


def plan(fmt, choice="auto", parallel=True, forced=None) -> ToolPlan:
    return ToolPlan(fmt, TOOLS, RAW_TOOLS, choice, forced, parallel)


def calls_of(parsed) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls]


# -- partial JSON -------------------------------------------------------------------------------

def test_scan_value_prefixes():
    text = '{"a": [1, -2.5e3, true, null], "b": {"c": "x\\"y\\u00e9"}, "d": false}'
    for n in range(len(text)):
        node = scan_value(text[:n], 0)
        assert node is None or not node.complete
    node = scan_value(text, 0)
    assert node.complete and node.value(text) == json.loads(text)
    assert node.keys(text) == ["a", "b", "d"]
    assert node.get(text, "b").get(text, "c").value(text) == 'x"y\u00e9'


@pytest.mark.parametrize("bad", ['{"a" 1}', "[1 2]", '{"a": tru e}', "{a: 1}", '"\\x"', "01", '{"a": 1]', "]"])
def test_scan_value_malformed(bad):
    with pytest.raises(JsonMalformed):
        scan_value(bad, 0)


def test_partial_string_value_only_grows():
    text = '"caf\\u00e9 \\ud83d\\ude00 \\n ok"'
    seen = ""
    for n in range(1, len(text) + 1):
        node = scan_value(text[:n], 0)
        value = partial_string_value(text[:n], node)
        assert value.startswith(seen)
        seen = value
    assert seen == "caf\u00e9 \U0001F600 \n ok"


def test_minify_prefixes_are_prefixes():
    raw = '{ "a" : [ 1 , 2 ] ,\n "s": "x  y\\" z" }'
    whole = minify(raw)
    assert whole == '{"a":[1,2],"s":"x  y\\" z"}' and json.loads(whole) == json.loads(raw)
    for n in range(len(raw)):
        assert whole.startswith(minify(raw[:n]))


# -- parsers ------------------------------------------------------------------------------------

HERMES_TWO = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n'
              '</tool_call>\n<tool_call>\n{"name": "noop", "arguments": {}}\n</tool_call>')
GENERIC_TWO = '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}, ' \
              '{"name": "noop", "arguments": {}}]}'
MISTRAL_TWO = ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}, "id": "a1b2c3d4e"}, '
               '{"name": "noop", "arguments": {}, "id": "zzzzzzzzz"}]')
TWO_CALLS = [("get_weather", {"city": "Paris", "days": 2}), ("noop", {})]

COMPLETE_CASES = [
    (HermesFormat(), HERMES_TWO, "Let me check.\n", TWO_CALLS),
    (HermesFormat(), '<tool_call>\n{"name": "noop", "arguments": {}}\n</tool_call>', "", [("noop", {})]),
    (HermesFormat(), "Just text, no call.", "Just text, no call.", []),
    (GenericFormat(), GENERIC_TWO, "", TWO_CALLS),
    (GenericFormat(), '{"tool_call": {"name": "noop", "arguments": {"x": [1, {"y": null}]}}}', "",
     [("noop", {"x": [1, {"y": None}]})]),
    (GenericFormat(), '{"response": "It is \\"sunny\\" \\u2600"}', 'It is "sunny" \u2600', []),
    (Llama3Format(), '{"name": "get_weather", "parameters": {"city": "Oslo"}}', "", [("get_weather", {"city": "Oslo"})]),
    (Llama3Format(True), 'Searching <|python_tag|>{"name": "noop", "parameters": {}}', "Searching ", [("noop", {})]),
    (Llama3Format(), "Hello there", "Hello there", []),
    (MistralFormat(), MISTRAL_TWO, "", TWO_CALLS),
    (MistralFormat(), "Plain answer.", "Plain answer.", []),
]


@pytest.mark.parametrize("fmt, text, content, calls", COMPLETE_CASES)
def test_parse_complete(fmt, text, content, calls):
    parsed = fmt.parse(text)
    assert parsed.content == content
    assert calls_of(parsed) == calls


def test_model_ids_are_kept_where_the_format_has_them():
    assert [c.id for c in MistralFormat().parse(MISTRAL_TWO).tool_calls] == ["a1b2c3d4e", "zzzzzzzzz"]
    assert [c.id for c in HermesFormat().parse(HERMES_TWO).tool_calls] == [None, None]


@pytest.mark.parametrize("fmt, text", [
    (HermesFormat(), '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par'),  # cut by max_tokens
    (HermesFormat(), "<tool_call>\nnot json\n</tool_call>"),
    (HermesFormat(), '<tool_call>\n{"arguments": {}}\n</tool_call>'),  # no name
    (HermesFormat(), '<tool_call>\n{"name": "noop", "arguments": {}} trailing words'),
    (GenericFormat(), '{"tool_call": {"name": "noop", "arguments": {}}'),
    (GenericFormat(), '{"something": 1}'),
    (GenericFormat(), "plain words"),
    (GenericFormat(), '{"response": "a"} and more'),
    (GenericFormat(), '{"tool_calls": []}'),
    (Llama3Format(), '{"name": "noop", "parameters": {}} and more'),
    (Llama3Format(), '{"parameters": {}}'),
    (MistralFormat(), '[TOOL_CALLS]{"name": "noop"}'),
    (MistralFormat(), '[TOOL_CALLS][{"name": "noop", "arguments": {}}'),
])
def test_malformed_calls_are_content(fmt, text):
    parsed = fmt.parse(text)
    assert parsed.tool_calls == [] and parsed.content == text


STREAM_CASES = [
    (HermesFormat(), HERMES_TWO),
    (HermesFormat(), "No <tool but text that <tool_cal looks close."),
    (GenericFormat(), GENERIC_TWO),
    (GenericFormat(), '{"response": "caf\\u00e9 \\ud83d\\ude00 and \\"quotes\\""}'),
    (Llama3Format(True), 'Searching <|python_tag|>{"name": "noop", "parameters": {"q": "a b"}}'),
    (Llama3Format(), ' {"name": "get_weather", "parameters": {"city": "Oslo", "days": 3}}'),
    (Llama3Format(), "A plain { answer"),
    (MistralFormat(), MISTRAL_TWO),
]


def reassemble(deltas: list[dict]) -> tuple[str, list[dict]]:
    """What an OpenAI client builds from the deltas: content, and calls by index."""
    content, calls = "", {}
    for delta in deltas:
        content += delta.get("content") or ""
        for fragment in delta.get("tool_calls", []):
            call = calls.setdefault(fragment["index"], {"id": None, "name": "", "arguments": ""})
            if "id" in fragment:
                assert call["id"] is None and fragment["type"] == "function" and fragment["function"]["arguments"] == ""
                call["id"] = fragment["id"]
                call["name"] = fragment["function"]["name"]
            else:
                assert call["id"] is not None and "name" not in fragment["function"]
            call["arguments"] += fragment["function"]["arguments"]
    return content, [calls[i] for i in sorted(calls)]


@pytest.mark.parametrize("fmt, text", STREAM_CASES)
def test_streamed_deltas_reassemble_to_the_final_message(fmt, text):
    stream = ToolCallStream(plan(fmt))
    deltas = []
    for n in range(1, len(text) + 1):  # one character per token: every prefix is seen
        deltas += stream.update(text[:n])[0]
    final_deltas, parsed = stream.update(text, partial=False)
    content, calls = reassemble(deltas + final_deltas)
    expected = fmt.parse(text)
    assert content == expected.content
    assert [(c["name"], c["arguments"]) for c in calls] == [(c.name, c.arguments) for c in expected.tool_calls]
    message = message_json(parsed, stream.ids)
    assert [c["id"] for c in message.get("tool_calls", [])] == [c["id"] for c in calls]
    assert message["content"] == (expected.content if expected.content or not expected.tool_calls else None)


def test_text_that_may_start_a_call_is_held_back():
    hermes = HermesFormat()
    assert hermes.parse("Hi <tool_c", partial=True).content == "Hi"
    assert hermes.parse("Hi <tool_c", partial=False).content == "Hi <tool_c"
    assert GenericFormat().parse('{"resp', partial=True).content == ""
    assert Llama3Format().parse("  ", partial=True).content == ""
    assert MistralFormat().parse("ok [TOOL", partial=True).content == "ok"


def test_mistral_call_waits_for_its_id_while_streaming():
    text = '[TOOL_CALLS][{"name": "noop", "arguments": {"a": 1}, "id": "abcdefghi"'
    assert MistralFormat().parse(text[:-3], partial=True).tool_calls == []
    assert MistralFormat().parse(text, partial=True).tool_calls[0].id == "abcdefghi"


def test_message_json_shapes():
    parsed = HermesFormat().parse('<tool_call>\n{"name": "noop", "arguments": {"a": 1}}\n</tool_call>')
    message = message_json(parsed)
    assert message["content"] is None and message["role"] == "assistant"
    call = message["tool_calls"][0]
    assert call["type"] == "function" and call["function"] == {"name": "noop", "arguments": '{"a":1}'}
    assert len(call["id"]) == 32 and call["id"].isalnum()
    assert message_json(HermesFormat().parse("hello")) == {"role": "assistant", "content": "hello"}


# -- grammars -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    loaded = lamplight.load(str(write_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny.gguf")))
    return loaded.tokenizer, GrammarCompiler(loaded.tokenizer)


def compile_plan(tiny, tool_plan):
    tokenizer, compiler = tiny
    source = tool_plan.grammar(tokenizer)
    if source.kind == "json_schema":
        return compiler.compile_json_schema(source.source)
    return compiler.compile_lark(source.source)


def walk(tiny, grammar, text: str) -> str:
    """'refused' if some token of `text` is masked out, else 'done' (grammar finished) or 'open'."""
    tokenizer, _ = tiny
    matcher = grammar.new_matcher()
    for token in tokenizer.encode(text, add_special=False, parse_special=True):
        if not fill_masks([matcher], tokenizer.vocab_size)[0][token]:
            return "refused"
        matcher.accept(token)
    if matcher.is_stopped():
        return "done"
    return "accepting" if matcher.is_accepting() else "open"


HERMES_ONE = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
GRAMMAR_CASES = [
    # format, choice, parallel, text, expected
    (HermesFormat(), "required", True, HERMES_ONE, "accepting"),  # another call may follow
    (HermesFormat(), "required", False, HERMES_ONE, "done"),
    (HermesFormat(), "required", True, HERMES_ONE + "\n" + HERMES_ONE, "accepting"),
    (HermesFormat(), "required", False, HERMES_ONE + "\n<tool_call>", "refused"),
    (HermesFormat(), "required", True, "Sure. " + HERMES_ONE, "refused"),
    (HermesFormat(), "required", True, '<tool_call>\n{"name": "get_weather", "arguments": {}}', "refused"),
    (HermesFormat(), "required", True, '<tool_call>\n{"name": "get_weather", "arguments": {"city": 3}}', "refused"),
    (HermesFormat(), "auto", False, "Sure. " + HERMES_ONE, "done"),
    (HermesFormat(), "auto", True, "Only text", "accepting"),
    (HermesFormat(), "auto", True, "Sure. <tool_call>\nnot json", "refused"),
    (GenericFormat(), "auto", True, '{"response": "hi"}', "done"),
    (GenericFormat(), "auto", True, '{"tool_calls": [{"name": "noop", "arguments": {"k": [1]}}]}', "done"),
    (GenericFormat(), "auto", True, '{"tool_call": {"name": "noop", "arguments": {}}}', "refused"),
    (GenericFormat(), "auto", False, '{"tool_call": {"name": "noop", "arguments": {}}}', "done"),
    (GenericFormat(), "required", True, '{"response": "hi"}', "refused"),
    (GenericFormat(), "required", True, '{"tool_calls": []}', "refused"),
    (GenericFormat(), "auto", True, "plain text", "refused"),
    (Llama3Format(), "auto", True, "Plain text", "accepting"),
    (Llama3Format(), "auto", True, '{"name": "noop", "parameters": {}}', "done"),
    (Llama3Format(), "auto", True, '{"nam":', "refused"),
    (Llama3Format(), "required", True, "Plain text", "refused"),
    (Llama3Format(True), "auto", True, 'Let me see <|python_tag|>{"name": "noop", "parameters": {}}', "done"),
    (MistralFormat(), "auto", True, '[TOOL_CALLS][{"name": "noop", "arguments": {}, "id": "abcdefghi"}]', "done"),
    (MistralFormat(), "required", False,
     '[TOOL_CALLS][{"name": "noop", "arguments": {}, "id": "abcdefghi"}, {', "refused"),
    (MistralFormat(), "required", True, '[TOOL_CALLS][{"name": "noop", "arguments": {}, "id": "short"}]', "refused"),
]


@pytest.mark.parametrize("fmt, choice, parallel, text, expected", GRAMMAR_CASES)
def test_grammars(tiny, fmt, choice, parallel, text, expected):
    assert walk(tiny, compile_plan(tiny, plan(fmt, choice, parallel)), text) == expected


def test_grammar_echo_is_a_grammar_the_grammar_field_accepts(tiny):
    _, compiler = tiny
    for fmt in (GenericFormat(), HermesFormat()):
        text = plan(fmt).grammar(tiny[0]).text
        assert text.startswith("%llguidance {}")
        grammar = compiler.compile_grammar(text)
        assert walk(tiny, grammar, '{"response": "hi"}' if fmt.generic else "hi") in ("done", "accepting")
    echo = plan(HermesFormat()).settings_echo()
    assert echo == {"grammar_lazy": True, "grammar_triggers": [{"type": 1, "value": "<tool_call>"}],
                    "chat_format": "Hermes 2 Pro"}
    assert plan(GenericFormat()).settings_echo()["grammar_lazy"] is False
    assert plan(HermesFormat(), "none").settings_echo() == {}


def test_named_function_allows_only_that_tool(tiny):
    grammar = compile_plan(tiny, plan(GenericFormat(), "required", forced="noop"))
    assert walk(tiny, grammar, '{"tool_calls": [{"name": "noop", "arguments": {}}]}') == "done"
    assert walk(tiny, grammar, '{"tool_calls": [{"name": "get_weather"') == "refused"


def test_lazy_grammar_activates_at_the_trigger(tiny):
    """tool_choice auto with a text marker: anything goes until `<tool_call>`, then only a call."""
    tokenizer, _ = tiny
    grammar = compile_plan(tiny, plan(HermesFormat(), "auto"))
    matcher = grammar.new_matcher()
    free = fill_masks([matcher], tokenizer.vocab_size)[0]
    def is_text(token: int) -> bool:  # llguidance keeps text valid UTF-8: no stray continuation bytes
        try:
            return not tokenizer.is_control(token) and bool(tokenizer.token_bytes(token).decode("utf-8"))
        except UnicodeDecodeError:
            return False

    assert all(free[i] for i in range(tokenizer.vocab_size) if is_text(i))  # before the trigger: any text
    for token in tokenizer.encode("I will check. <tool_call>", add_special=False, parse_special=False):
        matcher.accept(token)
    after = fill_masks([matcher], tokenizer.vocab_size)[0]
    allowed = [tokenizer.decode([i]) for i in range(tokenizer.vocab_size) if after[i]]
    assert allowed == ["\n"]  # the constrained part has begun
    for token in tokenizer.encode('\n{"name": "noop", "arguments": {}}\n</tool_call>', add_special=False,
                                  parse_special=False):
        assert fill_masks([matcher], tokenizer.vocab_size)[0][token]
        matcher.accept(token)
    assert matcher.is_accepting()


def test_a_trigger_that_ends_inside_a_token_still_activates(tiny):
    """The lazy lexeme is matched on bytes, not on token boundaries: a token that carries the end
    of the trigger and the start of what follows (the tiny vocabulary's " the" for the trigger
    " t") is checked as a whole, against both parts."""
    tokenizer, compiler = tiny
    the = tokenizer.encode(" the", add_special=False, parse_special=False)
    assert len(the) == 1

    def grammar(after_trigger: str):
        return compiler.compile_lark('%llguidance {}\nstart: TEXT | trigger ' + json.dumps(after_trigger) + '\n'
                                     'trigger[lazy]: TEXT " t"\nTEXT: /(.|\\n)*/\n')

    matcher = grammar("he!").new_matcher()
    matcher.accept(tokenizer.encode("zz", add_special=False, parse_special=False)[0])
    assert fill_masks([matcher], tokenizer.vocab_size)[0][the[0]]
    matcher.accept(the[0])
    mask = fill_masks([matcher], tokenizer.vocab_size)[0]
    assert [tokenizer.decode([i]) for i in range(tokenizer.vocab_size) if mask[i]] == ["!"]
    refusing = grammar("x").new_matcher()  # " t" must be followed by "x": " the" breaks the call
    assert not fill_masks([refusing], tokenizer.vocab_size)[0][the[0]]


def test_a_marker_that_is_a_control_token_is_matched_as_that_token(tiny):
    class ImStartMistral(MistralFormat):
        MARKER = "<|im_start|>"  # a control token of the tiny vocabulary

    tokenizer, _ = tiny
    source = plan(ImStartMistral(), "required").grammar(tokenizer).source
    assert "start: <[1]> calls" in source
    grammar = compile_plan(tiny, plan(ImStartMistral(), "auto"))
    assert walk(tiny, grammar, 'hi <|im_start|>[{"name": "noop", "arguments": {}, "id": "abcdefghi"}]') == "done"
    assert walk(tiny, grammar, 'hi <|im_start|>x') == "refused"


# -- detection, plan, prompt --------------------------------------------------------------------

@pytest.mark.parametrize("source, name", [
    ("{{ messages }}", "generic"),  # no tools in the template
    ("{% for t in tools %}{% endfor %}<tool_call>", "hermes"),
    ("{{ tools }}<|start_header_id|>ipython<|end_header_id|>", "llama3"),
    ("{{ tools }}[TOOL_CALLS]", "mistral"),
    ("{{ tools }} something else", "generic"),
    ("{{ tools }}<tool_call>[TOOL_CALLS]", "hermes"),  # llama.cpp's order
])
def test_detect_format(source, name):
    assert detect_format(ChatTemplate(source)).name == name
    assert detect_format(None).name == "generic"


def test_llama3_python_tag_follows_the_template():
    assert detect_format(ChatTemplate("{{ tools }}<|start_header_id|>ipython<|end_header_id|><|python_tag|>")).python_tag
    assert not detect_format(ChatTemplate("{{ tools }}<|start_header_id|>ipython<|end_header_id|>")).python_tag


@pytest.mark.parametrize("tools, choice, parallel, field", [
    ("x", None, None, "tools"),
    ([{"type": "function", "function": {}}], None, None, "tools"),
    ([{"type": "function", "function": {"name": "f", "parameters": []}}], None, None, "tools"),
    ([{"function": {"name": "f"}}, {"function": {"name": "f"}}], None, None, "tools"),
    ([{"function": {"name": "f"}}], "sometimes", None, None),
    ([{"function": {"name": "f"}}], {"type": "function", "function": {"name": "g"}}, None, "tool_choice"),
    ([{"function": {"name": "f"}}], {"type": "function"}, None, "tool_choice"),
    ([{"function": {"name": "f"}}], None, 1, "parallel_tool_calls"),
    (None, "required", None, None),
])
def test_plan_errors(tools, choice, parallel, field):
    with pytest.raises(ToolRequestError) as info:
        plan_tool_calling(tools, choice, parallel, None)
    assert info.value.field == field


def test_plan_defaults():
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert plan_tool_calling(None, None, None, None) is None
    p = plan_tool_calling(tools, None, None, None)
    assert (p.choice, p.forced, p.parallel, p.format.name) == ("auto", None, True, "generic")
    assert p.tools[0].parameters == {"type": "object"}
    p = plan_tool_calling(tools, {"type": "function", "function": {"name": "f"}}, None, None)
    assert (p.choice, p.forced, p.parallel) == ("required", "f", False)  # a named function: one call


SMOL_LIKE = ChatTemplate("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                         "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_generic_protocol_prompt():
    p = plan_tool_calling(RAW_TOOLS, "auto", None, SMOL_LIKE)
    messages, tools = prompt_inputs([{"role": "system", "content": "Be brief."},
                                     {"role": "user", "content": "Weather in Rome?"}], SMOL_LIKE, p)
    assert tools is None
    system = messages[0]["content"]
    assert system.startswith("Be brief.\n\nYou can call the following tools")
    assert json.dumps(WEATHER.describe()) in system
    assert "`tool_calls`" in system and '{"response": "..."}' in system
    required, _ = prompt_inputs([{"role": "user", "content": "x"}], SMOL_LIKE,
                                plan_tool_calling(RAW_TOOLS, "required", False, SMOL_LIKE))
    assert required[0]["role"] == "system" and "`response`" not in required[0]["content"]
    assert "`tool_call` (a request" in required[0]["content"]
    named, _ = prompt_inputs([{"role": "user", "content": "x"}], SMOL_LIKE,
                             plan_tool_calling(RAW_TOOLS, {"type": "function", "function": {"name": "noop"}}, None,
                                               SMOL_LIKE))
    assert "Call the tool `noop`." in named[0]["content"] and "get_weather" not in named[0]["content"]


def test_generic_protocol_history():
    conversation = [
        {"role": "user", "content": "Weather in Rome?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
        {"role": "tool", "tool_call_id": "call1", "content": '{"temp": 21}'},
        {"role": "assistant", "content": "It is 21 degrees."},
        {"role": "user", "content": "Thanks"},
    ]
    p = plan_tool_calling(RAW_TOOLS, "auto", None, SMOL_LIKE)
    messages, _ = prompt_inputs(conversation, SMOL_LIKE, p)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert json.loads(messages[2]["content"]) == {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Rome"}}]}
    assert json.loads(messages[3]["content"]) == {
        "tool_response": {"name": "get_weather", "tool_call_id": "call1", "content": {"temp": 21}}}
    assert json.loads(messages[4]["content"]) == {"response": "It is 21 degrees."}
    prompt = SMOL_LIKE.render(messages)
    assert '<|im_start|>assistant\n{"tool_calls": [{"name": "get_weather"' in prompt
    # Without the protocol (tool_choice none) the history is still readable by a tool-less template.
    plain, _ = prompt_inputs(conversation, SMOL_LIKE, plan_tool_calling(RAW_TOOLS, "none", None, SMOL_LIKE))
    assert plain[0]["role"] == "user" and plain[3]["content"] == "It is 21 degrees."
    assert json.loads(plain[1]["content"])["tool_calls"][0]["name"] == "get_weather"


def test_native_templates_get_the_tools_and_the_conversation():
    hermes = ChatTemplate("{% for t in tools %}{{ t.function.name }};{% endfor %}<tool_call>")
    conversation = [{"role": "user", "content": "x"}]
    messages, tools = prompt_inputs(conversation, hermes, plan_tool_calling(RAW_TOOLS, "none", None, hermes))
    assert messages == conversation and tools == RAW_TOOLS
