"""lamplight's answers -> Ollama's: the chat pipeline's chat.completion object and chunks become
/api/chat and /api/generate replies; a raw or infill generation's engine events become
/api/generate lines (RawGenerateStream).

Every reply ends with `done: true`, `done_reason` and the counts and durations (nanoseconds):
prompt and eval durations are the engine's timings, total_duration the request's wall time in the
handler, load_duration what is left of it (parsing, the template, grammars, the queue: the model
itself is always loaded).
"""

from __future__ import annotations

import json
import logging
import time
from datetime import datetime, timezone

from lamplight.engine.types import FinalEvent, TokenEvent

from .response_context import ResponseContext
from .stream_formats import Payload, StreamFormat

log = logging.getLogger("lamplight.server")


def created_at() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def done_reason(finish_reason: str | None) -> str:
    """OpenAI's finish_reason -> Ollama's: a reply cut by the token limit is "length", anything
    else that ended by itself (EOS, a stop string, tool calls) "stop"."""
    return "length" if finish_reason == "length" else "stop"


def metrics(final: FinalEvent, started_ns: int) -> dict:
    total = time.monotonic_ns() - started_ns
    prompt, evaluation = round(final.timings.prompt_ms * 1e6), round(final.timings.predicted_ms * 1e6)
    return {"total_duration": total, "load_duration": max(total - prompt - evaluation, 0),
            "prompt_eval_count": final.n_prompt, "prompt_eval_duration": prompt,
            "eval_count": final.n_decoded, "eval_duration": evaluation}


def load_reply(model: str, generate: bool) -> dict:
    """Ollama's answer to an empty prompt or no messages: the model is loaded (it always is)."""
    head = {"model": model, "created_at": created_at()}
    body = {"response": ""} if generate else {"message": {"role": "assistant", "content": ""}}
    return {**head, **body, "done": True, "done_reason": "load"}


# -- the chat pipeline's answers (/api/chat, /api/generate with the template) --------------------

def _text_fields(generate: bool, content: str, thinking: str | None, tool_calls: list[dict] | None = None) -> dict:
    """A reply's text as /api/generate (`response`, `thinking`) or /api/chat (`message`) carries it."""
    if generate:
        return {"response": content, **({"thinking": thinking} if thinking else {})}
    message: dict = {"role": "assistant", "content": content}
    if thinking:
        message["thinking"] = thinking
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {"message": message}


def ollama_tool_calls(calls: list[dict]) -> list[dict]:
    """OpenAI's calls (arguments as JSON text) -> Ollama's (arguments as an object)."""
    return [{"function": {"name": call["function"]["name"], "arguments": _arguments(call["function"]["arguments"])}}
            for call in calls]


def _arguments(text: str) -> dict:
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        value = None
    if not isinstance(value, dict):  # Ollama's calls take objects only
        log.warning("tool call arguments are not a JSON object, sent as {}: %r", text[:200])
        return {}
    return value


def chat_reply(completion: dict, final: FinalEvent, started_ns: int, generate: bool = False) -> dict:
    """The chat.completion object (and its choice's FinalEvent) as one Ollama reply (stream: false)."""
    choice = completion["choices"][0]
    message = choice["message"]
    text = _text_fields(generate, message.get("content") or "", message.get("reasoning_content"),
                        ollama_tool_calls(message.get("tool_calls") or []))
    return {"model": completion["model"], "created_at": created_at(), **text, "done": True,
            "done_reason": done_reason(choice["finish_reason"]),
            **metrics(final, started_ns)}


class ChatLines:
    """chat.completion.chunk payloads -> Ollama's stream lines. Text and thinking go out as they
    come; tool calls (streamed by the pipeline as fragments) go out whole, in one line when the
    reply finishes; the usage chunk becomes the final `done` line."""

    def __init__(self, finals: dict[int, FinalEvent], started_ns: int, generate: bool = False):
        self.finals = finals  # the stream's FinalEvents, filled in before the usage chunk
        self.started_ns = started_ns
        self.generate = generate
        self.finish_reason: str | None = None
        self.calls: dict[int, dict] = {}  # index -> {"function": {"name", "arguments" (text so far)}}

    def on_chunk(self, chunk: dict) -> list[dict]:
        if chunk.get("usage") is not None:
            return [self._done(chunk)]
        lines = []
        for choice in chunk["choices"]:
            delta = choice.get("delta") or {}
            self._collect(delta.get("tool_calls") or [])
            if delta.get("content") or delta.get("reasoning_content"):
                lines.append(self._line(chunk, delta.get("content") or "", delta.get("reasoning_content")))
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
                if self.calls:
                    calls = ollama_tool_calls([self.calls[index] for index in sorted(self.calls)])
                    lines.append(self._line(chunk, "", None, calls))
        return lines

    def _collect(self, fragments: list[dict]) -> None:
        for fragment in fragments:
            call = self.calls.setdefault(fragment["index"], {"function": {"name": "", "arguments": ""}})
            function = fragment.get("function") or {}
            call["function"]["name"] += function.get("name") or ""
            call["function"]["arguments"] += function.get("arguments") or ""

    def _line(self, chunk: dict, content: str, thinking: str | None, calls: list[dict] | None = None) -> dict:
        return {"model": chunk["model"], "created_at": created_at(),
                **_text_fields(self.generate, content, thinking, calls), "done": False}

    def _done(self, chunk: dict) -> dict:
        return {"model": chunk["model"], "created_at": created_at(), **_text_fields(self.generate, "", None),
                "done": True, "done_reason": done_reason(self.finish_reason),
                **metrics(self.finals[0], self.started_ns)}


# -- raw and infill generations (/api/generate with `raw` or `suffix`) --------------------------

def raw_reply(ctx: ResponseContext, final: FinalEvent, started_ns: int, with_context: bool) -> dict:
    """The whole reply (stream: false); `context` (raw mode) is the prompt's tokens and the
    reply's, for the next raw request to continue from."""
    return {**_raw_done(ctx, final, started_ns, with_context), "response": final.content}


def _raw_done(ctx: ResponseContext, final: FinalEvent, started_ns: int, with_context: bool) -> dict:
    done = {"model": ctx.model, "created_at": created_at(), "response": "", "done": True,
            "done_reason": done_reason(final.finish_reason)}
    if with_context:
        done["context"] = [*ctx.prompts[0], *final.token_ids]
    return {**done, **metrics(final, started_ns)}


class RawGenerateStream(StreamFormat):
    """Engine events of a raw or infill generation -> /api/generate's stream lines."""

    def __init__(self, ctx: ResponseContext, started_ns: int, with_context: bool):
        super().__init__(ctx)
        self.started_ns = started_ns
        self.with_context = with_context

    def on_token(self, index: int, event: TokenEvent) -> list[Payload]:
        return [self._line(event.text)] if event.text else []

    def on_final(self, index: int, final: FinalEvent, unsent: str) -> list[Payload]:
        lines: list[Payload] = [self._line(unsent)] if unsent else []
        return lines + [_raw_done(self.ctx, final, self.started_ns, self.with_context)]

    def _line(self, text: str) -> dict:
        return {"model": self.ctx.model, "created_at": created_at(), "response": text, "done": False}


def error_line(message: str) -> dict:
    return {"error": message}
