"""The generic JSON tool-call protocol, prompt side (for templates that do not render tools).

A system instruction lists the tools and the reply format; the grammar (formats.GenericFormat)
then holds the model to it from the first token. For tool_choice "auto" with
parallel_tool_calls (the default) the instruction reads:

    You can call the following tools (one JSON object per tool):
    {"name": "get_weather", "description": "...", "parameters": {...}}

    Respond in JSON format, either with `tool_calls` (a list of one or more tool calls) or with
    `response` (a reply to the user's request):
    {"tool_calls": [{"name": "<tool name>", "arguments": {<the tool's arguments>}}]}
    {"response": "..."}
    The arguments must follow the tool's "parameters" JSON schema.

Without parallel_tool_calls the call form is `{"tool_call": {"name": ..., "arguments": ...}}`;
with "required" the `response` alternative is left out; with a named function only that tool is
listed, and the instruction says to call it. The instruction is appended to the first system
message, or becomes one.

The conversation is shown in the same protocol, so the model sees what happened:
- an assistant turn with `tool_calls` becomes the JSON it would have produced
  (`{"tool_calls": [...]}` / `{"tool_call": {...}}`), after its text content if it had any;
- other assistant turns become `{"response": "<content>"}` (a final, unfinished assistant
  message -- a prefill -- is left as it is);
- a `tool` message becomes a *user* message `{"tool_response": {"name": <the called function,
  found through tool_call_id>, "tool_call_id": ..., "content": <the result, as JSON when it
  parses as JSON>}}` (user, because templates without tool support may not know a tool role).
Templates that do not render tools get the last two conversions even when the protocol is off
(no tools, or tool_choice "none"), minus the `response` wrapping.
"""

from __future__ import annotations

import json
from typing import Any

from .base import ToolPlan

CALL_EXAMPLE = '{"name": "<tool name>", "arguments": {<the tool\'s arguments>}}'


def instruction(plan: ToolPlan) -> str:
    listing = "\n".join(json.dumps(tool.describe(), ensure_ascii=False) for tool in plan.callable_tools)
    if plan.parallel:
        call_word = "`tool_calls` (a list of one or more tool calls)"
        call_form = '{"tool_calls": [' + CALL_EXAMPLE + "]}"
    else:
        call_word = "`tool_call` (a request to call a tool)"
        call_form = '{"tool_call": ' + CALL_EXAMPLE + "}"
    lines = ["You can call the following tools (one JSON object per tool):", listing, ""]
    if plan.choice == "required":
        lines += [f"Respond in JSON format with {call_word}:", call_form]
    else:
        lines += [f"Respond in JSON format, either with {call_word} or with `response` (a reply to the user's request):",
                  call_form, '{"response": "..."}']
    if plan.forced is not None:
        lines.append(f"Call the tool `{plan.forced}`.")
    lines.append('The arguments must follow the tool\'s "parameters" JSON schema.')
    return "\n".join(lines)


def protocol_messages(messages: list[dict], plan: ToolPlan) -> list[dict]:
    """Normalized messages -> the conversation in the generic protocol, with the instruction."""
    converted = history_messages(messages, wrap_replies=True, parallel=plan.parallel)
    text = instruction(plan)
    if converted and converted[0]["role"] == "system":
        first = dict(converted[0])
        first["content"] = f"{first['content']}\n\n{text}" if first.get("content") else text
        return [first] + converted[1:]
    return [{"role": "system", "content": text}] + converted


def history_messages(messages: list[dict], wrap_replies: bool = False, parallel: bool = True) -> list[dict]:
    """Assistant tool calls and tool results as plain text turns (see the module docstring)."""
    names_by_id: dict[str, str] = {}
    last_name = ""
    out: list[dict] = []
    for index, message in enumerate(messages):
        role = message["role"]
        if role == "assistant" and message.get("tool_calls"):
            calls = []
            for call in message["tool_calls"]:
                name = call["function"]["name"]
                calls.append({"name": name, "arguments": call["function"]["arguments"]})
                if call.get("id"):
                    names_by_id[call["id"]] = name
                last_name = name
            payload = {"tool_calls": calls} if parallel or len(calls) > 1 else {"tool_call": calls[0]}
            text = json.dumps(payload, ensure_ascii=False)
            if message.get("content"):
                text = f"{message['content']}\n{text}"
            out.append({"role": "assistant", "content": text})
        elif role == "tool":
            call_id = message.get("tool_call_id")
            response: dict[str, Any] = {"name": names_by_id.get(call_id or "", last_name)}
            if call_id:
                response["tool_call_id"] = call_id
            response["content"] = _json_or_text(message.get("content") or "")
            out.append({"role": "user", "content": json.dumps({"tool_response": response}, ensure_ascii=False)})
        elif role == "assistant" and wrap_replies and index < len(messages) - 1:
            out.append({"role": "assistant",
                        "content": json.dumps({"response": message.get("content") or ""}, ensure_ascii=False)})
        else:
            out.append(message)
    return out


def has_tool_turns(messages: list[dict]) -> bool:
    return any(m["role"] == "tool" or (m["role"] == "assistant" and m.get("tool_calls")) for m in messages)


def _json_or_text(content: str) -> Any:
    try:
        return json.loads(content)
    except ValueError:
        return content
