"""`--reasoning-budget`: -1 thinks freely, 0 turns thinking off as llama-server does."""

from __future__ import annotations

import pytest
from conftest import reference_dir

from lamplight.chat import ChatTemplate
from lamplight.cli import _startup_problem, build_parser, server_settings
from lamplight.server.chat_prompt import render_chat_prompt

CHAT = {"messages": [{"role": "user", "content": "What is 2 + 2?"}]}


def _template(name: str) -> ChatTemplate:
    path = reference_dir() / "templates" / name
    if not path.is_file():
        pytest.skip(f"{path} is not available")
    return ChatTemplate(path.read_text(encoding="utf-8"), bos_token="<|im_start|>", eos_token="<|im_end|>", name=name)


def test_budget_zero_sets_enable_thinking_false_unless_the_request_says():
    qwen3 = _template("Qwen-Qwen3-0.6B.jinja")
    thinking_off = render_chat_prompt({**CHAT, "chat_template_kwargs": {"enable_thinking": False}}, qwen3)
    assert render_chat_prompt(CHAT, qwen3) != thinking_off  # the template does honour the switch
    assert render_chat_prompt(CHAT, qwen3, reasoning_budget=0) == thinking_off
    asked = {**CHAT, "chat_template_kwargs": {"enable_thinking": True}}
    assert render_chat_prompt(asked, qwen3, reasoning_budget=0) == render_chat_prompt(asked, qwen3)


def test_budget_zero_closes_a_thinking_block_the_prompt_opens():
    r1 = _template("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja")
    free = render_chat_prompt(CHAT, r1)
    assert free.rstrip().endswith("<think>")
    closed = render_chat_prompt(CHAT, r1, reasoning_budget=0)
    assert closed == free + "</think>"


def test_the_flag_reaches_the_server_and_only_minus_one_or_zero_is_accepted():
    parse = build_parser().parse_args
    assert server_settings(parse(["serve", "--reasoning-budget", "0"])).reasoning_budget == 0
    assert server_settings(parse(["serve"])).reasoning_budget == -1
    assert _startup_problem(parse(["serve", "--reasoning-budget", "0"])) is None
    assert "only -1 (unlimited) and 0" in _startup_problem(parse(["serve", "--reasoning-budget", "256"]))
