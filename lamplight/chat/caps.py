"""What a chat template can render, found by rendering probe conversations (as llama.cpp's
template capability checks do): a system role, tool-call arguments as objects, typed content.

- supports_system_role: a system message's text shows in the output. When it does not (Gemma 2
  raises "System role not supported"), llama.cpp folds system messages into the next user turn.
- supports_object_arguments: a tool call's `arguments` object is rendered through its keys. When
  the template only concatenates them (functionary v3.2: `'...' + arguments`), it gets the JSON
  text instead.
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


def probe_caps(render: Render) -> TemplateCaps:
    return TemplateCaps(_renders_system(render), _renders_object_arguments(render))


def _renders(render: Render, messages: list[dict], needle: str) -> bool:
    try:
        return needle in render(messages, False, None)
    except (ChatTemplateError, RecursionError):
        return False


def _renders_system(render: Render) -> bool:
    return _renders(render, [{"role": "system", "content": _NEEDLE}, {"role": "user", "content": "Hi"}], _NEEDLE)


def _renders_object_arguments(render: Render) -> bool:
    call = {"id": "call_1", "type": "function",
            "function": {"name": "probe", "arguments": {"argument": _ARGUMENT_NEEDLE}}}
    conversation = [{"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": "", "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": "call_1", "content": "ok"},
                    {"role": "user", "content": "Thanks"}]
    return _renders(render, conversation, _ARGUMENT_NEEDLE)
