"""An Anthropic Messages request -> the /v1/chat/completions body the chat pipeline runs.

Everything Anthropic-specific is checked here, strictly, and a refusal is a 400 naming the field
by its path in the request ("messages.2.content.0.tool_use_id"); what the chat pipeline checks
itself (tool schemas, stop string limits, sampling ranges, the template) it checks once, there.

Turns: consecutive messages of one role are one turn (as Anthropic combines them). A user turn's
`tool_result` blocks become `tool` messages (first: they answer the previous assistant turn's
calls), its text and images one user message; an assistant turn's text, `tool_use` blocks and
`thinking` become one assistant message with `tool_calls` and `reasoning_content`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from lamplight.sampling.params import SamplingParams
from lamplight.sampling.spec import sampling_fields
from lamplight.sampling.values import check_integer

from .errors import ApiError, field_error
from .fields import INT32_MAX, Fields

USER_BLOCKS = ("text", "image", "tool_result")
ASSISTANT_BLOCKS = ("text", "thinking", "redacted_thinking", "tool_use")
TOOL_RESULT_BLOCKS = ("text", "image")
TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}  # and "tool": that function
THINKING_TYPES = ("enabled", "disabled", "adaptive")
THINKING_DISPLAYS = ("summarized", "omitted")
EFFORTS = ("low", "medium", "high", "xhigh", "max")
# Anthropic's own sampling fields, in its ranges (narrower than llama-server's).
UNIT_RANGE_FIELDS = ("temperature", "top_p")
# llama-server's sampling fields (min_p, seed, repeat_penalty ...) pass through to the chat body,
# as on /v1/chat/completions; Anthropic's own are read above, in its ranges.
EXTENSION_FIELDS = tuple(name for name, _ in sampling_fields(SamplingParams)
                         if name not in (*UNIT_RANGE_FIELDS, "top_k"))
# The chat body's field -> the Anthropic field it came from, for the pipeline's 400s.
ANTHROPIC_NAMES = {
    "stop": "stop_sequences",
    "response_format": "output_config.format",
    "reasoning_budget_tokens": "thinking.budget_tokens",
    "parallel_tool_calls": "tool_choice.disable_parallel_tool_use",
}
# Claude Code opens its system prompt with a checksum that changes on every request; masked (as
# llama-server masks it) the prompt keeps its prefix, and its KV cache, from one request to the next.
_BILLING_CHECKSUM = re.compile(r"\A(x-anthropic-billing-header:[^\n]*?cch=)[^;\n]{5};")
_NAMED_FIELD = re.compile(r"\AField '([^']*)'")  # how errors.field_error names a field


@dataclass(frozen=True)
class MessagesRequest:
    chat_body: dict  # what /v1/chat/completions takes
    model: str  # as the request named it ("" when it did not)
    stream: bool
    show_thinking: bool  # False with thinking.display "omitted": thinking blocks without their text


def read_messages_request(body: dict, counting: bool = False) -> MessagesRequest:
    """`counting`: a /v1/messages/count_tokens body, which has no max_tokens."""
    fields = Fields(body)
    messages = fields.raw("messages")
    chat: dict[str, Any] = {"messages": _system(fields.raw("system"), _inline_system(messages)) + _messages(messages)}
    if not counting:
        chat["max_tokens"] = _max_tokens(fields)
    chat.update(_sampling(fields))
    chat.update(_tools(fields.raw("tools"), fields.raw("tool_choice")))
    chat.update(_output_format(fields))
    chat.update({name: body[name] for name in EXTENSION_FIELDS if body.get(name) is not None})
    thinking, show_thinking = _thinking(fields.raw("thinking"), _template_kwargs(fields))
    chat.update(thinking)
    _metadata(fields.raw("metadata"))
    return MessagesRequest(chat, fields.string("model", ""), fields.boolean("stream", False), show_thinking)


def with_anthropic_names(error: ApiError) -> ApiError:
    """A chat pipeline's 400 naming a chat field, naming the Anthropic field instead."""
    named = _NAMED_FIELD.match(error.message)
    if named is None or named.group(1) not in ANTHROPIC_NAMES:
        return error
    message = f"Field '{ANTHROPIC_NAMES[named.group(1)]}'" + error.message[named.end():]
    return ApiError(error.code, message, error.type, **error.extra)


# -- checked values ---------------------------------------------------------------------------

def _shown(value: Any) -> str:
    """A value as an error message quotes it: short."""
    return repr(value[:40]) if isinstance(value, str) else json.dumps(value, ensure_ascii=False)[:40]


def _integer(value: Any, path: str, minimum: int) -> int:
    if value is None:
        raise field_error(path, f"is required (an integer >= {minimum})")
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # JSON has one number type, as Fields.integer reads it
    try:
        check_integer(value, minimum=minimum, maximum=INT32_MAX)
    except ValueError as exc:
        raise field_error(path, str(exc)) from None
    return value


def _string(value: Any, path: str, non_empty: bool = False) -> str:
    if not isinstance(value, str) or (non_empty and not value):
        raise field_error(path, f"must be a {'non-empty ' if non_empty else ''}string, got {_shown(value)}")
    return value


def _object(value: Any, path: str) -> dict:
    if not isinstance(value, dict):
        raise field_error(path, f"must be an object, got {_shown(value)}")
    return value


def _array(value: Any, path: str) -> list:
    if not isinstance(value, list):
        raise field_error(path, f"must be an array, got {_shown(value)}")
    return value


def _optional_boolean(block: dict, key: str, path: str) -> bool:
    value = block.get(key)
    if value is not None and not isinstance(value, bool):
        raise field_error(f"{path}.{key}", f"must be a boolean, got {_shown(value)}")
    return bool(value)


def _choice(value: Any, path: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise field_error(path, f"must be one of {', '.join(allowed)}, got {_shown(value)}")
    return value


# -- top-level fields ---------------------------------------------------------------------------

def _max_tokens(fields: Fields) -> int:
    if not fields.given("max_tokens"):
        raise field_error("max_tokens", "is required (an integer >= 1)")
    return fields.integer("max_tokens", 0, minimum=1, maximum=INT32_MAX)


def _sampling(fields: Fields) -> dict:
    chat: dict[str, Any] = {}
    for name in UNIT_RANGE_FIELDS:
        if fields.given(name):
            chat[name] = fields.number(name, 0.0, minimum=0, maximum=1)
    if fields.given("top_k"):
        chat["top_k"] = fields.integer("top_k", 0, minimum=0)
    if fields.given("stop_sequences"):
        chat["stop"] = fields.string_list("stop_sequences", [])
    return chat


def _metadata(metadata: Any) -> None:
    """Accepted and checked; nothing here uses it."""
    if metadata is not None and _object(metadata, "metadata").get("user_id") is not None:
        _string(metadata["user_id"], "metadata.user_id")


def _template_kwargs(fields: Fields) -> dict:
    return dict(fields.object("chat_template_kwargs") or {})


def _thinking(thinking: Any, template_kwargs: dict) -> tuple[dict, bool]:
    """-> (the chat body's thinking fields, whether thinking text is shown). enabled: the budget
    and `enable_thinking` for templates that read it; adaptive: thinking on, unlimited; disabled:
    budget 0 (the pipeline then closes a thinking block the generation prompt opens). Absent:
    the server's defaults (--reasoning-budget, the template's own)."""
    if thinking is None:
        return ({"chat_template_kwargs": template_kwargs} if template_kwargs else {}), True
    kind = _choice(_object(thinking, "thinking").get("type"), "thinking.type", THINKING_TYPES)
    display = thinking.get("display")
    if display is not None:
        _choice(display, "thinking.display", THINKING_DISPLAYS)
    if kind == "disabled":
        return _with_kwargs({"reasoning_budget_tokens": 0}, template_kwargs), True
    budget = _integer(thinking.get("budget_tokens"), "thinking.budget_tokens", minimum=1) \
        if kind == "enabled" else -1
    template_kwargs.setdefault("enable_thinking", True)
    return _with_kwargs({"reasoning_budget_tokens": budget}, template_kwargs), display != "omitted"


def _with_kwargs(chat: dict, template_kwargs: dict) -> dict:
    return {**chat, "chat_template_kwargs": template_kwargs} if template_kwargs else chat


def _output_format(fields: Fields) -> dict:
    """Structured output: `output_config.format` (or the older `output_format`) -> a JSON
    schema `response_format`; `output_config.effort` is accepted and has no effect here."""
    config = fields.object("output_config") or {}
    if config.get("effort") is not None:
        _choice(config["effort"], "output_config.effort", EFFORTS)
    formats = [(path, value) for path, value in (("output_config.format", config.get("format")),
                                                  ("output_format", fields.raw("output_format")))
               if value is not None]
    if not formats:
        return {}
    if len(formats) > 1:
        raise field_error("output_format", "give either output_config.format or output_format, not both")
    path, output_format = formats[0]
    _choice(_object(output_format, path).get("type"), f"{path}.type", ("json_schema",))
    schema = _object(output_format.get("schema"), f"{path}.schema")
    return {"response_format": {"type": "json_schema", "json_schema": {"schema": schema}}}


# -- system and messages -------------------------------------------------------------------------

def _system(system: Any, inline: list[dict]) -> list[dict]:
    """The system prompt: `system`, then the text of the conversation's system messages."""
    if system is None:
        parts = []
    elif isinstance(system, str):
        parts = [{"type": "text", "text": system}] if system else []
    else:
        parts = [_text_part(block, f"system.{index}", ("text",))
                 for index, block in enumerate(_array(system, "system"))]
    if parts:
        parts[0]["text"] = _unchecksummed(parts[0]["text"])
    parts += inline
    if isinstance(system, str) and not inline:
        return [{"role": "system", "content": parts[0]["text"]}] if parts else []
    return [{"role": "system", "content": parts}] if parts else []


def _inline_system(messages: Any) -> list[dict]:
    """Text parts of the `system` messages inside `messages` (Claude Code sends them among the
    turns). They join the system prompt: chat templates take a system message first only."""
    if not isinstance(messages, list):
        return []  # _messages says what is wrong
    parts = []
    for index, message in enumerate(messages):
        if isinstance(message, dict) and message.get("role") == "system":
            path = f"messages.{index}.content"
            content = message.get("content")
            if isinstance(content, str):
                parts += [{"type": "text", "text": content}] if content else []
            else:
                parts += [_text_part(block, f"{path}.{i}", ("text",)) for i, block in enumerate(_array(content, path))]
    return parts


def _unchecksummed(text: str) -> str:
    return _BILLING_CHECKSUM.sub(r"\g<1>fffff;", text)


@dataclass
class _Turn:
    role: str
    blocks: list[tuple[str, dict]]  # (path, block)


def _messages(messages: Any) -> list[dict]:
    if messages is None:
        raise field_error("messages", "is required (an array of messages)")
    if not _array(messages, "messages"):
        raise field_error("messages", "must hold at least one message")
    chat: list[dict] = []
    tool_use_ids: set[str] = set()
    turns = _turns(messages)
    if not turns:
        raise field_error("messages", "must hold at least one user or assistant message")
    for turn in turns:
        if turn.role == "user":
            chat += _user_messages(turn, tool_use_ids)
        else:
            chat += _assistant_message(turn, tool_use_ids)
    return chat


def _turns(messages: list) -> list[_Turn]:
    turns: list[_Turn] = []
    for index, message in enumerate(messages):
        path = f"messages.{index}"
        message = _object(message, path)
        role = _choice(message.get("role"), f"{path}.role", ("user", "assistant", "system"))
        if role == "system":
            continue  # joined to the system prompt (_inline_system)
        blocks = _blocks(message.get("content"), f"{path}.content",
                         USER_BLOCKS if role == "user" else ASSISTANT_BLOCKS, f"a {role} message")
        if turns and turns[-1].role == role:
            turns[-1].blocks += blocks
        else:
            turns.append(_Turn(role, blocks))
    return turns


def _blocks(content: Any, path: str, allowed: tuple[str, ...], where_it_is: str) -> list[tuple[str, dict]]:
    """The content's blocks with their paths; a string is one text block."""
    if isinstance(content, str):
        return [(path, {"type": "text", "text": content})]
    if not isinstance(content, list):
        raise field_error(path, f"must be a string or an array of content blocks, got {_shown(content)}")
    blocks = []
    for index, block in enumerate(content):
        where = f"{path}.{index}"
        kind = _object(block, where).get("type")
        if kind not in allowed:
            raise field_error(f"{where}.type", f"block type {_shown(kind)} is not supported in {where_it_is} "
                                               f"(expected one of {', '.join(allowed)})")
        blocks.append((where, block))
    return blocks


def _user_messages(turn: _Turn, tool_use_ids: set[str]) -> list[dict]:
    """`tool` messages for the tool results (first), then one user message with the rest."""
    results = [_tool_message(path, block, tool_use_ids) for path, block in turn.blocks
               if block["type"] == "tool_result"]
    parts = [_part(path, block, USER_BLOCKS) for path, block in turn.blocks if block["type"] != "tool_result"]
    return results + ([{"role": "user", "content": parts}] if parts or not results else [])


def _part(path: str, block: dict, allowed: tuple[str, ...]) -> dict:
    if block["type"] == "image":
        return _image_part(path, block)
    return _text_part(block, path, allowed)


def _text_part(block: Any, path: str, allowed: tuple[str, ...]) -> dict:
    kind = _object(block, path).get("type")
    if kind != "text":
        raise field_error(f"{path}.type", f"must be one of {', '.join(allowed)}, got {_shown(kind)}")
    return {"type": "text", "text": _string(block.get("text"), f"{path}.text")}


def _image_part(path: str, block: dict) -> dict:
    """The chat pipeline's image part (it answers for models without a projector)."""
    source = _object(block.get("source"), f"{path}.source")
    kind = _choice(source.get("type"), f"{path}.source.type", ("base64", "url"))
    if kind == "url":
        url = _string(source.get("url"), f"{path}.source.url", non_empty=True)
    else:
        media_type = _string(source.get("media_type"), f"{path}.source.media_type", non_empty=True)
        url = f"data:{media_type};base64,{_string(source.get('data'), f'{path}.source.data')}"
    return {"type": "image_url", "image_url": {"url": url}}


def _tool_message(path: str, block: dict, tool_use_ids: set[str]) -> dict:
    tool_use_id = _string(block.get("tool_use_id"), f"{path}.tool_use_id", non_empty=True)
    if tool_use_id not in tool_use_ids:
        raise field_error(f"{path}.tool_use_id", f"{_shown(tool_use_id)} answers no tool_use block of an "
                                                 f"earlier assistant message")
    content = block.get("content")
    parts = [] if content is None else [
        _part(where, result, TOOL_RESULT_BLOCKS)
        for where, result in _blocks(content, f"{path}.content", TOOL_RESULT_BLOCKS, "a tool_result")]
    if _optional_boolean(block, "is_error", path):
        parts = [{"type": "text", "text": "Error:"}] + parts  # the template has no other way to say it
    return {"role": "tool", "tool_call_id": tool_use_id, "content": parts or ""}


def _assistant_message(turn: _Turn, tool_use_ids: set[str]) -> list[dict]:
    """One assistant message; none for a turn with nothing readable (only redacted thinking,
    which is another model's ciphertext)."""
    parts, calls, thinking = [], [], []
    for path, block in turn.blocks:
        kind = block["type"]
        if kind == "text":
            parts.append(_text_part(block, path, ASSISTANT_BLOCKS))
        elif kind == "tool_use":
            calls.append(_tool_call(path, block))
            tool_use_ids.add(calls[-1]["id"])
        elif kind == "thinking":
            thinking.append(_string(block.get("thinking"), f"{path}.thinking"))
            if block.get("signature") is not None:
                _string(block["signature"], f"{path}.signature")
        else:  # redacted_thinking
            _string(block.get("data"), f"{path}.data")
    if not (parts or calls or thinking):
        return []
    message: dict[str, Any] = {"role": "assistant", "content": parts or (None if calls else "")}
    if calls:
        message["tool_calls"] = calls
    if thinking:
        message["reasoning_content"] = "\n".join(thinking)
    return [message]


def _tool_call(path: str, block: dict) -> dict:
    arguments = _object(block.get("input"), f"{path}.input")
    return {"id": _string(block.get("id"), f"{path}.id", non_empty=True), "type": "function",
            "function": {"name": _string(block.get("name"), f"{path}.name", non_empty=True),
                         "arguments": json.dumps(arguments, ensure_ascii=False)}}


# -- tools -------------------------------------------------------------------------------------------

def _tools(tools: Any, tool_choice: Any) -> dict:
    chat: dict[str, Any] = {}
    if tools is not None:
        chat["tools"] = [_tool(tool, f"tools.{index}") for index, tool in enumerate(_array(tools, "tools"))]
    if tool_choice is not None:
        chat.update(_tool_choice(_object(tool_choice, "tool_choice"), bool(chat.get("tools"))))
    return chat


def _tool(tool: Any, path: str) -> dict:
    kind = _object(tool, path).get("type")
    if kind not in (None, "custom"):
        raise field_error(f"{path}.type", f"Anthropic's server and built-in tools ({_shown(kind)}) are not "
                                          f"available here: define the tool with a name and an input_schema")
    function = {"name": _string(tool.get("name"), f"{path}.name", non_empty=True),
                "parameters": _object(tool.get("input_schema"), f"{path}.input_schema")}
    if tool.get("description") is not None:
        function["description"] = _string(tool["description"], f"{path}.description")
    return {"type": "function", "function": function}


def _tool_choice(tool_choice: dict, has_tools: bool) -> dict:
    kind = _choice(tool_choice.get("type"), "tool_choice.type", (*TOOL_CHOICES, "tool"))
    if kind in ("any", "tool") and not has_tools:
        raise field_error("tool_choice", f"type {kind!r} needs 'tools'")
    if kind == "tool":
        name = _string(tool_choice.get("name"), "tool_choice.name", non_empty=True)
        chat: dict[str, Any] = {"tool_choice": {"type": "function", "function": {"name": name}}}
    else:
        chat = {"tool_choice": TOOL_CHOICES[kind]}
    if _optional_boolean(tool_choice, "disable_parallel_tool_use", "tool_choice"):
        chat["parallel_tool_calls"] = False
    return chat
