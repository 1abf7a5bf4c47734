"""What a chat template can render, found by rendering probe conversations (as llama.cpp's
template capability checks do): a system role, tool-call arguments as objects, typed content.

- supports_system_role: a system message's text shows in the output. When it does not (Gemma 2
  raises "System role not supported"), llama.cpp folds system messages into the next user turn.
- supports_object_arguments: a tool call's `arguments` object is rendered through its keys. When
  the template only concatenates them (functionary v3.2: `'...' + arguments`), it gets the JSON
  text instead.
- supports_tool_calls / supports_parallel_tool_calls: an assistant turn's call (one; two) shows
  by name in the output.

Templates that check the conversation's shape refuse some probes (Mistral's insist on user /
assistant alternation outside tool turns and on 9-character call ids; DeepSeek R1 distills only
render the calls of an assistant turn without content; functionary v3.2 concatenates arguments
as text), so the call probes try the conversations llama.cpp probes with, first the one of its
template capability check (common/jinja/caps.cpp: user, assistant with text and calls, one tool
result, assistant, user; ids `call00001`...), then minja's (an assistant turn with null content
and nothing after it), then a user turn after the results; calls with arguments as an object,
then as text. A capability holds when one of them renders and shows what it looks for.
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


# Arguments as text that normalize_messages leaves as text (JSON text of an object would be
# parsed back into the object): what a template gets when it cannot take objects.
_TEXT_ARGUMENTS = "probe arguments as text"


def _calls(names: list[str], arguments: dict | str) -> list[dict]:
    # Nine alphanumeric characters: Mistral's templates refuse other ids.
    return [{"id": f"call{i + 1:05d}", "type": "function", "function": {"name": name, "arguments": arguments}}
            for i, name in enumerate(names)]


def _llama_cpp_conversation(names: list[str], arguments: dict | str) -> list[dict]:
    """llama.cpp's tool probe: tool turns outside a strict user/assistant alternation."""
    calls = _calls(names, arguments)
    return [{"role": "user", "content": "User message"},
            {"role": "assistant", "content": "Assistant message", "tool_calls": calls},
            {"role": "tool", "content": "Tool response", "tool_call_id": calls[0]["id"]},
            {"role": "assistant", "content": "The tool response was 'tool response'"},
            {"role": "user", "content": "User message"}]


def _minja_conversation(names: list[str], arguments: dict | str) -> list[dict]:
    """minja's: the calls of an assistant turn with null content, last."""
    return [{"role": "user", "content": "Hey"}, {"role": "assistant", "content": None, "tool_calls": _calls(names, arguments)}]


def _results_conversation(names: list[str], arguments: dict | str) -> list[dict]:
    """Each call's result, then a user turn."""
    calls = _calls(names, arguments)
    results = [{"role": "tool", "tool_call_id": call["id"], "content": "ok"} for call in calls]
    return [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "", "tool_calls": calls},
            *results, {"role": "user", "content": "Thanks"}]


_CONVERSATIONS = (_llama_cpp_conversation, _minja_conversation, _results_conversation)


def _renders_object_arguments(render: Render) -> bool:
    return _shows(render, ["probe"], {"argument": _ARGUMENT_NEEDLE}, [_ARGUMENT_NEEDLE])


def _shows(render: Render, names: list[str], arguments: dict | str, needles: list[str]) -> bool:
    """Some probe conversation with these calls renders, showing every needle."""
    for conversation in _CONVERSATIONS:
        try:
            text = render(conversation(names, arguments), False, None)
        except (ChatTemplateError, RecursionError):
            continue
        if all(needle in text for needle in needles):
            return True
    return False


def _renders_calls(render: Render, names: list[str]) -> bool:
    """Every call of an assistant turn shows by name (llama.cpp's supports_tool_calls with one
    call, supports_parallel_tool_calls with two)."""
    # Arguments as an object, else as text.
    return any(_shows(render, names, arguments, names) for arguments in ({"argument": "x"}, _TEXT_ARGUMENTS))
