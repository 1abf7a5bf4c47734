"""The tool-calling part of a chat request: `tools`, `tool_choice`, `parallel_tool_calls`."""

from __future__ import annotations

import json
import secrets
import string
from dataclasses import dataclass, field
from typing import Any

TOOL_CHOICES = ("auto", "none", "required")
_ALNUM = string.ascii_letters + string.digits


class ToolRequestError(ValueError):
    """A malformed tool request; `field` names the request field (the server answers 400)."""

    def __init__(self, field: str | None, message: str):
        super().__init__(message)
        self.field = field
        self.message = message


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    parameters: dict  # the JSON schema of the arguments ({"type": "object"} when none was given)

    def describe(self) -> dict:
        """The tool as the generic protocol lists it to the model."""
        described: dict[str, Any] = {"name": self.name}
        if self.description:
            described["description"] = self.description
        described["parameters"] = self.parameters
        return described


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: `arguments` is a JSON text (possibly unfinished while streaming)."""

    name: str
    arguments: str
    id: str | None = None  # the model's own id, for formats that have one
    # False while its JSON is unfinished (a streamed prefix, or a reply cut by max_tokens).
    complete: bool = field(default=True, compare=False)


def new_tool_call_id() -> str:
    """llama-server's gen_tool_call_id: 32 random letters and digits."""
    return "".join(secrets.choice(_ALNUM) for _ in range(32))


def parse_tools(tools: Any) -> list[ToolSpec]:
    """`tools` as OpenAI sends it -> ToolSpecs (empty when absent)."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise ToolRequestError("tools", f"must be an array, got {tools!r}")
    specs = []
    for index, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type", "function") != "function" \
                or not isinstance(function, dict) or not isinstance(function.get("name"), str) \
                or not function["name"]:
            raise ToolRequestError(
                "tools", f"tools[{index}] must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}")
        parameters = function.get("parameters")
        if parameters is None or parameters == {}:
            parameters = {"type": "object"}
        if not isinstance(parameters, dict):
            raise ToolRequestError("tools", f"tools[{index}].function.parameters must be an object")
        description = function.get("description") or ""
        if not isinstance(description, str):
            raise ToolRequestError("tools", f"tools[{index}].function.description must be a string")
        specs.append(ToolSpec(function["name"], description, parameters))
    names = [spec.name for spec in specs]
    duplicate = next((name for name in names if names.count(name) > 1), None)
    if duplicate is not None:
        raise ToolRequestError("tools", f"two tools are named {json.dumps(duplicate)}")
    return specs


def parse_tool_choice(value: Any, tools: list[ToolSpec]) -> tuple[str, str | None]:
    """-> (choice, forced function name). `{"type": "function", "function": {"name": X}}` is
    "required" restricted to X; an X that is not among the tools is an error."""
    if value is None:
        value = "auto"
    if isinstance(value, dict):
        function = value.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if value.get("type", "function") != "function" or not isinstance(name, str):
            raise ToolRequestError(
                "tool_choice", 'must be "auto", "none", "required" or {"type": "function", "function": {"name": ...}}')
        if not tools:
            raise ToolRequestError(None, "tool_choice names a function but the request has no 'tools'")
        if name not in [tool.name for tool in tools]:
            raise ToolRequestError("tool_choice", f"function {json.dumps(name)} is not among the tools")
        return "required", name
    if value not in TOOL_CHOICES:
        raise ToolRequestError(None, f"Invalid tool_choice: {value!r}")
    if value == "required" and not tools:
        raise ToolRequestError(None, "tool_choice \"required\" needs 'tools'")
    return value, None
