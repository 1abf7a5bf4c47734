"""The template-family registry (lamplight.chat.families): what it recognises in the reference
templates (shared/reference/templates/), the order-sensitive rules on sources written for them,
and that every tool-format name it gives resolves in lamplight.tools.FORMATS."""

from __future__ import annotations

import pytest
from conftest import reference_path

from lamplight.chat import ChatTemplate
from lamplight.chat.families import FAMILIES, detect_family
from lamplight.tools import FORMATS, detect_format

# template -> (the first family that recognises it, the thinking markers it splits, its tool format)
EXPECTED = {
    "Apertus-8B-Instruct.jinja": ("", None, "generic"),
    "Apriel-1.6-15b-Thinker-fixed.jinja": ("", None, "generic"),
    "Bielik-11B-v3.0-Instruct.jinja": ("Hermes 2 Pro", "think", "hermes"),
    "ByteDance-Seed-OSS.jinja": ("", "seed", "generic"),
    "Cohere2MoE.jinja": ("Cohere2 MoE", "command-r7b", "generic"),
    "CohereForAI-c4ai-command-r-plus-tool_use.jinja": ("Command R+", None, "command-r-plus"),
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja": ("Command R7B", "command-r7b", "command-r7b"),
    "GLM-4.6.jinja": ("GLM 4.5", "think", "glm-4.5"),
    "GLM-4.7-Flash.jinja": ("GLM 4.5", "think", "glm-4.5"),
    "GigaChat3-10B-A1.8B.jinja": ("GigaChat v3", None, "generic"),
    "GigaChat3.1-10B-A1.8B.jinja": ("", None, "generic"),  # has <|function_call|>: not GigaChat v3's format
    "HuggingFaceTB-SmolLM3-3B.jinja": ("", "think", "generic"),
    "Kimi-K2-Instruct.jinja": ("Kimi K2", "think", "generic"),  # <think> from its format, not its source
    "Kimi-K2-Thinking.jinja": ("Kimi K2", "think", "generic"),
    "Kimi-K3.jinja": ("Kimi K3", None, "generic"),
    "LFM2-8B-A1B.jinja": ("LFM2", "think", "generic"),
    "LFM2.5-8B-A1B.jinja": ("LFM2.5", "think", "generic"),
    "LFM2.5-Instruct.jinja": ("LFM2.5", "think", "generic"),
    "MiMo-VL.jinja": ("Hermes 2 Pro", None, "hermes"),
    "MiniMax-M1.jinja": ("", None, "generic"),
    "MiniMax-M2.jinja": ("", "think", "generic"),
    "MiniMax-M3.jinja": ("MiniMax-M3", "minimax-m3", "hermes"),
    "Mistral-Small-3.2-24B-Instruct-2506.jinja": ("Mistral Nemo", None, "mistral"),
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja": ("Qwen3.5 / Nemotron 3 Nano", "think", "qwen3-coder"),
    "NVIDIA-Nemotron-Nano-v2.jinja": ("Nemotron Nano v2", "think", "generic"),
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja": ("Hermes 2 Pro", None, "hermes"),
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": ("Hermes 2 Pro", None, "hermes"),
    "Qwen-QwQ-32B.jinja": ("Hermes 2 Pro", "think", "hermes"),
    "Qwen-Qwen2.5-7B-Instruct.jinja": ("Hermes 2 Pro", None, "hermes"),
    "Qwen-Qwen3-0.6B.jinja": ("Hermes 2 Pro", "think", "hermes"),
    "Qwen3-Coder.jinja": ("Qwen3-Coder", None, "qwen3-coder"),
    "Qwen3.5-4B.jinja": ("Qwen3.5 / Nemotron 3 Nano", "think", "qwen3-coder"),
    "Reka-Edge.jinja": ("Hermes 2 Pro", "think", "hermes"),
    "StepFun3.5-Flash.jinja": ("Qwen3.5 / Nemotron 3 Nano", "think", "qwen3-coder"),
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja": ("DeepSeek R1", "think", "deepseek-r1"),
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja": ("DeepSeek R1", "think", "deepseek-r1"),
    "deepseek-ai-DeepSeek-V3.1.jinja": ("DeepSeek V3.1", "think", "deepseek-v3.1"),
    "deepseek-ai-DeepSeek-V3.2.jinja": ("DeepSeek V3.2", "think", "generic"),
    "deepseek-ai-DeepSeek-V4-Flash-0731.jinja": ("DeepSeek V4", "think", "generic"),
    "deepseek-ai-DeepSeek-V4.jinja": ("DeepSeek V4", "think", "generic"),
    "fireworks-ai-llama-3-firefunction-v2.jinja": ("", None, "generic"),
    "google-gemma-2-2b-it.jinja": ("", None, "generic"),
    "google-gemma-4-31B-it-interleaved.jinja": ("Gemma 4", "gemma4", "generic"),
    "google-gemma-4-31B-it.jinja": ("Gemma 4", "gemma4", "generic"),
    "ibm-granite-granite-3.3-2B-Instruct.jinja": ("Granite 3.x", "think", "granite"),
    "ibm-granite-granite-4.0.jinja": ("Hermes 2 Pro", None, "hermes"),
    "ibm-granite-granite-4.1.jinja": ("Hermes 2 Pro", None, "hermes"),
    "llama-cpp-deepseek-r1.jinja": ("DeepSeek R1", "think", "deepseek-r1"),
    "llama-cpp-rwkv-world.jinja": ("", "think", "generic"),
    "meetkai-functionary-medium-v3.1.jinja": ("Llama 3.x with builtin tools", None, "llama3-builtin-tools"),
    "meetkai-functionary-medium-v3.2.jinja": ("Functionary v3.2", None, "generic"),
    "meta-llama-Llama-3.1-8B-Instruct.jinja": ("Llama 3.x with builtin tools", None, "llama3-builtin-tools"),
    "meta-llama-Llama-3.2-3B-Instruct.jinja": ("Llama 3.x", None, "llama3"),
    "meta-llama-Llama-3.3-70B-Instruct.jinja": ("Llama 3.x with builtin tools", None, "llama3-builtin-tools"),
    "microsoft-Phi-3.5-mini-instruct.jinja": ("", None, "generic"),
    "mistralai-Ministral-3-14B-Reasoning-2512.jinja": ("Ministral 3", "mistral", "mistral"),
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": ("Mistral Nemo", None, "mistral"),
    "moonshotai-Kimi-K2.jinja": ("Kimi K2", "think", "generic"),
    "muse-glimmer.jinja": ("Muse Glimmer", None, "generic"),
    "openai-gpt-oss-120b.jinja": ("gpt-oss", "harmony", "gpt-oss"),
    "openbmb-MiniCPM5-1B.jinja": ("MiniCPM5", "think", "generic"),
    "poolside-Laguna-S-2.1.jinja": ("GLM 4.5", "think", "glm-4.5"),
    "poolside-Laguna-XS-2.1.jinja": ("GLM 4.5", "think", "glm-4.5"),
    "poolside-Laguna-XS.2.jinja": ("GLM 4.5", "think", "glm-4.5"),
    "tencent-Hy3.jinja": ("", None, "generic"),
    "unsloth-Apriel-1.5.jinja": ("Hermes 2 Pro", None, "hermes"),
    "unsloth-mistral-Devstral-Small-2507.jinja": ("Ministral 3", "mistral", "mistral"),  # [THINK] from its format
    "upstage-Solar-Open-100B.jinja": ("", None, "generic"),
}


def reference_names() -> list[str]:
    return sorted(path.name for path in reference_path("templates").glob("*.jinja"))


def test_the_table_covers_every_reference_template():
    assert sorted(EXPECTED) == reference_names()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_registry_recognises_the_reference_templates(name):
    family = detect_family((reference_path("templates") / name).read_text(encoding="utf-8"))
    assert (family.name, family.reasoning.family if family.reasoning else None, family.tool_format) == EXPECTED[name]


def test_granite_3_3_thinks_as_granite_3_3_and_calls_tools_as_granite_3_x():
    """Two llama.cpp detections settle one template: thinking from the specialised template (its
    instruction text), answer markers and tool calls from the older handler (`elif thinking`)."""
    family = detect_family((reference_path("templates") / "ibm-granite-granite-3.3-2B-Instruct.jinja").read_text())
    assert (family.thinking.start, family.thinking.end) == ("<think>", "</think>")
    assert (family.answer_wrapper.open, family.tool_format) == ("<response>", "granite")


@pytest.mark.parametrize("source, tool_format", [
    ("{{ tools }}<tool_call><function=f><parameter=x>", "qwen3-coder"),  # Qwen3-Coder XML before Hermes
    ("{{ tools }}<tool_call>f<arg_key>x</arg_key>", "glm-4.5"),  # GLM 4.5 before Hermes
    ("{{ tools }}<tool_call><|channel|>", "hermes"),  # gpt-oss's calls after Hermes's (llama.cpp's older order)
    ("{{ messages }}<｜tool▁calls▁begin｜>", "deepseek-r1"),  # DeepSeek before the check for `tools`
    ("{{ messages }}<tool_call>", "generic"),  # a template without `tools` gets the generic protocol
    ("{{ tools }}<|start_header_id|>ipython<|end_header_id|><|python_tag|>", "llama3-builtin-tools"),
])
def test_order_sensitive_rules(source, tool_format):
    assert detect_family(source).tool_format == tool_format


def test_thinking_and_tools_come_from_different_families_where_llama_cpp_s_two_orders_differ():
    family = detect_family("{{ tools }}<tool_call><|channel|>")
    assert family.name == "gpt-oss" and family.thinking.start == "<|channel|>analysis<|message|>"
    assert family.tool_format == "hermes"


def test_a_source_no_family_recognises():
    family = detect_family("{{ messages }}")
    assert (family.name, family.thinking, family.reasoning, family.answer_wrapper, family.tool_format) == \
        ("", None, None, None, "generic")


def test_every_tool_format_name_resolves_in_the_tools_formats():
    names = {family.tool_format for family in FAMILIES if family.tool_format is not None} | {"generic"}
    assert names == set(FORMATS)
    assert detect_format(ChatTemplate("{{ tools }}<|start_header_id|>ipython<|end_header_id|><|python_tag|>")).python_tag


def test_family_names_are_unique():
    names = [family.name for family in FAMILIES]
    assert len(names) == len(set(names))


def test_a_chat_template_reads_its_markers_and_answer_wrapper_from_its_family():
    template = ChatTemplate("{{ tools }}<tool_call><think>")
    assert template.family == detect_family(template.source)
    assert (template.reasoning, template.answer_wrapper) == (template.family.reasoning, template.family.answer_wrapper)
