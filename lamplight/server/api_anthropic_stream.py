"""A streamed chat reply's chunks -> Anthropic's stream events.

message_start; then per content block content_block_start, its deltas (thinking_delta and, last,
signature_delta; text_delta; input_json_delta with the arguments' pieces), content_block_stop;
then message_delta (stop reason, usage) and message_stop. A block opens when the reply's kind of
text changes (thinking -> text -> a tool call), so blocks come in the order they were written;
the chat pipeline already holds back text that may begin a tool call.
"""

from __future__ import annotations

from typing import Any

from lamplight.engine.types import ErrorEvent, FinalEvent

from .api_anthropic_reply import (
    THINKING_SIGNATURE,
    error_json,
    message_object,
    stop_reason,
    tool_use_start,
    usage_json,
)

_EMPTY_BLOCKS = {
    "thinking": {"type": "thinking", "thinking": "", "signature": ""},
    "text": {"type": "text", "text": ""},
}


class MessageEvents:
    def __init__(self, message_id: str, model: str, prompt_tokens: int, show_thinking: bool):
        self.message_id = message_id
        self.model = model
        self.prompt_tokens = prompt_tokens
        self.show_thinking = show_thinking
        self.n_blocks = 0  # blocks started so far; the open one is the last
        self.open: Any = None  # "thinking", "text", or the index of the tool call, while a block is open
        self.tool_blocks: dict[int, int] = {}  # the chat's tool call index -> its block's index
        self.finish_reason: str | None = None
        self.usage: dict | None = None

    def start(self) -> list[dict]:
        message = message_object(self.message_id, self.model, [], (None, None), usage_json(None, self.prompt_tokens))
        return [{"type": "message_start", "message": message}]

    def on_chunk(self, chunk: dict) -> list[dict]:
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        events = []
        for choice in chunk.get("choices") or []:
            self.finish_reason = choice.get("finish_reason") or self.finish_reason
            events += self._on_delta(choice.get("delta") or {})
        return events

    def finish(self, final: FinalEvent | None) -> list[dict]:
        reason, sequence = stop_reason(self.finish_reason, final)
        return self._close() + [
            {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
             "usage": usage_json(self.usage, self.prompt_tokens)},
            {"type": "message_stop"},
        ]

    def fail(self, error: ErrorEvent) -> list[dict]:
        """The generation failed mid-stream: an `error` event ends the stream."""
        return [error_json(error.code, error.message)]

    def _on_delta(self, delta: dict) -> list[dict]:
        events = []
        if delta.get("reasoning_content"):
            events += self._open("thinking")
            if self.show_thinking:
                events.append(self._delta({"type": "thinking_delta", "thinking": delta["reasoning_content"]}))
        if delta.get("content"):
            events += self._open("text") + [self._delta({"type": "text_delta", "text": delta["content"]})]
        for fragment in delta.get("tool_calls") or []:
            events += self._on_tool_fragment(fragment)
        return events

    def _on_tool_fragment(self, fragment: dict) -> list[dict]:
        """A call's first fragment has its id and name (and empty arguments); the rest add to
        its arguments."""
        events = []
        index = fragment["index"]
        if fragment.get("id"):
            events += self._close() + [self._start(tool_use_start(fragment["id"], fragment["function"]["name"]))]
            self.open = index
            self.tool_blocks[index] = self.n_blocks - 1
        arguments = fragment.get("function", {}).get("arguments")
        if arguments and index in self.tool_blocks:
            events.append(_block_event("delta", self.tool_blocks[index],
                                       delta={"type": "input_json_delta", "partial_json": arguments}))
        return events

    def _open(self, kind: str) -> list[dict]:
        if self.open == kind:
            return []
        events = self._close() + [self._start(dict(_EMPTY_BLOCKS[kind]))]
        self.open = kind
        return events

    def _start(self, block: dict) -> dict:
        self.n_blocks += 1
        return _block_event("start", self.n_blocks - 1, content_block=block)

    def _delta(self, delta: dict) -> dict:
        return _block_event("delta", self.n_blocks - 1, delta=delta)

    def _close(self) -> list[dict]:
        if self.open is None:
            return []
        events = []
        if self.open == "thinking":
            events.append(self._delta({"type": "signature_delta", "signature": THINKING_SIGNATURE}))
        self.open = None
        return events + [_block_event("stop", self.n_blocks - 1)]


def _block_event(kind: str, index: int, **payload: Any) -> dict:
    return {"type": f"content_block_{kind}", "index": index, **payload}
