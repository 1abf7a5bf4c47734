"""What a chat template can render, found by rendering probe conversations (as llama.cpp's
template capability checks do): a system role, tool-call arguments as objects, typed content.

- supports_system_role: a system message's text shows in the output. When it does not (Gemma 2
  raises "System role not supported"), llama.cpp folds system messages into the next user turn.
- supports_object_arguments: a tool call's `arguments` object is rendered through its keys. When
  the template only concatenates them (functionary v3.2: `'...' + arguments`), it gets the JSON
  text instead.
- supports_tool_calls / supports_parallel_tool_calls: an assistant turn's call (one; two) shows
  by name in the output.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from lamplight.chat.errors import ChatTemplateError

_NEEDLE = "<<probe-needle>>"
_ARGUMENT_NEEDLE = "probe_argument_value"

Render = Callable[[list[dict], bool, list[dict] | None], str]


@dataclass(frozen=True)
class TemplateCaps:
    supports_system_role: bool = True
    supports_object_arguments: bool = True
    supports_tool_calls: bool = False
    supports_parallel_tool_calls: bool = False


def probe_caps(render: Render) -> TemplateCaps:
    return TemplateCaps(_renders_system(render), _renders_object_arguments(render),
                        _renders_calls(render, ["probe_first_call"]),
                        _renders_calls(render, ["probe_first_call", "probe_second_call"]))


def _renders(render: Render, messages: list[dict], needle: str) -> bool:
    try:
        return needle in render(messages, False, None)
    except (ChatTemplateError, RecursionError):
        return False


def _renders_system(render: Render) -> bool:
    return _renders(render, [{"role": "system", "content": _NEEDLE}, {"role": "user", "content": "Hi"}], _NEEDLE)


def _call_conversation(names: list[str], arguments: dict | str) -> list[dict]:
    # Nine-character ids: Mistral's templates refuse others.
    calls = [{"id": f"call_{i}___", "type": "function", "function": {"name": name, "arguments": arguments}}
             for i, name in enumerate(names)]
    results = [{"role": "tool", "tool_call_id": call["id"], "content": "ok"} for call in calls]
    return [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "", "tool_calls": calls},
            *results, {"role": "user", "content": "Thanks"}]


def _renders_object_arguments(render: Render) -> bool:
    return _renders(render, _call_conversation(["probe"], {"argument": _ARGUMENT_NEEDLE}), _ARGUMENT_NEEDLE)


def _renders_calls(render: Render, names: list[str]) -> bool:
    """Every call of an assistant turn shows by name (llama.cpp's supports_tool_calls with one
    call, supports_parallel_tool_calls with two)."""
    for arguments in ({"argument": "x"}, '{"argument": "x"}'):  # as an object, else as JSON text
        try:
            text = render(_call_conversation(names, arguments), False, None)
        except (ChatTemplateError, RecursionError):
            continue
        if all(name in text for name in names):
            return True
    return False
