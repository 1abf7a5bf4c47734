"""Splitting a reply's thinking into `reasoning_content`, as llama-server's `reasoning_format` does.

- `none`: nothing is split; the thinking stays in `content` with its markers.
- `auto` and `deepseek` (the same here): text between the template family's start and end
  markers (lamplight.chat.reasoning_markers) at the start of the reply becomes
  `reasoning_content`; the rest, left-trimmed, is `content`. When the prompt already opened
  the thinking (a generation prompt ending in `<think>\\n`), the reply starts inside it.
  A reply cut before the end marker is all thinking.
- `deepseek-legacy`: `reasoning_content` as above, and `content` keeps the whole text.

Only chat replies are split; /completion and /v1/completions return the text untouched.
"""

from __future__ import annotations

from dataclasses import dataclass

from lamplight.chat.reasoning_markers import ReasoningMarkers
from lamplight.chat.text import marker_prefix_length

REASONING_FORMATS = ("none", "auto", "deepseek", "deepseek-legacy")


@dataclass(frozen=True)
class ReasoningSplit:
    reasoning: str | None  # None: the reply had no thinking
    content: str


@dataclass(frozen=True)
class ReasoningPlan:
    markers: ReasoningMarkers
    format: str
    opened: bool  # the prompt ends inside an open thinking block

    def split(self, text: str, partial: bool = False) -> ReasoningSplit:
        """Thinking and answer of `text`; `partial` holds back a trailing prefix of the end marker."""
        body, inside = self._thinking_body(text)
        if not inside and partial and self.markers.start.startswith(text.lstrip()):
            return ReasoningSplit(None, "")  # may still become the start marker
        if not inside:
            return ReasoningSplit(None, text)
        end = body.find(self.markers.end)
        if end < 0:
            thinking = body[:len(body) - marker_prefix_length(body, self.markers.end)] if partial else body
            return ReasoningSplit(thinking.strip() if not partial else thinking.lstrip(), self._content(text, ""))
        answer = body[end + len(self.markers.end):].lstrip()
        answer = answer.removeprefix(self.markers.answer_prefix)
        # Streamed thinking only grows; the final one is also right-trimmed.
        thinking = body[:end].lstrip() if partial else body[:end].strip()
        return ReasoningSplit(thinking, self._content(text, answer))

    def _thinking_body(self, text: str) -> tuple[str, bool]:
        if self.opened:
            return text, True
        stripped = text.lstrip()
        if stripped.startswith(self.markers.start):
            return stripped[len(self.markers.start):], True
        return text, False

    def _content(self, text: str, answer: str) -> str:
        return text if self.format == "deepseek-legacy" else answer


def plan_reasoning(markers: ReasoningMarkers | None, reasoning_format: str, prompt: str,
                   continues_thinking: bool = False) -> ReasoningPlan | None:
    """The split for a chat reply, or None when nothing is split. `continues_thinking`: the prompt
    continues an assistant message that has reasoning but no content yet (a prefill that ends
    inside its thinking, lamplight.chat.prefill)."""
    if markers is None or reasoning_format == "none":
        return None
    return ReasoningPlan(markers, reasoning_format, continues_thinking or opens_thinking(prompt, markers))


def opens_thinking(prompt: str, markers: ReasoningMarkers) -> bool:
    """The prompt ends with the start marker: its generation prompt opened the thinking."""
    return prompt.rstrip().endswith(markers.start.rstrip())

