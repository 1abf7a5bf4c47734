"""Engine events -> the SSE payloads of each endpoint (semantics doc 3.6).

One formatter per streamed request; it remembers what each choice has streamed so far.
"""

from __future__ import annotations

from typing import Any

from lamplight.engine.types import Event, FinalEvent, PromptProgress, Timings, TokenEvent
from lamplight.tools import ToolCallStream
from lamplight.tools import finish_reason as tool_finish_reason

from .responses_native import native_final, native_partial, native_progress, progress_json
from .responses_openai import (
    chat_chunk,
    chat_delta_chunk,
    chat_finish_chunk,
    chat_usage_chunk,
    completion_chunk,
    completion_final_chunk,
    split_reply,
)
from .response_context import ResponseContext

DONE = "[DONE]"
Payload = dict | str


def progress_timings(progress: PromptProgress) -> Timings:
    """Timings as of a prompt progress event: only the prompt part has started."""
    return Timings(progress.cache, progress.processed - progress.cache, progress.time_ms, 0, 0.0)


class StreamFormat:
    def __init__(self, ctx: ResponseContext):
        self.ctx = ctx
        self.streamed: dict[int, str] = {}
        self.finals: dict[int, FinalEvent] = {}
        self._timings: dict[int, Timings] = {}  # the latest timings of each choice

    def on_event(self, index: int, event: Event) -> list[Payload]:
        if isinstance(event, PromptProgress):
            self._timings[index] = progress_timings(event)
            return self.on_progress(index, event)
        if isinstance(event, TokenEvent):
            if event.timings is not None:
                self._timings[index] = event.timings
            self.streamed[index] = self.streamed.get(index, "") + event.text
            return self.on_token(index, event)
        if isinstance(event, FinalEvent):
            self.finals[index] = event
            return self.on_final(index, event, self._unsent(index, event))
        return []

    def on_progress(self, index: int, progress: PromptProgress) -> list[Payload]:
        return []

    def on_token(self, index: int, event: TokenEvent) -> list[Payload]:
        raise NotImplementedError

    def on_final(self, index: int, final: FinalEvent, unsent: str) -> list[Payload]:
        raise NotImplementedError

    def on_end(self) -> list[Payload]:
        return []

    def running_timings(self, index: int, event: Event | None = None) -> Timings | None:
        """Timings for `timings_per_token` chunks: the engine's, as of the latest event of the choice."""
        if not self.ctx.params.timings_per_token:
            return None
        return self._timings.get(index) or Timings(0, 0, 0.0, 0, 0.0)

    def _with_timings(self, payload: dict, index: int, event: Event) -> dict:
        timings = self.running_timings(index, event)
        if timings is not None:
            payload["timings"] = timings.to_json()
        return payload

    def _unsent(self, index: int, final: FinalEvent) -> str:
        """Text the final result has that no token event carried (normally none)."""
        streamed = self.streamed.get(index, "")
        return final.content[len(streamed):] if final.content.startswith(streamed) else ""


class NativeStream(StreamFormat):
    """/completion: partial objects, then the final object; no [DONE]."""

    def on_progress(self, index: int, progress: PromptProgress) -> list[Payload]:
        return [native_progress(self.ctx, index, progress, self.running_timings(index, progress))]

    def on_token(self, index: int, event: TokenEvent) -> list[Payload]:
        return [native_partial(self.ctx, index, event, self.running_timings(index, event))]

    def on_final(self, index: int, final: FinalEvent, unsent: str) -> list[Payload]:
        return [native_final(self.ctx, index, final, streamed_text=self.streamed.get(index, ""))]


class CompletionStream(StreamFormat):
    """/v1/completions: text chunks, a final chunk with usage and timings, then [DONE]."""

    def on_progress(self, index: int, progress: PromptProgress) -> list[Payload]:
        chunk = self._with_timings(completion_chunk(self.ctx, index, ""), index, progress)
        chunk["prompt_progress"] = progress_json(progress)
        return [chunk]

    def on_token(self, index: int, event: TokenEvent) -> list[Payload]:
        if not event.text and event.prob is None:
            return []
        return [self._with_timings(completion_chunk(self.ctx, index, event.text, event.prob), index, event)]

    def on_final(self, index: int, final: FinalEvent, unsent: str) -> list[Payload]:
        return [completion_final_chunk(self.ctx, index, final, unsent)]

    def on_end(self) -> list[Payload]:
        return [DONE]


class ChatStream(StreamFormat):
    """/v1/chat/completions: a role delta, content deltas, a finish chunk per choice, an optional
    usage chunk (`stream_options.include_usage`), then [DONE]. Timings go on the last chunk.

    With tools (tool_choice not "none") the text so far is parsed again after every token and
    only the differences go out, as `content` and `tool_calls` deltas (lamplight.tools.stream):
    text that may begin a call is held back. A token's logprobs ride on the last chunk it
    produced, or on a chunk with an empty delta when it produced none (logprobs are allowed with
    tools, streamed or not)."""

    def __init__(self, ctx: ResponseContext):
        super().__init__(ctx)
        self._role_sent: set[int] = set()
        plan = ctx.params.tool_plan
        self._plan = plan if plan is not None and plan.active else None
        self._tool_streams: dict[int, ToolCallStream] = {}
        # The text goes through split_reply (thinking, answer markers) before it is sent.
        self._split = self._plan is not None or ctx.params.reasoning is not None \
            or ctx.params.answer_wrapper is not None
        self._sent_reasoning: dict[int, int] = {}  # characters of reasoning_content sent per choice
        self._sent_content: dict[int, int] = {}  # characters of content sent per choice (reasoning on)

    def on_progress(self, index: int, progress: PromptProgress) -> list[Payload]:
        delta = self._role_delta(index) or {}
        chunk = self._with_timings(chat_chunk(self.ctx, [{"finish_reason": None, "index": index, "delta": delta}]),
                                   index, progress)
        chunk["prompt_progress"] = progress_json(progress)
        return [chunk]

    def on_token(self, index: int, event: TokenEvent) -> list[Payload]:
        payloads = self._role_chunk(index)
        if not self._split:
            if event.text or event.prob is not None:
                delta = {"content": event.text} if event.text else {}
                payloads.append(self._with_timings(chat_delta_chunk(self.ctx, index, delta, event.prob), index, event))
            return payloads
        if not event.text and event.prob is None:
            return payloads
        deltas = self._text_deltas(index, self.streamed[index], partial=True)[0] if event.text else []
        if not deltas and event.prob is None:
            return payloads
        return payloads + self._delta_chunks(index, deltas or [{}], event)

    def _text_deltas(self, index: int, text: str, partial: bool,
                     stop_type: str | None = None) -> tuple[list[dict], Any]:
        """Deltas for what `text` adds: thinking first, then content or tool calls. `stop_type`:
        how the reply ended, for the final parse (partial False)."""
        reasoning, content = split_reply(self.ctx.params, text, partial)
        deltas = []
        if reasoning is not None and len(reasoning) > self._sent_reasoning.get(index, 0):
            deltas.append({"reasoning_content": reasoning[self._sent_reasoning.get(index, 0):]})
            self._sent_reasoning[index] = len(reasoning)
        if self._plan is not None:
            stream = self._tool_stream(index)
            tool_deltas, parsed = stream.update(content) if partial else stream.finish(content, stop_type or "eos")
            return deltas + tool_deltas, parsed
        sent = self._sent_content.get(index, 0)
        if len(content) > sent:
            deltas.append({"content": content[sent:]})
            self._sent_content[index] = len(content)
        return deltas, None

    def _delta_chunks(self, index: int, deltas: list[dict], event: TokenEvent) -> list[Payload]:
        chunks: list[Payload] = [chat_delta_chunk(self.ctx, index, delta) for delta in deltas[:-1]]
        last = chat_delta_chunk(self.ctx, index, deltas[-1], event.prob)
        chunks.append(self._with_timings(last, index, event))
        return chunks

    def _tool_stream(self, index: int) -> ToolCallStream:
        if index not in self._tool_streams:
            self._tool_streams[index] = ToolCallStream(self._plan)
        return self._tool_streams[index]

    def on_final(self, index: int, final: FinalEvent, unsent: str) -> list[Payload]:
        payloads = self._role_chunk(index)
        finish_reason = None
        if self._split:
            deltas, parsed = self._text_deltas(index, final.content, partial=False, stop_type=final.stop_type)
            payloads += [chat_delta_chunk(self.ctx, index, delta) for delta in deltas]
            if parsed is not None:
                finish_reason = tool_finish_reason(parsed, final.stop_type, final.finish_reason)
        elif unsent:
            payloads.append(chat_delta_chunk(self.ctx, index, {"content": unsent}))
        finish = chat_finish_chunk(self.ctx, index, final, finish_reason)
        if not self.ctx.params.include_usage:
            finish["timings"] = final.timings.to_json()
        payloads.append(finish)
        return payloads

    def on_end(self) -> list[Payload]:
        if self.ctx.params.include_usage and self.finals:
            first = self.finals[min(self.finals)]
            return [chat_usage_chunk(self.ctx, self.finals, first.timings), DONE]
        return [DONE]

    def _role_delta(self, index: int) -> dict | None:
        if index in self._role_sent:
            return None
        self._role_sent.add(index)
        return {"role": "assistant", "content": None}

    def _role_chunk(self, index: int) -> list[Payload]:
        delta = self._role_delta(index)
        if delta is None:
            return []
        return [chat_chunk(self.ctx, [{"finish_reason": None, "index": index, "delta": delta}])]
