"""chat.completion.chunk payloads -> OpenAI Responses stream events.

One output item is open at a time, in the order the chat stream writes them: thinking
(reasoning item), text (message item), each tool call (function_call item). A delta of another
kind closes the open item (its `.done` events) and opens the next (`output_item.added`, and a
content part for text). Every event has its `type` and a `sequence_number` counting from 0.
"""

from __future__ import annotations

from dataclasses import dataclass

from lamplight.engine.types import ErrorEvent

from .api_responses_output import (
    ResponseShell,
    content_part,
    function_call_item,
    is_cut,
    message_item,
    new_item_id,
    reasoning_item,
    response_usage,
)

_DELTA_EVENTS = {"reasoning": "response.reasoning_text.delta", "message": "response.output_text.delta",
                 "function_call": "response.function_call_arguments.delta"}
_TEXT_DONE_EVENTS = {"reasoning": "response.reasoning_text.done", "message": "response.output_text.done"}


@dataclass
class _OpenItem:
    kind: str  # "reasoning", "message" or "function_call"
    output_index: int
    id: str
    text: str = ""  # the thinking, the text or the call's arguments so far
    call_id: str = ""
    name: str = ""
    chat_index: int = -1  # a call's index among the chat reply's tool calls

    def item(self, status: str, done: bool) -> dict:
        """The item as it starts (`done` False) or ends; `status` is a message's."""
        text = self.text if done else None
        if self.kind == "reasoning":
            return reasoning_item(self.id, text)
        if self.kind == "message":
            return message_item(self.id, text, status)
        # The chat pipeline only hands over whole calls, even from a cut reply.
        return function_call_item(self.id, self.call_id, self.name, self.text if done else "",
                                  "completed" if done else "in_progress")

    def place(self) -> dict:
        """Where an event about this item points."""
        place = {"item_id": self.id, "output_index": self.output_index}
        return place if self.kind == "function_call" else {**place, "content_index": 0}

    def extra(self) -> dict:
        return {"logprobs": []} if self.kind == "message" else {}


class ResponseEvents:
    """The events of one streamed response; feed it the chat stream's chunks."""

    def __init__(self, shell: ResponseShell):
        self.shell = shell
        self.reasoning = ""  # every thinking delta, for the usage's reasoning_tokens
        self._sequence = 0
        self._done: list[dict] = []  # the finished output items
        self._open: _OpenItem | None = None
        self._finish_reason: str | None = None
        self._usage: dict = {}

    def start(self) -> list[dict]:
        snapshot = self.shell.snapshot("in_progress", [])
        return [self._event("response.created", response=snapshot),
                self._event("response.in_progress", response=snapshot)]

    def on_chunk(self, chunk: dict) -> list[dict]:
        self._usage = chunk.get("usage") or self._usage
        events: list[dict] = []
        for choice in chunk.get("choices") or []:
            self._finish_reason = choice.get("finish_reason") or self._finish_reason
            delta = choice.get("delta") or {}
            if delta.get("reasoning_content"):
                self.reasoning += delta["reasoning_content"]
                events += self._text("reasoning", delta["reasoning_content"])
            if delta.get("content"):
                events += self._text("message", delta["content"])
            for fragment in delta.get("tool_calls") or []:
                events += self._call_fragment(fragment)
        return events

    def finish(self, reasoning_tokens: int) -> list[dict]:
        """The last events: the open item closed, then response.completed (or .incomplete when
        the reply was cut) with the whole response. A reply without text or calls still has its
        (empty) message, as the JSON answer does."""
        incomplete = is_cut(self._finish_reason)
        events = self._close("incomplete" if incomplete else "completed")
        if not any(item["type"] in ("message", "function_call") for item in self._done):
            events += self._start("message") + self._close("incomplete" if incomplete else "completed")
        status = "incomplete" if incomplete else "completed"
        response = self.shell.snapshot(status, self._done, response_usage(self._usage, reasoning_tokens))
        return events + [self._event(f"response.{status}", response=response)]

    def fail(self, error: ErrorEvent) -> list[dict]:
        """A generation that failed after the stream began: an `error` event, then
        response.failed with the items finished so far."""
        response = self.shell.snapshot("failed", self._done, error={"code": "server_error", "message": error.message})
        return [self._event("error", code=error.type, message=error.message, param=None),
                self._event("response.failed", response=response)]

    def _event(self, type_: str, **fields) -> dict:
        event = {"type": type_, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event

    def _text(self, kind: str, piece: str) -> list[dict]:
        if self._open is not None and self._open.kind == kind:
            return self._delta(piece)
        return self._close("completed") + self._start(kind) + self._delta(piece)

    def _call_fragment(self, fragment: dict) -> list[dict]:
        """A tool call's piece: its first names the call (id, function name), the rest carry
        pieces of its arguments."""
        function = fragment.get("function") or {}
        events = []
        if self._open is None or self._open.kind != "function_call" or self._open.chat_index != fragment.get("index"):
            events = self._close("completed") + self._start(
                "function_call", call_id=fragment.get("id") or new_item_id("function_call"),
                name=function.get("name") or "", chat_index=fragment.get("index", -1))
        return events + (self._delta(function["arguments"]) if function.get("arguments") else [])

    def _delta(self, piece: str) -> list[dict]:
        item = self._open
        item.text += piece
        return [self._event(_DELTA_EVENTS[item.kind], **item.place(), delta=piece, **item.extra())]

    def _start(self, kind: str, **call) -> list[dict]:
        item = self._open = _OpenItem(kind, len(self._done), new_item_id(kind), **call)
        events = [self._event("response.output_item.added", output_index=item.output_index,
                              item=item.item("in_progress", done=False))]
        if kind != "function_call":
            events.append(self._event("response.content_part.added", **item.place(), part=content_part(kind, "")))
        return events

    def _close(self, status: str) -> list[dict]:
        item, self._open = self._open, None
        if item is None:
            return []
        if item.kind == "function_call":
            events = [self._event("response.function_call_arguments.done", **item.place(), arguments=item.text)]
        else:
            part = content_part(item.kind, item.text)
            events = [self._event(_TEXT_DONE_EVENTS[item.kind], **item.place(), text=item.text, **item.extra()),
                      self._event("response.content_part.done", **item.place(), part=part)]
        done = item.item(status, done=True)
        self._done.append(done)
        return events + [self._event("response.output_item.done", output_index=item.output_index, item=done)]
