"""Chat templates: llama-server parity on SmolLM2's own template, built-ins, sandbox, validation."""

from __future__ import annotations

import re
from datetime import datetime

import pytest

from lamplight.chat import (
    BUILTIN_TEMPLATES,
    ChatTemplate,
    ChatTemplateError,
    MultimodalNotSupported,
    normalize_messages,
    resolve_chat_template,
)
from lamplight.chat.messages import adapt_to_template
from lamplight.chat.prefill import ThinkingSection
from conftest import reference_params

CONVERSATION = [
    {"role": "system", "content": "S"},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello"},
    {"role": "user", "content": "How are you?"},
]
SMOLLM2_SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"


@pytest.fixture(scope="module")
def smollm2_metadata(smollm2_path) -> dict:
    from lamplight.gguf.file import GGUFFile

    return GGUFFile(smollm2_path).metadata


@pytest.fixture(scope="module")
def smollm2(smollm2_metadata) -> ChatTemplate:
    return resolve_chat_template(smollm2_metadata)


def builtin(name: str, bos: str = "", eos: str = "") -> ChatTemplate:
    return ChatTemplate(BUILTIN_TEMPLATES[name], bos_token=bos, eos_token=eos, name=name)


# --- parity with llama-server on the real model -------------------------------------------------


def test_smollm2_template_comes_from_the_gguf(smollm2, smollm2_metadata):
    assert smollm2.source == smollm2_metadata["tokenizer.chat_template"]
    assert (smollm2.bos_token, smollm2.eos_token) == ("<|im_start|>", "<|im_end|>")
    assert smollm2.supports_tools is False


@pytest.mark.parametrize("case", reference_params("smollm2.templates.jsonl"),
                         ids=lambda case: repr(case["messages"])[:60])
def test_smollm2_reference_renderings(smollm2, case):
    prompt = smollm2.render(case["messages"], add_generation_prompt=case["add_generation_prompt"])
    assert prompt == case["prompt"]


def test_assistant_prefill_continues_the_final_message(smollm2):
    prompt = smollm2.render([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Sure, the"}])
    assert prompt == SMOLLM2_SYSTEM + "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nSure, the"


def test_prefill_ignores_add_generation_prompt_and_can_be_disabled(smollm2):
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]
    assert smollm2.render(messages, add_generation_prompt=False).endswith("<|im_start|>assistant\nYo")
    full = smollm2.render(messages, add_generation_prompt=False, prefill_assistant=False)
    assert full.endswith("<|im_start|>assistant\nYo<|im_end|>\n")


def test_prefill_rejects_two_trailing_assistant_messages(smollm2):
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "a"},
                {"role": "assistant", "content": "b"}]
    with pytest.raises(ChatTemplateError, match="2 or more assistant"):
        smollm2.render(messages)


# --- assistant prefill of thinking templates: the reply's thinking section (lamplight.chat.prefill)

THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.role == 'assistant' and m.reasoning_content %}<think>\n{{ m.reasoning_content }}\n</think>\n\n{% endif %}"
    "{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking %}<think>\n{% endif %}{% endif %}"
)
ASKED = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def thinking_reply(**reply) -> list[dict]:
    return [{"role": "user", "content": "Hi"}, {"role": "assistant", **reply}]


def test_thinking_markers_are_found_by_rendering_reasoning():
    # with the whitespace the template writes around the reasoning, as llama.cpp's analysis keeps it
    assert ChatTemplate(THINKING_TEMPLATE).thinking_section == ThinkingSection("<think>\n", "\n</think>\n\n")


def test_prefill_closes_an_empty_thinking_block_before_the_content():
    template = ChatTemplate(THINKING_TEMPLATE)
    expected = ASKED + "<think>\n\n</think>\n\nSure"
    # the generation prompt opens the thinking: cut there, then the template's own markers
    assert template.render(thinking_reply(content="Sure")) == expected
    # it does not (thinking disabled): the same reply
    assert template.render(thinking_reply(content="Sure"), extra={"enable_thinking": False}) == expected


def test_prefill_keeps_the_reasoning_of_the_reply():
    template = ChatTemplate(THINKING_TEMPLATE)
    both = thinking_reply(content="Sure", reasoning_content="Easy.")
    assert template.render(both) == ASKED + "<think>\nEasy.\n</think>\n\nSure"
    # reasoning alone: the thinking goes on (llama.cpp's continue_final_message "auto")
    assert template.render(thinking_reply(content="", reasoning_content="Hmm")) == ASKED + "<think>\nHmm"


def test_a_reply_without_thinking_can_have_its_own_opening():
    deepseek_v4 = ThinkingSection("<think>", "</think>", bare="</think>")
    assert deepseek_v4.continue_reply("<｜Assistant｜><think>", "", "Hi") == "<｜Assistant｜></think>Hi"
    assert deepseek_v4.continue_reply("<｜Assistant｜><think>", "R", "Hi") == "<｜Assistant｜><think>R</think>Hi"
    assert ThinkingSection().continue_reply("<|assistant|>\n", "ignored", "Hi") == "<|assistant|>\nHi"


def test_add_generation_prompt_is_undefined_rather_than_false():
    template = ChatTemplate("{{ add_generation_prompt is defined }}")
    messages = [{"role": "user", "content": "Hi"}]
    assert template.render(messages, add_generation_prompt=False) == "False"
    assert template.render(messages) == "True"


MINISTRAL_3_MARKERS = "[SYSTEM_PROMPT] [TOOL_CALLS] [ARGS]"


def test_ministral_3_gets_reasoning_as_a_typed_thinking_block():
    messages = normalize_messages([{"role": "system", "content": "S"}, {"role": "user", "content": "Q"},
                                   {"role": "assistant", "content": "4", "reasoning_content": "2+2"}])
    system, user, assistant = adapt_to_template(messages, MINISTRAL_3_MARKERS)
    assert system == {"role": "system", "content": [{"type": "text", "text": "S"}]}
    assert user == messages[1]
    assert assistant == {"role": "assistant", "content": [{"type": "thinking", "thinking": "2+2"},
                                                          {"type": "text", "text": "4"}]}
    assert adapt_to_template(messages, MINISTRAL_3_MARKERS + " [CALL_ID]") == messages  # Mistral Small 3.2


def test_older_gemma_4_templates_get_tool_results_inside_the_calling_turn():
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}
    messages = normalize_messages([
        {"role": "user", "content": "Weather?"}, {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"temp": 3}'}, {"role": "assistant", "content": "3 C"},
        {"role": "user", "content": "Thanks"}])
    gemma_4 = "'<|tool_call>call:'"
    assert adapt_to_template(messages, gemma_4) == [
        messages[0],
        {"role": "assistant", "tool_calls": messages[1]["tool_calls"],
         "tool_responses": [{"name": "get_weather", "response": {"temp": 3}}], "content": "3 C"},
        messages[4]]
    assert adapt_to_template(messages, gemma_4 + "{#- OpenAI Chat Completions:") == messages


# --- built-in formats (expected strings written from the formats' definitions) -----------------


def test_chatml_builtin():
    assert builtin("chatml").render(CONVERSATION) == (
        "<|im_start|>system\nS<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello<|im_end|>\n"
        "<|im_start|>user\nHow are you?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_llama3_builtin():
    assert builtin("llama3", "<|begin_of_text|>", "<|eot_id|>").render(CONVERSATION) == (
        "<|begin_of_text|>"
        "<|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nHello<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHow are you?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def test_gemma_builtin():
    assert builtin("gemma", "<bos>", "<eos>").render(CONVERSATION) == (
        "<bos>"
        "<start_of_turn>user\nS\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello<end_of_turn>\n"
        "<start_of_turn>user\nHow are you?<end_of_turn>\n"
        "<start_of_turn>model\n"
    )


def test_gemma_builtin_without_system_and_without_generation_prompt():
    prompt = builtin("gemma").render([{"role": "user", "content": "Hi"}], add_generation_prompt=False)
    assert prompt == "<start_of_turn>user\nHi<end_of_turn>\n"


def test_llama2_builtin():
    assert builtin("llama2", "<s>", "</s>").render(CONVERSATION) == (
        "<s>[INST] <<SYS>>\nS\n<</SYS>>\n\nHi [/INST] Hello </s><s>[INST] How are you? [/INST]"
    )


def test_phi3_builtin():
    assert builtin("phi3").render(CONVERSATION) == (
        "<|system|>\nS<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\nHello<|end|>\n"
        "<|user|>\nHow are you?<|end|>\n<|assistant|>\n"
    )


def test_leading_bos_is_cut_when_the_vocabulary_adds_it():
    gemma = ChatTemplate(BUILTIN_TEMPLATES["gemma"], "<bos>", "<eos>", add_bos=True)
    assert gemma.render([{"role": "user", "content": "Hi"}]).startswith("<start_of_turn>user\n")


# --- template environment -----------------------------------------------------------------------


def test_chat_template_kwargs_reach_the_template():
    template = ChatTemplate("{{ '<think>' if enable_thinking else 'plain' }}/{{ persona | default('none') }}")
    assert template.render([{"role": "user", "content": "x"}]) == "<think>/none"
    assert template.render([{"role": "user", "content": "x"}],
                           extra={"enable_thinking": False, "persona": "pirate"}) == "plain/pirate"


def test_enable_thinking_defaults_to_false_for_templates_without_thinking():
    template = ChatTemplate("{{ 'on' if enable_thinking else 'off' }}")
    assert template.supports_thinking is False
    assert template.render([{"role": "user", "content": "x"}]) == "off"


def test_raise_exception_becomes_chat_template_error():
    template = ChatTemplate("{{ raise_exception('Only user messages, please') }}")
    with pytest.raises(ChatTemplateError, match="Only user messages, please"):
        template.render([{"role": "user", "content": "x"}])


def test_syntax_error_becomes_chat_template_error():
    with pytest.raises(ChatTemplateError, match="invalid chat template"):
        ChatTemplate("{% for message in messages %}{{ message.content }}")


def test_runtime_error_becomes_chat_template_error():
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{{ messages[0].nope.deeper }}").render([{"role": "user", "content": "x"}])


def test_sandbox_blocks_python_internals():
    harmless = ChatTemplate("[{{ ''.__class__ }}]").render([{"role": "user", "content": "x"}])
    assert "class" not in harmless
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{{ ''.__class__.__mro__[1].__subclasses__() }}").render([{"role": "user", "content": "x"}])


def test_sandbox_is_immutable_except_list_append_and_pop():
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{{ messages[0].update({'role': 'x'}) }}").render([{"role": "user", "content": "x"}])
    # llama.cpp's Jinja lets lists grow and shrink (Kimi K2 keeps a stack); the messages are copies.
    stack = "{%- set s = [] -%}{{- s.append(1) or '' -}}{{- s.append(2) or '' -}}{{- s.pop() -}}{{- s | length -}}"
    assert ChatTemplate(stack).render([{"role": "user", "content": "x"}]) == "21"


def test_strftime_now():
    rendered = ChatTemplate("{{ strftime_now('%Y-%m-%d') }}").render([{"role": "user", "content": "x"}])
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", rendered)
    assert rendered[:4] == str(datetime.now().year)


def test_tojson_is_hf_style():
    template = ChatTemplate("{{ messages[0] | tojson }}|{{ {'a': 1} | tojson(indent=2) }}")
    rendered = template.render([{"role": "user", "content": "café <b>"}])
    assert rendered == '{"role": "user", "content": "café <b>"}|{\n  "a": 1\n}'


def test_loop_variable_and_loop_controls():
    template = ChatTemplate("{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}"
                            "{{ loop.index }}{{ ',' if not loop.last }}{% endfor %}")
    assert template.render([{"role": "user", "content": "x"}] * 4) == "1,2,"


def test_generation_tag_is_accepted():
    template = ChatTemplate("{% generation %}{{ messages[0].content }}{% endgeneration %}")
    assert template.render([{"role": "user", "content": "x"}]) == "x"


def test_tools_are_visible_to_a_template_that_uses_them():
    template = ChatTemplate("{% if tools %}{% for tool in tools %}{{ tool.function.name }};{% endfor %}"
                            "{% else %}no tools{% endif %}")
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    assert template.supports_tools is True
    assert template.render([{"role": "user", "content": "x"}], tools=tools) == "get_weather;"
    assert template.render([{"role": "user", "content": "x"}]) == "no tools"


def test_tool_call_arguments_are_parsed_for_templates():
    template = ChatTemplate("{% for call in messages[1].tool_calls %}"
                            "{% for k, v in call.function.arguments | items %}{{ k }}={{ v }}{% endfor %}"
                            "{% endfor %}")
    messages = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "w", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    assert template.render(messages) == "city=Paris"


# --- template selection -------------------------------------------------------------------------


def test_gemma3_without_template_falls_back_to_gemma():
    metadata = {
        "general.architecture": "gemma3",
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": ["<pad>", "<eos>", "<bos>", "<unk>"],
        "tokenizer.ggml.bos_token_id": 2,
        "tokenizer.ggml.eos_token_id": 1,
        "tokenizer.ggml.add_bos_token": True,
    }
    template = resolve_chat_template(metadata)
    assert template.name == "gemma" and template.source == BUILTIN_TEMPLATES["gemma"]
    assert (template.bos_token, template.eos_token) == ("<bos>", "<eos>")
    # The vocabulary adds BOS itself, so the template's own leading <bos> is cut (as llama.cpp does).
    assert template.render([{"role": "user", "content": "Hi"}]) == (
        "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
    )


def test_real_gemma3_base_model_uses_the_gemma_fallback(gemma3_path):
    from lamplight.gguf.file import GGUFFile

    template = resolve_chat_template(GGUFFile(gemma3_path).metadata)
    assert template.name == "gemma"
    assert template.render([{"role": "user", "content": "Hi"}]) == (
        "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
    )


def test_other_architectures_without_template_fall_back_to_chatml():
    assert resolve_chat_template({"general.architecture": "llama"}).name == "chatml"


def test_override_by_name_source_and_file(tmp_path, smollm2_metadata):
    assert resolve_chat_template(smollm2_metadata, override="llama3").source == BUILTIN_TEMPLATES["llama3"]
    literal = resolve_chat_template(smollm2_metadata, override="{{ messages[0].content }}!")
    assert literal.render([{"role": "user", "content": "x"}]) == "x!"
    path = tmp_path / "t.jinja"
    path.write_text("{{ bos_token }}{{ messages | length }}", encoding="utf-8")
    from_file = resolve_chat_template(smollm2_metadata, override_file=str(path))
    assert from_file.render([{"role": "user", "content": "x"}]) == "<|im_start|>1"
    with pytest.raises(ChatTemplateError):
        resolve_chat_template(smollm2_metadata, override_file=str(tmp_path / "missing.jinja"))


# --- message validation -------------------------------------------------------------------------


@pytest.mark.parametrize("messages, message", [
    ([], "non-empty"),
    (None, "non-empty"),
    (["hi"], "must be an object"),
    ([{"content": "hi"}], "missing 'role'"),
    ([{"role": "wizard", "content": "hi"}], "unknown role"),
    ([{"role": "user"}], "must have 'content'"),
    ([{"role": "user", "content": None}], "must have 'content'"),
    ([{"role": "user", "content": "x"}, {"role": "assistant"}], "'content' or 'tool_calls'"),
    ([{"role": "user", "content": 42}], "must be a string"),
    ([{"role": "user", "content": [{"type": "text"}]}], "string 'text'"),
    ([{"role": "user", "content": [{"type": "file", "file": {}}]}], "unsupported content part"),
])
def test_normalize_messages_rejects(messages, message):
    with pytest.raises(ChatTemplateError, match=message):
        normalize_messages(messages)


@pytest.mark.parametrize("part", [
    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
    {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
])
def test_media_parts_raise_multimodal_not_supported(part):
    messages = [{"role": "user", "content": [{"type": "text", "text": "look"}, part]}]
    with pytest.raises(MultimodalNotSupported, match="this model has no multimodal projector"):
        normalize_messages(messages)


def test_normalize_messages_shapes_messages_like_llama_cpp():
    normalized = normalize_messages([
        {"role": "developer", "content": "be terse", "extra_key": 1},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "not json"}}]},
    ])
    assert normalized == [
        {"role": "system", "content": "be terse"},
        {"role": "user", "content": "a\nb"},
        {"role": "assistant", "content": None,
         "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "not json"}}]},
    ]
    assert normalize_messages(normalized) == normalized
