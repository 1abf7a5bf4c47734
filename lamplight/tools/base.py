"""What every tool-calling module shares: the ToolFormat interface each format implements (its
grammar and its parser), what a parse gives (ParsedMessage) and the ToolPlan of a request (its
format, tools, tool_choice, parallel calls), which a format reads to build its grammar.

The formats (formats.py, harmony.py, xml_calls.py), the generic protocol (generic.py) and the
tool-list polyfill (polyfill.py) import this module; it imports none of them, and plan.py, which
picks a request's format, imports them all.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .grammar_text import lark_json
from .spec import ToolCall, ToolSpec


@dataclass
class ParsedMessage:
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)


@dataclass(frozen=True)
class GrammarSource:
    kind: str  # "lark" | "json_schema"
    source: Any  # Lark text, or a JSON schema (dict)

    @property
    def text(self) -> str:
        """The grammar as text the `grammar` field accepts (llguidance Lark), for echoes."""
        if self.kind == "lark":
            return self.source
        return "%llguidance {}\nstart: " + lark_json(self.source) + "\n"


class ToolFormat:
    name = "base"
    title = ""  # llama.cpp's chat_format name
    generic = False  # the prompt gets the generic protocol (generic.py)
    triggers: tuple[str, ...] = ()  # where the lazy grammar of tool_choice "auto" starts (empty: not lazy)

    def grammar(self, plan: ToolPlan, tokenizer: Any) -> GrammarSource:
        raise NotImplementedError

    def parse(self, text: str, partial: bool = False) -> ParsedMessage:
        raise NotImplementedError

    def for_tools(self, tools: list[ToolSpec]) -> ToolFormat:
        """The format for a request with these tools (formats that read values by their schema)."""
        return self

    def parse_cut(self, text: str) -> ParsedMessage:
        """A reply cut short (max_tokens): its content and the calls it completed. An unfinished
        call is dropped rather than returned as content: the wire text of a half-written call is
        no answer (llama-server would return it as content)."""
        parsed = self.parse(text, partial=True)
        calls = [call for call in parsed.tool_calls if call.complete]
        if parsed.tool_calls or not self._nothing_started(text, parsed.content):
            return ParsedMessage(parsed.content, calls)
        return self.parse(text, partial=False)

    def _nothing_started(self, text: str, content: str) -> bool:
        """The partial parse held back at most whitespace or the start of a marker: no call began."""
        if not text.startswith(content):
            return False
        rest = text[len(content):].strip()
        # Compared stripped: a marker may end in whitespace (Command R+'s "Action:\n```json\n").
        return not rest or any(marker.startswith(rest) and rest != marker
                               for marker in (trigger.strip() for trigger in self.triggers))


@dataclass
class ToolPlan:
    format: ToolFormat
    tools: list[ToolSpec]
    raw_tools: list[dict]  # as the request sent them (what templates iterate)
    choice: str  # auto | required | none
    forced: str | None  # tool_choice named this function
    parallel: bool

    def __post_init__(self) -> None:
        self.format = self.format.for_tools(self.tools)

    @property
    def active(self) -> bool:
        """Constrained and parsed (tool_choice is not "none")."""
        return self.choice != "none"

    @property
    def callable_tools(self) -> list[ToolSpec]:
        if self.forced is None:
            return self.tools
        return [tool for tool in self.tools if tool.name == self.forced]

    def grammar(self, tokenizer: Any) -> GrammarSource | None:
        return self.format.grammar(self, tokenizer) if self.active else None

    def parse(self, text: str, partial: bool = False) -> ParsedMessage:
        return self.format.parse(text, partial)

    def parse_final(self, text: str, stop_type: str) -> ParsedMessage:
        """The whole reply, by how it ended: cut by max_tokens ("limit", "none"), only its
        finished calls count (ToolFormat.parse_cut)."""
        if stop_type in ("limit", "none"):
            return self.format.parse_cut(text)
        return self.format.parse(text)

    def settings_echo(self) -> dict:
        """generation_settings keys that describe tool calling (llama-server's names)."""
        if not self.active:
            return {}
        lazy = self.choice == "auto" and bool(self.format.triggers)
        return {
            "grammar_lazy": lazy,
            "grammar_triggers": [{"type": 1, "value": trigger} for trigger in self.format.triggers] if lazy else [],
            "chat_format": self.format.title,
        }
