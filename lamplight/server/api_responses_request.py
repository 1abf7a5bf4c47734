"""An OpenAI Responses request (POST /v1/responses) -> the /v1/chat/completions body that
answers it, and the settings its Response object echoes.

This server is stateless: nothing is stored, so `previous_response_id`, `conversation`,
`store: true`, `background: true` and `item_reference` items are refused with a 400 naming
them; the client sends the whole conversation each time (Codex does, with `store: false`).

Every Responses field is checked here under its own name (a 400 names it, as `input[2].call_id`
or `text.format.schema`); `temperature`, `top_p` and `parallel_tool_calls` keep their names in
the chat body, so the chat pipeline checks them and its messages name them right.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

from .errors import field_error
from .fields import INT32_MAX, Fields

log = logging.getLogger(__name__)

MESSAGE_ROLES = ("user", "assistant", "system", "developer")
TOOL_CHOICE_MODES = ("auto", "none", "required")
TRUNCATION_MODES = ("auto", "disabled")  # both accepted; "auto" does not drop items (a too long prompt is a 400)
SUMMARY_MODES = ("auto", "concise", "detailed")
VERBOSITY = ("low", "medium", "high")

# reasoning.effort -> the chat pipeline's `reasoning_budget_tokens` (thinking tokens; 0 turns
# thinking off, -1 leaves it unlimited). None: the server's --reasoning-budget, as when no effort
# is sent (OpenAI's default effort is medium).
EFFORT_BUDGETS: dict[str, int | None] = {
    "none": 0, "minimal": 0, "low": 1024, "medium": None, "high": -1, "xhigh": -1,
}

# Refused because they need a stored response, conversation or prompt: (field, why).
STATEFUL_FIELDS = {
    "previous_response_id": "responses are not stored on this server (stateless): send the whole conversation "
                            "in 'input'",
    "conversation": "conversations are not stored on this server (stateless): send the whole conversation in 'input'",
    "prompt": "stored prompts are not available on this server: send the instructions and input",
}


@dataclass(frozen=True)
class ResponsesRequest:
    """A checked Responses request: the chat body that runs it and what its answer echoes."""

    chat_body: dict
    echo: dict  # the request's settings, as the Response object reports them
    stream: bool


def read_responses_request(body: dict) -> ResponsesRequest:
    """A 400 naming the first bad field, else the chat body and the echo."""
    fields = Fields(body)
    _refuse_stateful(fields)
    chat_tools, tool_echo = _tools(fields)
    text, reasoning = _text(fields), _reasoning(fields)
    chat_body = {"messages": _messages(fields), **_tool_fields(fields, chat_tools),
                 **_generation_fields(fields, text, reasoning)}
    return ResponsesRequest(chat_body, _echo(fields, tool_echo, text, reasoning), fields.boolean("stream", False))


def _tool_fields(fields: Fields, chat_tools: list[dict]) -> dict:
    chat: dict[str, Any] = {"tools": chat_tools} if chat_tools else {}
    tool_choice = _tool_choice(fields)
    if tool_choice is not None:
        chat["tool_choice"] = tool_choice
    if fields.given("parallel_tool_calls"):  # the same name in a chat body
        chat["parallel_tool_calls"] = fields.raw("parallel_tool_calls")
    return chat


def _generation_fields(fields: Fields, text: dict, reasoning: dict) -> dict:
    """The chat fields of the reply's length, sampling, format and thinking budget."""
    chat = {name: fields.raw(name) for name in ("temperature", "top_p") if fields.given(name)}  # same names
    max_tokens = fields.integer("max_output_tokens", -1, minimum=1, maximum=INT32_MAX)
    if max_tokens != -1:
        chat["max_tokens"] = max_tokens
    response_format = _response_format(text["format"])
    if response_format is not None:
        chat["response_format"] = response_format
    budget = EFFORT_BUDGETS.get(reasoning["effort"])
    if budget is not None:
        chat["reasoning_budget_tokens"] = budget
    return chat


def _refuse_stateful(fields: Fields) -> None:
    for name, why in STATEFUL_FIELDS.items():
        if fields.given(name):
            raise field_error(name, why)
    if fields.boolean("store", False):
        raise field_error("store", "this server is stateless and stores no responses: send 'store': false")
    if fields.boolean("background", False):
        raise field_error("background", "background responses need stored state; this server is stateless")


def _echo(fields: Fields, tools: list[dict], text: dict, reasoning: dict) -> dict:
    """The request's settings as the Response object echoes them (what the client's model needs)."""
    return {
        "instructions": fields.string("instructions", "") or None,
        "max_output_tokens": fields.raw("max_output_tokens"),
        "metadata": _metadata(fields),
        "model": fields.string("model", ""),
        "parallel_tool_calls": fields.raw("parallel_tool_calls", True),
        "previous_response_id": None,
        "reasoning": reasoning,
        "store": False,
        "background": False,
        "temperature": fields.raw("temperature"),
        "text": text,
        "tool_choice": fields.raw("tool_choice", "auto"),
        "tools": tools,
        "top_p": fields.raw("top_p"),
        "truncation": _one_of("truncation", fields.raw("truncation"), TRUNCATION_MODES, "disabled"),
        "user": fields.string("user", "") or None,
    }


def _one_of(name: str, value: Any, allowed: tuple[str, ...] | dict, default: str | None = None) -> str | None:
    if value is None:
        return default
    if not isinstance(value, str) or value not in allowed:
        raise field_error(name, f"must be one of {', '.join(allowed)}, got {value!r}")
    return value


def _object(name: str, value: Any) -> dict:
    """An optional object field ({} when absent)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise field_error(name, f"must be an object, got {value!r}")
    return value


def _metadata(fields: Fields) -> dict:
    metadata = fields.object("metadata") or {}
    if not all(isinstance(value, str) for value in metadata.values()):
        raise field_error("metadata", "must be an object of strings")
    return metadata


# -- input -> messages ---------------------------------------------------------------------------

def _messages(fields: Fields) -> list[dict]:
    messages = []
    instructions = fields.string("instructions", "")
    if instructions:
        messages.append({"role": "system", "content": instructions})
    value = fields.raw("input")
    if isinstance(value, str):
        return messages + [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise field_error("input", "must be a string or a non-empty array of input items")
    conversation = _Conversation()
    for index, item in enumerate(value):
        conversation.add(f"input[{index}]", item)
    return messages + conversation.finish()


class _Conversation:
    """Input items -> chat messages. An assistant turn gathers what the model wrote in one go:
    its reasoning, its text, its function calls; any other item ends the turn."""

    def __init__(self) -> None:
        self.messages: list[dict] = []
        self.call_ids: set[str] = set()
        self._turn: dict | None = None  # the assistant turn being gathered

    def add(self, where: str, item: Any) -> None:
        if not isinstance(item, dict):
            raise field_error(where, "must be an input item object")
        kind = item.get("type", "message" if "role" in item else None)
        handler = _ITEM_HANDLERS.get(kind) if isinstance(kind, str) else None
        if handler is None:
            raise field_error(f"{where}.type", _unsupported_item(kind))
        handler(self, where, item)

    def finish(self) -> list[dict]:
        self._end_turn()
        return self.messages

    def message(self, where: str, item: dict) -> None:
        role = item.get("role")
        if role not in MESSAGE_ROLES:
            raise field_error(f"{where}.role", f"must be one of {', '.join(MESSAGE_ROLES)}, got {role!r}")
        content = _content(f"{where}.content", item.get("content"))
        if role != "assistant":
            self._end_turn()
            self.messages.append({"role": role, "content": content})
            return
        turn = self._assistant_turn(ends_after=("tool_calls",))
        turn["content"] += [{"type": "text", "text": content}] if isinstance(content, str) else content

    def function_call(self, where: str, item: dict) -> None:
        call_id, name = _string(item, where, "call_id"), _string(item, where, "name")
        arguments = _string(item, where, "arguments", allow_empty=True)
        self.call_ids.add(call_id)
        turn = self._assistant_turn(ends_after=())
        turn["tool_calls"].append({"id": call_id, "type": "function",
                                   "function": {"name": name, "arguments": arguments}})

    def function_call_output(self, where: str, item: dict) -> None:
        call_id = _string(item, where, "call_id")
        if call_id not in self.call_ids:
            raise field_error(f"{where}.call_id", f"no function_call item before it has the call_id {call_id!r}")
        self._end_turn()
        self.messages.append({"role": "tool", "tool_call_id": call_id,
                              "content": _content(f"{where}.output", item.get("output"))})

    def reasoning(self, where: str, item: dict) -> None:
        text = _reasoning_text(where, item)
        turn = self._assistant_turn(ends_after=("content", "tool_calls"))
        turn["reasoning_content"] += text

    def _assistant_turn(self, ends_after: tuple[str, ...]) -> dict:
        """The assistant turn to add to: a new one when the current one already has what
        `ends_after` names (reasoning after text or calls starts the next turn)."""
        if self._turn is not None and any(self._turn[key] for key in ends_after):
            self._end_turn()
        if self._turn is None:
            self._turn = {"role": "assistant", "content": [], "reasoning_content": "", "tool_calls": []}
        return self._turn

    def _end_turn(self) -> None:
        turn, self._turn = self._turn, None
        if turn is None:
            return
        message: dict[str, Any] = {"role": "assistant", "content": turn["content"] or None}
        if turn["reasoning_content"]:
            message["reasoning_content"] = turn["reasoning_content"]
            if message["content"] is None and not turn["tool_calls"]:
                message["content"] = ""  # thinking only: the reply continues it (chat prefill)
        if turn["tool_calls"]:
            message["tool_calls"] = turn["tool_calls"]
        self.messages.append(message)


_ITEM_HANDLERS: dict[str | None, Callable[[_Conversation, str, dict], None]] = {
    "message": _Conversation.message,
    "function_call": _Conversation.function_call,
    "function_call_output": _Conversation.function_call_output,
    "reasoning": _Conversation.reasoning,
}


def _unsupported_item(kind: Any) -> str:
    if kind == "item_reference":
        return "item references need stored items; this server is stateless: send the items themselves"
    if kind is None:
        return "an input item needs a 'type' (or a 'role' for a message)"
    return f"{kind!r} items are not supported; expected one of {', '.join(k for k in _ITEM_HANDLERS if k)}"


def _string(item: dict, where: str, key: str, allow_empty: bool = False) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not (value or allow_empty):
        raise field_error(f"{where}.{key}", f"must be a {'' if allow_empty else 'non-empty '}string, got {value!r}")
    return value


def _content(where: str, content: Any) -> str | list[dict]:
    """A message's content (or a call's output): a string, or its parts as chat content parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise field_error(where, "must be a string or an array of content parts")
    return [_part(f"{where}[{index}]", part) for index, part in enumerate(content)]


def _part(where: str, part: Any) -> dict:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind in ("input_text", "output_text", "refusal"):
        key = "refusal" if kind == "refusal" else "text"
        return {"type": "text", "text": _string(part, where, key, allow_empty=True)}
    if kind == "input_image":
        return _image_part(where, part)
    if kind == "input_file":
        raise field_error(f"{where}.type", "input_file parts are not supported by this server")
    raise field_error(f"{where}.type", f"must be input_text, output_text, refusal or input_image, got {kind!r}")


def _image_part(where: str, part: dict) -> dict:
    """-> the chat pipeline's image_url part (which answers whether the model can see images)."""
    if part.get("file_id") is not None:
        raise field_error(f"{where}.file_id", "files are not stored on this server: send the image as 'image_url'")
    url = _string(part, where, "image_url")
    image: dict[str, Any] = {"url": url}
    if isinstance(part.get("detail"), str):
        image["detail"] = part["detail"]
    return {"type": "image_url", "image_url": image}


def _reasoning_text(where: str, item: dict) -> str:
    """A reasoning item's text: its reasoning_text content, else its summary's text."""
    for key, part_type in (("content", "reasoning_text"), ("summary", "summary_text")):
        parts = item.get(key)
        if parts is None:
            continue
        if not isinstance(parts, list):
            raise field_error(f"{where}.{key}", "must be an array")
        texts = [_typed_text(f"{where}.{key}[{i}]", part, part_type) for i, part in enumerate(parts)]
        if texts:
            return "".join(texts)
    return ""


def _typed_text(where: str, part: Any, part_type: str) -> str:
    if not isinstance(part, dict) or part.get("type") != part_type:
        raise field_error(where, f"must be a {{'type': '{part_type}', 'text': ...}} object")
    return _string(part, where, "text", allow_empty=True)


# -- tools -----------------------------------------------------------------------------------------

def _tools(fields: Fields) -> tuple[list[dict], list[dict]]:
    """(chat tools, their echo). Tools of other types (OpenAI's built-in web_search, file_search,
    code_interpreter, mcp, custom ...) cannot run here: each is skipped with a warning, as
    llama.cpp's forks do for Codex, so that a client sending them still gets an answer."""
    tools = fields.array("tools") or []
    chat_tools, echo = [], []
    for index, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if not isinstance(kind, str):
            raise field_error(f"tools[{index}]", "must be a tool object with a string 'type'")
        if kind != "function":
            log.warning("skipping the %s tool of a /v1/responses request: only function tools run here", kind)
            continue
        chat_tool, tool_echo = _function_tool(f"tools[{index}]", tool)
        chat_tools.append(chat_tool)
        echo.append(tool_echo)
    return chat_tools, echo


def _function_tool(where: str, tool: dict) -> tuple[dict, dict]:
    """`strict` is accepted and echoed: the chat pipeline's grammar makes every call follow its
    schema anyway."""
    function: dict[str, Any] = {"name": _string(tool, where, "name")}
    description, parameters, strict = tool.get("description"), tool.get("parameters"), tool.get("strict")
    if description is not None:
        if not isinstance(description, str):
            raise field_error(f"{where}.description", "must be a string")
        function["description"] = description
    if parameters is not None:
        if not isinstance(parameters, dict):
            raise field_error(f"{where}.parameters", "must be a JSON schema object")
        function["parameters"] = parameters
    if strict is not None and not isinstance(strict, bool):
        raise field_error(f"{where}.strict", "must be a boolean")
    return {"type": "function", "function": function}, {"type": "function", **function, "strict": strict}


def _tool_choice(fields: Fields) -> str | dict | None:
    value = fields.raw("tool_choice")
    if value is None or value in TOOL_CHOICE_MODES:
        return value
    if isinstance(value, dict) and value.get("type") == "function" and isinstance(value.get("name"), str):
        return {"type": "function", "function": {"name": value["name"]}}
    raise field_error("tool_choice", 'must be "auto", "none", "required" or {"type": "function", "name": ...} '
                                     "(only function tools run on this server)")


# -- text format, reasoning ------------------------------------------------------------------------

def _text(fields: Fields) -> dict:
    """`text` as echoed: its format ({"type": "text"} by default) and verbosity."""
    text = _object("text", fields.raw("text"))
    format_ = _object("text.format", text.get("format")) or {"type": "text"}
    return {"format": format_, "verbosity": _one_of("text.verbosity", text.get("verbosity"), VERBOSITY)}


def _response_format(format_: dict) -> dict | None:
    """text.format -> the chat body's response_format (None: plain text)."""
    kind = format_.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind != "json_schema":
        raise field_error("text.format.type", f"must be text, json_object or json_schema, got {kind!r}")
    schema = format_.get("schema")
    if not isinstance(schema, dict):
        raise field_error("text.format.schema", "must be a JSON schema object")
    name = _string(format_, "text.format", "name")
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}


def _reasoning(fields: Fields) -> dict:
    """`reasoning` as echoed: effort (see EFFORT_BUDGETS) and summary (accepted; summaries are
    not written, the reasoning item carries the thinking itself)."""
    reasoning = _object("reasoning", fields.raw("reasoning"))
    summary = reasoning.get("summary", reasoning.get("generate_summary"))  # the older name
    return {"effort": _one_of("reasoning.effort", reasoning.get("effort"), EFFORT_BUDGETS),
            "summary": _one_of("reasoning.summary", summary, SUMMARY_MODES)}
