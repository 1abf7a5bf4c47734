r"""What llama-server writes for an assistant prefill: the thinking section of the reply it continues.

When a conversation ends with an assistant message, llama-server continues it
(`continue_final_message`): it renders the other messages without the generation prompt, then
writes the generation prompt up to where the template opens the thinking, the thinking section of
the final message and its content. The prompt ends inside the reply, so the model carries on
with the answer (or, for a message with reasoning_content but no content, with the thinking):

    generation prompt (cut where it opens the thinking) + start + reasoning + end + content

`ThinkingSection` holds the `start` and `end` markers, with the whitespace the template writes
around the reasoning. Where they come from follows llama.cpp's choice of chat format
(common/chat.cpp):
- templates that llama.cpp gives a dedicated format, recognised by markers in their source
  (`common_chat_try_specialized_template`), use that format's fixed markers: their family's
  `thinking` (lamplight.chat.families);
- every other template is analysed the way llama.cpp's chat auto-parser does it
  (`analyze_reasoning` in common/chat-diff-analyzer.cpp): rendered with and without a probe
  reasoning text (the markers around it, with their whitespace), with `enable_thinking` false
  and true (what the generation prompt adds or drops), and, for templates that only show
  reasoning next to tool calls, with a tool call. As llama.cpp's analysis workarounds have it,
  templates that never render reasoning but cut replies at `</think>` (QwQ, the DeepSeek R1
  distills, RWKV World) think in `<think>` tags, and Laguna's markers lose their whitespace.

Examples (the generation prompt, then what comes before the content):
    Qwen3        `<|im_start|>assistant\n` + `<think>\n\n</think>\n\n`
    Qwen3.5      `<|im_start|>assistant\n<think>\n` + `\n</think>\n\n` (the prompt opened the thinking)
    QwQ          `<|im_start|>assistant\n<think>\n`, cut before `<think>`, + `<think></think>`
    DeepSeek V4  `<｜Assistant｜><think>`, cut before `<think>`, + `</think>` (its reply without thinking)
    Apriel 1.6   `\n<|begin_assistant|>\nHere are my reasoning steps:\n`, cut before `<|begin_assistant|>`,
                 + `<|begin_assistant|>\n` + `\n[BEGIN FINAL RESPONSE]\n`
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from lamplight.chat.reasoning_markers import THINK
from lamplight.chat.text import common_prefix_length

# render(messages, add_generation_prompt, tools, extra) -> text, or None when the template fails
Render = Callable[[list[dict], bool, list[dict] | None, dict | None], str | None]


@dataclass(frozen=True)
class ThinkingSection:
    """How a template writes an assistant reply's thinking: `start` and `end` around the
    reasoning (empty: the template has no thinking), `bare` for a reply without reasoning when
    that is not `start + end` (DeepSeek V4's lone `</think>`, functionary's `all\\n` recipient)."""

    start: str = ""
    end: str = ""
    bare: str | None = None

    def continue_reply(self, generation_prompt: str, reasoning: str, content: str) -> str:
        """What follows the rendered history: the reply so far, ready to be continued."""
        answering = bool(content) or not reasoning  # llama.cpp: reasoning alone is continued as such
        text = generation_prompt
        if self.start:
            opened = text.find(self.start)
            text = text if opened < 0 else text[:opened]
            if self.bare is not None and not reasoning:
                text += self.bare
            else:
                text += self.start + reasoning + (self.end if answering else "")
        elif self.bare is not None:
            text += self.bare
        return text + content if answering else text


NO_THINKING = ThinkingSection()


# Where a family's format or llama.cpp's analysis says the model thinks in plain `<think>` tags.
THINK_TAGS = ThinkingSection(THINK.start, THINK.end)

# Templates whose analysed markers llama.cpp trims of the whitespace the template writes around the
# reasoning (Laguna: copied from laguna_glm_thinking, its model writes the tags tight).
_TRIMMED = ("laguna_glm_thinking",)


def thinking_section(dedicated: ThinkingSection | None, source: str, render: Render,
                     supports_tool_calls: bool) -> ThinkingSection:
    """The thinking section of `source`'s replies: its dedicated format's (`dedicated`, from its
    family), else found by analysis."""
    if dedicated is not None:
        return dedicated
    section = _analyse(render, supports_tool_calls)
    if any(marker in source for marker in _TRIMMED):
        section = ThinkingSection(section.start.strip(), section.end.strip())
    if section.start or section.end:
        return section
    if "content.split('</think>')" in source and "reasoning_content" not in source:
        return THINK_TAGS
    return NO_THINKING


# --- differential analysis (llama.cpp's chat-auto-parser, reasoning part) -----------------------

_USER = "U_USER_MSG Hello END_U"
_ANSWER = "A_ASST_MSG I can help END_A"
_REASONING = "REASON_PART I am thinking END_R"
_PARAMETERS = {"type": "object", "required": [],
               "properties": {name: {"type": "string", "description": description}
                              for name, description in (("AA_ARG_FST_AA", "First argument"),
                                                        ("BB_ARG_SND_BB", "Second argument"))}}
_TOOLS = [{"type": "function", "function": {"name": name, "description": description, "parameters": _PARAMETERS}}
          for name, description in (("FFF_FIRST_FUN_F", "Test function foo"),
                                    ("SSS_SECOND_FUN_S", "Test function bar"))]
_CALL = {"id": "call00001", "type": "function",
         "function": {"name": "FFF_FIRST_FUN_F", "arguments": {"AA_ARG_FST_AA": "VVVV", "BB_ARG_SND_BB": "XXXX"}}}

_MARKER = r"(?:<[^>]*>|\[[^\]]*\])"  # text delimited by <> or []
_SPACE = r"[ \t\r\n]*"
_WRAPPED = re.compile(f"({_MARKER}{_SPACE}){re.escape(_REASONING)}({_SPACE}{_MARKER}{_SPACE})")
_DELIMITED = re.compile(f"{re.escape(_REASONING)}{_SPACE}({_MARKER}{_SPACE})?")
_SEGMENT = re.compile(r"<[^>]*>|\[[^\]]*\]|[^<\[]+|[<\[][^<\[]*")
_THINKING = {"enable_thinking": True}


def _analyse(render: Render, supports_tool_calls: bool) -> ThinkingSection:
    user = {"role": "user", "content": _USER}
    start, end = _around_reasoning(render, user)
    start, end = _from_thinking_switch(render, user, start, end)
    if supports_tool_calls:
        start, end = _around_tool_call_reasoning(render, user, start, end)
    return ThinkingSection(start, end)


def _around_reasoning(render: Render, user: dict) -> tuple[str, str]:
    """The markers (with their whitespace) around reasoning_content in a rendered reply."""
    plain = render([user, {"role": "assistant", "content": _ANSWER}], False, None, _THINKING)
    reasoned = render([user, {"role": "assistant", "content": _ANSWER, "reasoning_content": _REASONING}],
                      False, None, _THINKING)
    if plain is None or reasoned is None or _REASONING not in _diff(plain, reasoned)[2]:
        return "", ""
    wrapped = _WRAPPED.search(reasoned)
    if wrapped:
        return wrapped.group(1), wrapped.group(2)
    delimited = _DELIMITED.search(reasoned)
    return "", (delimited.group(1) or "") if delimited else ""


def _from_thinking_switch(render: Render, user: dict, start: str, end: str) -> tuple[str, str]:
    """What the generation prompt gains with enable_thinking (an opening marker) or loses (an
    empty or closing block), or, when more differs, the two markers it ends with."""
    off = render([user], True, None, {"enable_thinking": False})
    on = render([user], True, None, _THINKING)
    if off is None or on is None:
        return start, end
    _, dropped, added, _ = _diff(off, on)
    dropped_core, added_core = dropped.strip(), added.strip()
    if not dropped_core and added:
        if added_core and on.endswith(added_core) and not start:
            start = added
    elif not added_core and dropped:
        if dropped_core and off.endswith(dropped_core) and not end:
            segments = [s for s in _segments(off) if s.strip()]
            if len(segments) >= 2 and segments[-1] == dropped_core and _is_marker(segments[-2]):
                start = segments[-2]
            end = dropped
    elif dropped_core and added_core:
        for base, extended in ((on, off), (off, on)):
            anchor = base[-64:]
            at = extended.rfind(anchor)
            if at < 0 or at + len(anchor) >= len(extended):
                continue
            extra = [s for s in _segments(extended[at + len(anchor):].strip()) if s.strip()]
            if len(extra) == 2 and all(_is_marker(s) for s in extra):
                start, end = start or extra[0], end or extra[1]
                break
    return start, end


def _around_tool_call_reasoning(render: Render, user: dict, start: str, end: str) -> tuple[str, str]:
    """Templates that show reasoning only in turns with tool calls (Command R7B)."""
    answered = render([user, {"role": "assistant", "content": _ANSWER, "reasoning_content": _REASONING}],
                      False, _TOOLS, _THINKING)
    called = render([user, {"role": "assistant", "content": None, "reasoning_content": _REASONING,
                            "tool_calls": [_CALL]}], False, _TOOLS, _THINKING)
    if answered is None or called is None or _REASONING in answered or _REASONING not in called:
        return start, end
    wrapped = _WRAPPED.search(called)
    if wrapped:
        return wrapped.group(1), wrapped.group(2).lstrip(" \t\r\n")
    delimited = _DELIMITED.search(called)
    return start, (delimited.group(1) or "") if delimited else end


# --- llama.cpp's marker-aware diff (calculate_diff_split) ---------------------------------------

def _is_marker(segment: str) -> bool:
    return len(segment) >= 2 and (segment[0], segment[-1]) in (("<", ">"), ("[", "]"))


def _segments(text: str) -> list[str]:
    """Markers (`<...>`, `[...]`) and the text between them."""
    return _SEGMENT.findall(text)


def _diff(left: str, right: str) -> tuple[str, str, str, str]:
    """(common prefix, left's middle, right's middle, common suffix), matching whole markers
    from both ends before comparing text character by character."""
    lseg, rseg = _segments(left), _segments(right)
    if not lseg:
        return "", "", right, ""
    if not rseg:
        return "", left, "", ""
    ls, le, rs, re_ = 0, len(lseg) - 1, 0, len(rseg) - 1
    prefix = suffix = ""
    left_done = right_done = False
    while ls != le and rs != re_:
        advanced = False
        if lseg[ls] == rseg[rs]:
            prefix += lseg[ls]
            ls, rs, advanced = ls + 1, rs + 1, True
        if lseg[le] == rseg[re_]:
            suffix = lseg[le] + suffix
            if ls != le:
                le -= 1
            else:
                left_done = True
            if rs != re_:
                re_ -= 1
            else:
                right_done = True
            advanced = True
        if not advanced:
            break
    if ls == le and rs != re_:
        if lseg[ls] == rseg[re_]:
            suffix, re_, left_done = rseg[re_] + suffix, re_ - 1, True
        elif lseg[ls] == rseg[rs]:
            prefix, rs, left_done = prefix + rseg[rs], rs + 1, True
    elif rs == re_ and ls != le:
        if lseg[le] == rseg[rs]:
            suffix, le, right_done = lseg[le] + suffix, le - 1, True
        elif lseg[ls] == rseg[rs]:
            prefix, ls, right_done = prefix + lseg[ls], ls + 1, True
    elif ls == le and rs == re_ and lseg[ls] == rseg[rs] and _is_marker(lseg[ls]):
        prefix += rseg[rs]
        left_done = right_done = True
    text_suffix = not _is_marker(lseg[le]) and not _is_marker(rseg[re_])
    text_prefix = not _is_marker(rseg[rs]) and not _is_marker(lseg[ls])
    rest_left = "".join(lseg[ls:le if left_done else le + 1])
    rest_right = "".join(rseg[rs:re_ if right_done else re_ + 1])
    tail = _common_suffix_length(rest_left, rest_right) if text_suffix else 0
    head = common_prefix_length(rest_left[:len(rest_left) - tail], rest_right[:len(rest_right) - tail]) \
        if text_prefix else 0
    prefix += rest_left[:head]
    suffix = rest_left[len(rest_left) - tail:] + suffix
    middle_left = rest_left[head:len(rest_left) - tail]
    middle_right = rest_right[head:len(rest_right) - tail]
    if not middle_left and not middle_right:
        return left, "", "", ""
    if not middle_left and right.startswith(left):
        return left, "", right[len(left):], ""
    return prefix, middle_left, middle_right, suffix


def _common_suffix_length(a: str, b: str) -> int:
    return common_prefix_length(a[::-1], b[::-1])
