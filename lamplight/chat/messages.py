"""Validation and normalization of OpenAI-style chat messages before they reach a template.

Decisions (mirroring llama-server's `common_chat_msgs_parse_oaicompat` where it matters):
- roles: system, user, assistant, tool and developer; `developer` is rewritten to `system`
  (llama.cpp's role workaround: templates do not know the newer OpenAI role).
- non-assistant messages need `content` (a string or a list of parts); assistant messages need
  `content` or `tool_calls`, and a null `content` is kept as None here (the capability probes
  render it so); the template gets "" instead (adapt_to_caps), as llama-server renders it.
- text parts are joined with "\n" exactly as llama.cpp concatenates typed text; image/audio/video
  parts raise MultimodalNotSupported, unless the server has a vision model: then each image part
  becomes the media marker first (with_media_markers), with no newline next to a marker, as
  llama-server renders `["Compare", image, "with"]` as "Compare<__media__>with".
- only the keys llama.cpp forwards reach the template, in its order: role, content,
  reasoning_content (+ its `thinking` alias for gpt-oss templates), name, tool_call_id, tool_calls.
- tool_calls `function.arguments` given as a JSON string holding an object are parsed (templates
  iterate them with `|items`); other strings are left untouched. A missing call `type` means
  "function".

normalize_messages is idempotent, so render() can apply it again safely.
"""

from __future__ import annotations

import json
from typing import Any

from lamplight.chat.errors import ChatTemplateError, MultimodalNotSupported

ROLES = ("system", "user", "assistant", "tool", "developer")
MEDIA_PART_TYPES = ("image_url", "input_audio", "input_video", "image", "audio", "video")


def normalize_messages(messages: list) -> list[dict]:
    """Return template-ready copies of `messages`, or raise ChatTemplateError saying what is wrong."""
    if not isinstance(messages, list) or not messages:
        raise ChatTemplateError("'messages' must be a non-empty array of message objects")
    return [_normalize_message(index, message) for index, message in enumerate(messages)]


def _normalize_message(index: int, message: Any) -> dict:
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise ChatTemplateError(f"{where} must be an object")
    role = _role(where, message)
    content = _content(where, message.get("content"))
    tool_calls = _tool_calls(where, message.get("tool_calls")) if role == "assistant" else []
    if content is None and role != "assistant":
        raise ChatTemplateError(f"{where} (role '{role}') must have 'content'")
    if content is None and not tool_calls:
        raise ChatTemplateError(f"{where} (role 'assistant') must have 'content' or 'tool_calls'")
    return _template_message(message, role, content, tool_calls)


def _role(where: str, message: dict) -> str:
    role = message.get("role")
    if role is None:
        raise ChatTemplateError(f"{where} is missing 'role'")
    if role not in ROLES:
        raise ChatTemplateError(f"{where} has unknown role {role!r}; expected one of {', '.join(ROLES)}")
    return "system" if role == "developer" else role


def _content(where: str, content: Any) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        return _join_text_parts(where, content)
    raise ChatTemplateError(f"{where}.content must be a string, an array of content parts or null")


def _join_text_parts(where: str, parts: list) -> str:
    text = ""
    for index, part in enumerate(parts):
        piece = _text_of_part(f"{where}.content[{index}]", part)
        # Same rule as llama.cpp: a separator only once some text has accumulated.
        text = f"{text}\n{piece}" if text else piece
    return text


def _text_of_part(where: str, part: Any) -> str:
    if not isinstance(part, dict) or "type" not in part:
        raise ChatTemplateError(f"{where} must be an object with a 'type'")
    kind = part["type"]
    if kind in MEDIA_PART_TYPES:
        raise MultimodalNotSupported(
            f"this model has no multimodal projector: {kind} input is not supported ({where})"
        )
    if kind != "text":
        raise ChatTemplateError(f"{where} has unsupported content part type {kind!r}")
    if not isinstance(part.get("text"), str):
        raise ChatTemplateError(f"{where} (type 'text') must have a string 'text'")
    return part["text"]


IMAGE_PART_TYPES = ("image_url", "image")


def chat_media_parts(messages: Any) -> list[tuple[str, dict]]:
    """(where, part) of every media part of `messages`, in message order (the order of the
    markers with_media_markers renders); MultimodalNotSupported for audio and video parts."""
    found = []
    for index, message in enumerate(messages if isinstance(messages, list) else []):
        content = message.get("content") if isinstance(message, dict) else None
        for p, part in enumerate(content if isinstance(content, list) else []):
            kind = part.get("type") if isinstance(part, dict) else None
            where = f"messages[{index}].content[{p}]"
            if kind in IMAGE_PART_TYPES:
                found.append((where, part))
            elif kind in MEDIA_PART_TYPES:
                raise MultimodalNotSupported(f"{kind} input is not supported: the model's projector takes images "
                                             f"only ({where})")
    return found


def image_url_of(part: dict, where: str) -> str:
    """An image part's URL: `image_url: {url}` (OpenAI), or a string."""
    value = part.get("image_url", part.get("image"))
    url = value.get("url") if isinstance(value, dict) else value
    if not isinstance(url, str):
        raise ChatTemplateError(f"{where} (type '{part.get('type')}') must have an image_url with a string 'url'")
    return url


def with_media_markers(messages: Any, marker: str) -> Any:
    """`messages` with each content array that holds images as one string: its image parts
    are `marker`, text parts joined with "\n" only where two text parts meet (llama-server's
    rendering). Other messages are kept as they are (normalize_messages checks them)."""
    if not isinstance(messages, list):
        return messages
    return [_with_markers(message, marker) for message in messages]


def _with_markers(message: Any, marker: str) -> Any:
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, list) or not any(
            isinstance(part, dict) and part.get("type") in IMAGE_PART_TYPES for part in content):
        return message
    text, previous_was_text = "", False
    for index, part in enumerate(content):
        if isinstance(part, dict) and part.get("type") in IMAGE_PART_TYPES:
            text, previous_was_text = text + marker, False
            continue
        piece = _text_of_part(f"content[{index}]", part)
        text = f"{text}\n{piece}" if previous_was_text and text else text + piece
        previous_was_text = True
    return {**message, "content": text}


def _tool_calls(where: str, tool_calls: Any) -> list[dict]:
    if tool_calls is None:
        return []
    if not isinstance(tool_calls, list):
        raise ChatTemplateError(f"{where}.tool_calls must be an array")
    return [_tool_call(f"{where}.tool_calls[{index}]", call) for index, call in enumerate(tool_calls)]


def _tool_call(where: str, call: Any) -> dict:
    if not isinstance(call, dict):
        raise ChatTemplateError(f"{where} must be an object")
    if call.get("type", "function") != "function":
        raise ChatTemplateError(f"{where} has unsupported type {call.get('type')!r}")
    function = call.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise ChatTemplateError(f"{where} must have a 'function' object with a string 'name'")
    normalized = {
        "type": "function",
        "function": {"name": function["name"], "arguments": _arguments(function.get("arguments"))},
    }
    if isinstance(call.get("id"), str):
        normalized["id"] = call["id"]
    return normalized


def _arguments(arguments: Any) -> Any:
    if not isinstance(arguments, str):
        return {} if arguments is None else arguments
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return arguments
    return parsed if isinstance(parsed, dict) else arguments


def _template_message(message: dict, role: str, content: str | None, tool_calls: list[dict]) -> dict:
    normalized: dict[str, Any] = {"role": role, "content": content}
    reasoning = message.get("reasoning_content")
    if isinstance(reasoning, str) and reasoning:
        normalized["reasoning_content"] = reasoning
        normalized["thinking"] = reasoning
    for key in ("name", "tool_call_id"):
        if isinstance(message.get(key), str):
            normalized[key] = message[key]
    if tool_calls:
        normalized["tool_calls"] = tool_calls
    return normalized


def adapt_to_caps(messages: list[dict], caps: Any, *, keep_null_content: bool = False) -> list[dict]:
    """What llama.cpp does before rendering: null content as "" for every template (unless
    `keep_null_content`); for templates lacking a capability (lamplight.chat.caps), system
    messages folded into the next user turn ("system text\nuser text") and tool-call arguments
    as JSON text."""
    if not keep_null_content:
        messages = _empty_null_content(messages)
    if not caps.supports_system_role:
        messages = _fold_system_messages(messages)
    if not caps.supports_object_arguments:
        messages = [_with_text_arguments(message) for message in messages]
    return messages


def _empty_null_content(messages: list[dict]) -> list[dict]:
    # llama-server holds a message's content as a string, so `content: null` (what the openai
    # client sends back with tool calls) reaches the template as "": common_chat_msg's
    # to_json_oaicompat writes an empty content as "". Templates that test `content is none`
    # (the DeepSeek R1 distills) or print it (GLM's would print "None") render as with "".
    return [{**message, "content": ""} if message["content"] is None else message for message in messages]


def _fold_system_messages(messages: list[dict]) -> list[dict]:
    folded: list[dict] = []
    pending: list[str] = []
    for message in messages:
        if message["role"] == "system":
            pending.append(message["content"] or "")
            continue
        if pending and message["role"] == "user":
            message = {**message, "content": "\n".join([*pending, message["content"] or ""])}
            pending = []
        folded.append(message)
    return folded


def _with_text_arguments(message: dict) -> dict:
    if "tool_calls" not in message:
        return message
    calls = [{**call, "function": {**call["function"], "arguments": _arguments_text(call["function"]["arguments"])}}
             for call in message["tool_calls"]]
    return {**message, "tool_calls": calls}


def _arguments_text(arguments: Any) -> Any:
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


def adapt_to_template(messages: list[dict], source: str) -> list[dict]:
    """The message shapes two template families expect instead of OpenAI's, recognised by their
    source as llama.cpp's chat format detection does (common/chat.cpp):
    - Ministral 3 (`[SYSTEM_PROMPT]`, `[TOOL_CALLS]`, `[ARGS]`, no `[CALL_ID]`; Magistral,
      Devstral): system and assistant content as typed blocks, reasoning first as a `thinking`
      block, then the content as a `text` block;
    - Gemma 4 templates older than the one with an OpenAI Chat Completions section: tool results
      inside the assistant turn that called the tools, as its `tool_responses`."""
    if all(marker in source for marker in ("[SYSTEM_PROMPT]", "[TOOL_CALLS]", "[ARGS]")) and "[CALL_ID]" not in source:
        return [_with_typed_blocks(message) for message in messages]
    if "'<|tool_call>call:'" in source and "{#- OpenAI Chat Completions:" not in source:
        return _with_tool_responses(messages)
    return messages


def _with_typed_blocks(message: dict) -> dict:
    if message["role"] not in ("system", "assistant"):
        return message
    blocks: list[dict] = []
    if "reasoning_content" in message:
        blocks.append({"type": "thinking", "thinking": message["reasoning_content"]})
    content = message["content"]
    blocks.extend(content if isinstance(content, list) else [{"type": "text", "text": content or ""}])
    typed = {key: value for key, value in message.items() if key not in ("reasoning_content", "thinking")}
    typed["content"] = blocks
    return typed


def _with_tool_responses(messages: list[dict]) -> list[dict]:
    """assistant(tool calls), tool results[, assistant(answer)] -> one assistant turn holding the
    calls, the results (`{name, response}`, the response parsed as JSON where it is JSON) and the
    answer."""
    turns: list[dict] = []
    at = 0
    while at < len(messages):
        message = messages[at]
        at += 1
        if message["role"] != "assistant" or not message.get("tool_calls"):
            turns.append(message)
            continue
        calls = message["tool_calls"]
        responses = []
        while at < len(messages) and messages[at]["role"] == "tool":
            responses.append(_tool_response(messages[at], calls, len(responses)))
            at += 1
        turn = {"role": "assistant", "tool_calls": calls}
        if responses:
            turn["tool_responses"] = responses
        if at < len(messages) and messages[at]["role"] == "assistant" and not messages[at].get("tool_calls") \
                and messages[at]["content"]:
            turn["content"] = messages[at]["content"]
            at += 1
        if "reasoning_content" in message:
            turn["reasoning_content"] = message["reasoning_content"]
        turns.append(turn)
    return turns


def _tool_response(message: dict, calls: list[dict], index: int) -> dict:
    content = message["content"]
    try:
        response = json.loads(content) if isinstance(content, str) else content
    except ValueError:
        response = content
    name = calls[index]["function"]["name"] if index < len(calls) else ""
    return {"name": name or message.get("tool_call_id", ""), "response": response}
