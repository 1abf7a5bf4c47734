"""reasoning_format: thinking split into reasoning_content, per template family, on recorded
model outputs written from each format's documentation (non-streamed and streamed growth)."""

from __future__ import annotations

import pytest

from conftest import reference_text

from lamplight.chat.families import detect_family
from lamplight.chat.reasoning import plan_reasoning

QWEN3_PROMPT = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
R1_PROMPT = "<｜User｜>Hi<｜Assistant｜><think>\n"  # the generation prompt opens the thinking


def detect_reasoning_markers(source: str):
    """The thinking markers a template with this source has (its family's, lamplight.chat.families)."""
    return detect_family(source).reasoning


FAMILIES = [
    # (template text naming the markers, prompt, reply, reasoning, content)
    ("<think>", QWEN3_PROMPT, "<think>\nLet me add.\n</think>\n\n4", "Let me add.", "4"),
    ("<think>", R1_PROMPT, "Two and two.\n</think>\n\nFour.", "Two and two.", "Four."),
    ("[THINK]", "[INST]Hi[/INST]", "[THINK]Sum it.[/THINK]4", "Sum it.", "4"),
    ("<seed:think>", "assistant\n", "<seed:think>hmm</seed:think>ok", "hmm", "ok"),
    ("<|START_THINKING|>", "<|CHATBOT_TOKEN|>", "<|START_THINKING|>plan<|END_THINKING|>done", "plan", "done"),
    ("<|channel|>analysis", "<|start|>assistant",
     "<|channel|>analysis<|message|>User says hi.<|end|><|start|>assistant<|channel|>final<|message|>Hello!",
     "User says hi.", "Hello!"),
    ("<|channel>thought", "<|turn>model\n", "<|channel>thought\nbrief<channel|>Hi", "brief", "Hi"),
]


@pytest.mark.parametrize("source, prompt, reply, reasoning, content", FAMILIES, ids=lambda v: str(v)[:16])
def test_each_family_splits_thinking(source, prompt, reply, reasoning, content):
    plan = plan_reasoning(detect_reasoning_markers(source), "auto", prompt)
    split = plan.split(reply)
    assert (split.reasoning, split.content) == (reasoning, content)
    assert plan_reasoning(detect_reasoning_markers(source), "deepseek", prompt).split(reply).content == content


def test_none_leaves_the_text_and_legacy_keeps_it_in_content():
    markers = detect_reasoning_markers("<think>")
    assert plan_reasoning(markers, "none", QWEN3_PROMPT) is None
    legacy = plan_reasoning(markers, "deepseek-legacy", QWEN3_PROMPT).split("<think>a</think>b")
    assert (legacy.reasoning, legacy.content) == ("a", "<think>a</think>b")


def test_a_reply_without_thinking_is_all_content():
    plan = plan_reasoning(detect_reasoning_markers("<think>"), "auto", QWEN3_PROMPT)
    assert (plan.split("Just 4.").reasoning, plan.split("Just 4.").content) == (None, "Just 4.")


def test_a_reply_cut_inside_the_thinking_is_all_reasoning():
    plan = plan_reasoning(detect_reasoning_markers("<think>"), "auto", R1_PROMPT)
    split = plan.split("Still thinking")
    assert (split.reasoning, split.content) == ("Still thinking", "")


def test_streaming_growth_holds_back_a_partial_end_marker():
    plan = plan_reasoning(detect_reasoning_markers("<think>"), "auto", QWEN3_PROMPT)
    reply = "<think>\nabc\n</think>\n\nanswer"
    seen_reasoning, seen_content = "", ""
    for end in range(1, len(reply) + 1):
        split = plan.split(reply[:end], partial=True)
        reasoning = split.reasoning or ""
        assert reasoning.startswith(seen_reasoning) and "</" not in reasoning
        assert split.content.startswith(seen_content)
        seen_reasoning, seen_content = reasoning, split.content
    assert seen_content == "answer" and seen_reasoning.strip() == "abc"


def test_templates_without_thinking_have_no_markers():
    assert detect_reasoning_markers("{{ messages }}") is None


def test_a_prefill_with_reasoning_only_continues_inside_the_thinking():
    from lamplight.chat import ChatTemplate
    from lamplight.server.chat_prompt import continues_thinking

    qwen3 = ChatTemplate(reference_text("templates/Qwen-Qwen3-0.6B.jinja"))
    body = {"messages": [{"role": "user", "content": "2+2?"},
                         {"role": "assistant", "content": "", "reasoning_content": "Two and two"}]}
    prompt = qwen3.render(body["messages"])
    assert prompt.endswith("<think>\nTwo and two") and continues_thinking(body)
    plan = plan_reasoning(qwen3.reasoning, "auto", prompt, continues_thinking(body))
    split = plan.split(" make four.\n</think>\n\n4")
    assert (split.reasoning, split.content) == ("make four.", "4")
    answered = {"messages": body["messages"][:1] + [{"role": "assistant", "content": "The answer",
                                                      "reasoning_content": "Two and two"}]}
    assert not continues_thinking(answered) and not continues_thinking({"messages": body["messages"][:1]})


@pytest.mark.parametrize("name, family", [
    ("Kimi-K2-Instruct.jinja", "think"), ("moonshotai-Kimi-K2.jinja", "think"), ("LFM2-8B-A1B.jinja", "think"),
    ("LFM2.5-Instruct.jinja", "think"), ("unsloth-mistral-Devstral-Small-2507.jinja", "mistral"),
    ("Qwen-Qwen3-0.6B.jinja", "think"), ("Kimi-K3.jinja", None), ("meta-llama-Llama-3.1-8B-Instruct.jinja", None),
])
def test_templates_think_as_llama_cpp_s_format_for_them_does(name, family):
    # Kimi K2, LFM2 and Devstral never name a thinking marker, but llama.cpp's dedicated formats
    # for them split <think> / [THINK] blocks; Kimi K3's own markers are not split here.
    markers = detect_reasoning_markers(reference_text(f"templates/{name}"))
    assert (markers.family if markers else None) == family
