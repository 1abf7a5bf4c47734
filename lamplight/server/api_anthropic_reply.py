"""The chat pipeline's answers in Anthropic's Messages shapes: the message object, its stop reason
and usage, and Anthropic's error JSON."""

from __future__ import annotations

import json

from starlette.responses import Response

from lamplight.engine.types import FinalEvent

from .errors import ApiError
from .json_io import json_response

# Anthropic signs its thinking so that it can check it when a client sends it back; nothing here
# checks a signature (thinking sent back is read as plain text), so every block carries this one.
THINKING_SIGNATURE = "lamplight-unsigned"

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",  # loading the model, or the queue is full
}


def message_id(chat_id: str) -> str:
    """One id per request: the chat reply's, under Anthropic's prefix."""
    return "msg_" + chat_id.removeprefix("chatcmpl-")


def message_json(result: dict, final: FinalEvent | None, model: str, show_thinking: bool) -> dict:
    """A chat.completion object -> Anthropic's message."""
    choice = result["choices"][0]
    return message_object(message_id(result["id"]), model, content_blocks(choice["message"], show_thinking),
                          stop_reason(choice["finish_reason"], final), usage_json(result["usage"]))


def message_object(message_id: str, model: str, content: list[dict], stopped: tuple[str | None, str | None],
                   usage: dict) -> dict:
    """Anthropic's message; `stopped`: (stop_reason, stop_sequence), both None while it streams."""
    return {"id": message_id, "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": stopped[0], "stop_sequence": stopped[1], "usage": usage}


def content_blocks(message: dict, show_thinking: bool) -> list[dict]:
    """Thinking first, then the text, then the tool calls: the order they were written in."""
    blocks = []
    if message.get("reasoning_content"):
        blocks.append(thinking_block(message["reasoning_content"] if show_thinking else ""))
    if message.get("content"):
        blocks.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or []:
        blocks.append({**tool_use_start(call["id"], call["function"]["name"]),
                       "input": tool_input(call["function"]["arguments"])})
    return blocks


def thinking_block(thinking: str) -> dict:
    return {"type": "thinking", "thinking": thinking, "signature": THINKING_SIGNATURE}


def tool_use_start(call_id: str, name: str) -> dict:
    """A tool_use block before its input (streamed as input_json_delta pieces)."""
    return {"type": "tool_use", "id": call_id, "name": name, "input": {}}


def tool_input(arguments: str) -> dict:
    """A call's arguments (JSON text) as the object Anthropic's `input` is."""
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def stop_reason(finish_reason: str | None, final: FinalEvent | None) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence). A stop string ends a reply with finish reason "stop", as EOS
    does: only the engine's final event says which one it was."""
    if finish_reason == "tool_calls":
        return "tool_use", None
    if finish_reason == "length":
        return "max_tokens", None
    if final is not None and final.stop_type == "word":
        return "stop_sequence", final.stopping_word
    return "end_turn", None


def usage_json(usage: dict | None, prompt_tokens: int = 0) -> dict:
    """OpenAI's usage -> Anthropic's, where cache reads are not part of `input_tokens`. Without a
    usage yet (a stream's start): `prompt_tokens` in, nothing out."""
    if usage is None:
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": 0}
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return {
        "input_tokens": usage["prompt_tokens"] - cached,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": usage["completion_tokens"],
    }


def error_json(code: int, message: str) -> dict:
    error_type = ERROR_TYPES.get(code, "invalid_request_error" if code < 500 else "api_error")
    return {"type": "error", "error": {"type": error_type, "message": message}}


def error_response(exc: ApiError) -> Response:
    return json_response(error_json(exc.code, exc.message), status_code=exc.code)
