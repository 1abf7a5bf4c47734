"""The chat pipeline's answer -> OpenAI Responses shapes: the Response object, its output items
(reasoning, message, function_call) and its usage. api_responses_stream.py streams the same
items as events."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .response_context import random_alnum

ITEM_ID_PREFIXES = {"reasoning": "rs", "message": "msg", "function_call": "fc"}
# A reply cut by max_output_tokens (or by the context) is "incomplete"; OpenAI names one reason.
CUT_FINISH_REASON = "length"
INCOMPLETE_DETAILS = {"reason": "max_output_tokens"}


def new_item_id(kind: str) -> str:
    return f"{ITEM_ID_PREFIXES[kind]}_{random_alnum()}"


def content_part(kind: str, text: str) -> dict:
    """The one content part of a reasoning or message item."""
    if kind == "reasoning":
        return {"type": "reasoning_text", "text": text}
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def reasoning_item(item_id: str, text: str | None) -> dict:
    """`text` None: the item as it starts streaming, without content yet."""
    return {"id": item_id, "type": "reasoning", "summary": [],
            "content": [] if text is None else [content_part("reasoning", text)]}


def message_item(item_id: str, text: str | None, status: str) -> dict:
    return {"id": item_id, "type": "message", "role": "assistant", "status": status,
            "content": [] if text is None else [content_part("message", text)]}


def function_call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict:
    return {"id": item_id, "type": "function_call", "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}


def output_items(message: dict, incomplete: bool) -> list[dict]:
    """A chat reply's message -> its output items: thinking, then the text (always one message
    when there are no calls), then the calls. A cut reply's text is the incomplete part unless
    calls follow it."""
    items = []
    if message.get("reasoning_content"):
        items.append(reasoning_item(new_item_id("reasoning"), message["reasoning_content"]))
    calls = message.get("tool_calls") or []
    if message.get("content") or not calls:
        status = "incomplete" if incomplete and not calls else "completed"
        items.append(message_item(new_item_id("message"), message.get("content") or "", status))
    items += [function_call_item(new_item_id("function_call"), call["id"], call["function"]["name"],
                                 call["function"]["arguments"], "completed") for call in calls]
    return items


def response_usage(chat_usage: dict, reasoning_tokens: int) -> dict:
    """OpenAI chat usage -> Responses usage. `reasoning_tokens`: the thinking text's tokens (its
    markers not counted), at most the output tokens."""
    output_tokens = chat_usage.get("completion_tokens", 0)
    input_tokens = chat_usage.get("prompt_tokens", 0)
    cached_tokens = (chat_usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return {
        "input_tokens": input_tokens,
        # cached_tokens: the prompt prefix reused from a slot; no explicit prompt-cache writes here.
        "input_tokens_details": {"cached_tokens": cached_tokens, "cache_write_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": min(reasoning_tokens, output_tokens)},
        "total_tokens": input_tokens + output_tokens,
    }


def is_cut(finish_reason: str | None) -> bool:
    return finish_reason == CUT_FINISH_REASON


@dataclass(frozen=True)
class ResponseShell:
    """What every snapshot of one response shares: its id, creation time, model and the
    request's echoed settings."""

    echo: dict
    model: str
    id: str = field(default_factory=lambda: f"resp_{random_alnum()}")
    created_at: int = field(default_factory=lambda: int(time.time()))

    def snapshot(self, status: str, output: list[dict], usage: dict | None = None,
                 error: dict | None = None) -> dict:
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": error,
            "incomplete_details": INCOMPLETE_DETAILS if status == "incomplete" else None,
            **self.echo,
            "model": self.model,
            "output": output,
            "usage": usage,
        }

    def from_chat(self, result: dict, reasoning_tokens: int) -> dict:
        """The Response object of a chat.completion result."""
        choice = result["choices"][0]
        incomplete = is_cut(choice["finish_reason"])
        return self.snapshot("incomplete" if incomplete else "completed", output_items(choice["message"], incomplete),
                             response_usage(result["usage"], reasoning_tokens))
