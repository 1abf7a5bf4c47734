"""Tool calls in OpenAI's streaming shape, and the final message of a chat answer.

As llama-server does (`update_chat_msg` + `compute_diffs`): the text generated so far is parsed
again after every token (partial mode) and the difference to what was already sent goes out as
deltas. A call's first delta carries its index, id, type and name with `arguments: ""`; then
argument fragments follow, each extending the previous ones. Ids are the model's own where the
format has them (Mistral), else 32 random letters and digits, fixed when the call first appears.
Only growth is ever sent: should a later parse disagree with what went out (a stream cut by
max_tokens in the middle of a call is finally parsed as content), the difference is not sent
again, and finish_reason "length" says the answer is incomplete.
"""

from __future__ import annotations

from dataclasses import dataclass

from .base import ParsedMessage, ToolPlan
from .spec import new_tool_call_id


@dataclass
class _SentCall:
    id: str
    name: str
    arguments: str = ""


def message_json(parsed: ParsedMessage, ids: list[str] | None = None) -> dict:
    """The assistant `message` of a non-stream answer: content null when there are only calls."""
    message: dict = {"role": "assistant", "content": parsed.content}
    if parsed.tool_calls:
        if not parsed.content:
            message["content"] = None
        message["tool_calls"] = [
            {"type": "function", "function": {"name": call.name, "arguments": call.arguments},
             "id": (ids[i] if ids and i < len(ids) else None) or call.id or new_tool_call_id()}
            for i, call in enumerate(parsed.tool_calls)
        ]
    return message


def finish_reason(parsed: ParsedMessage, stop_type: str, default: str) -> str:
    """"tool_calls" when calls were parsed and generation ended by itself (EOS, grammar done, stop word)."""
    if parsed.tool_calls and stop_type in ("eos", "word"):
        return "tool_calls"
    return default


class ToolCallStream:
    """The deltas of one choice."""

    def __init__(self, plan: ToolPlan):
        self.plan = plan
        self.content = ""
        self.calls: list[_SentCall] = []

    def update(self, text: str, partial: bool = True) -> tuple[list[dict], ParsedMessage]:
        """Parse the text so far -> (deltas to send, in order; the parse)."""
        return self._deltas(self.plan.parse(text, partial))

    def finish(self, text: str, stop_type: str) -> tuple[list[dict], ParsedMessage]:
        """The last deltas, from the whole reply (ToolPlan.parse_final)."""
        return self._deltas(self.plan.parse_final(text, stop_type))

    def _deltas(self, parsed: ParsedMessage) -> tuple[list[dict], ParsedMessage]:
        deltas: list[dict] = []
        if len(parsed.content) > len(self.content) and parsed.content.startswith(self.content):
            deltas.append({"content": parsed.content[len(self.content):]})
            self.content = parsed.content
        for index, call in enumerate(parsed.tool_calls):
            if index == len(self.calls):
                sent = _SentCall(call.id or new_tool_call_id(), call.name)
                self.calls.append(sent)
                deltas.append({"tool_calls": [{"index": index, "id": sent.id, "type": "function",
                                               "function": {"name": call.name, "arguments": ""}}]})
            elif index > len(self.calls):
                break
            sent = self.calls[index]
            if sent.name != call.name:
                break
            if len(call.arguments) > len(sent.arguments) and call.arguments.startswith(sent.arguments):
                deltas.append({"tool_calls": [{"index": index,
                                               "function": {"arguments": call.arguments[len(sent.arguments):]}}]})
                sent.arguments = call.arguments
        return deltas, parsed

    @property
    def ids(self) -> list[str]:
        return [call.id for call in self.calls]
