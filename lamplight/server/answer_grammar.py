"""Constraints on the answer of a thinking model, not on its thinking (llama.cpp's chat parsers).

A chat reply of a thinking template may open with thinking (`<think>`...`</think>`), or start
inside it when the generation prompt opened it. `grammar`, `json_schema`, `response_format` and
the tool-call grammars describe the answer, so, as llama.cpp's generated chat grammars put an
optional reasoning block before the response format or the tool calls, the compiled constraint
becomes `@answer` after a free thinking block:

    start: OPEN thought @answer | @answer        (the reply may open thinking)
    start: thought @answer                       (the prompt opened it: it must be closed)
    thought: TEXT up to the first END, then optional whitespace

Markers are matched as the model writes them: a marker that is one control token of the
vocabulary as that token, an opening that mixes a control token and text (Gemma 4's
`<|channel>thought`) as the token then the text (tools.grammar_text.mixed_marker_lark).

The text before END is a lazy lexeme (it ends at the first END, even inside a larger token),
the same device as the lazy tool-call triggers (lamplight/tools/README.md), so the engine is
unchanged. Only when the reply's thinking is split out (`reasoning_format` other than `none`,
a template with thinking markers); gpt-oss keeps its own channel grammar (lamplight.tools.harmony).
"""

from __future__ import annotations

from typing import Any, Callable

from lamplight.chat.reasoning import ReasoningPlan
from lamplight.grammar import CompiledGrammar, GrammarCompiler
from lamplight.tools.grammar_text import ANY_TEXT, marker_lark, mixed_marker_lark, text_then

# Between the end of the thinking and the answer (llama.cpp's parsers allow space there too).
_SPACE = r"SPACE: /[ \t\r\n]{1,20}/"  # at most 20, as llama.cpp's rule: a model cannot loop on whitespace
_OWN_THINKING_GRAMMARS = ("harmony",)


def constrain_answer_only(grammar: CompiledGrammar | None, reasoning: ReasoningPlan | None,
                          compiler: Callable[[], GrammarCompiler], tokenizer: Any) -> CompiledGrammar | None:
    """`grammar` moved after the thinking, when the reply can think; else `grammar` itself."""
    if grammar is None or reasoning is None or reasoning.markers.family in _OWN_THINKING_GRAMMARS:
        return grammar
    return compiler().compile_after(thinking_lead(reasoning, tokenizer), grammar)


def thinking_lead(reasoning: ReasoningPlan, tokenizer: Any) -> str:
    """The Lark grammar of the thinking that may (or, when the prompt opened it, must) come
    before `@answer`."""
    end, end_is_token = marker_lark(tokenizer, reasoning.markers.end)
    thought, rules = text_then(end, end_is_token, rule="thinking")
    if reasoning.opened:
        start = f"start: {thought} SPACE? @answer"
    else:
        # A start marker may be a control token plus text (Gemma 4's `<|channel>thought`).
        opening = mixed_marker_lark(tokenizer, reasoning.markers.start)
        start = f"start: SPACE? {opening} {thought} SPACE? @answer | @answer"
    return "\n".join(["%llguidance {}", start, *rules, ANY_TEXT, _SPACE]) + "\n"
