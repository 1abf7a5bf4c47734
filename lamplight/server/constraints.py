"""Constrained decoding requests: `grammar`, `json_schema`, `response_format`, tools.

The shapes are validated as llama-server does, and the grammar is compiled here, in the request's
thread, so an invalid grammar or schema is a 400 with the parser's message before anything runs.
Never silently unconstrained: a keyword the grammar engine cannot enforce is a 400 naming it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..grammar import CompiledGrammar, GrammarCompiler, GrammarError
from .errors import field_error, invalid_request
from .fields import Fields

RESPONSE_FORMAT_TYPES = ("text", "json_object", "json_schema")
TOOL_CHOICES = ("auto", "none", "required")


def not_supported_yet(what: str) -> Exception:
    return invalid_request(f"{what} is not supported yet")


@dataclass
class Constraint:
    grammar: CompiledGrammar | None = None
    echo: str = ""  # what generation_settings reports as `grammar`


def resolve_constraint(fields: Fields, is_chat: bool, compiler: Callable[[], GrammarCompiler]) -> Constraint:
    """The compiled grammar a request asks for (or none), after every shape check."""
    grammar = fields.string("grammar", "")
    schema = _json_schema(fields)
    response_format, format_schema = _response_format(fields)
    sources = [name for name, given in (("grammar", bool(grammar)), ("json_schema", schema is not None),
                                        ("response_format", response_format != "text")) if given]
    if len(sources) > 1:
        raise invalid_request(f"Cannot use both {sources[0]} and {sources[1]}")
    if is_chat:
        _check_tools(fields, grammar)
    try:
        if grammar:
            return Constraint(compiler().compile_grammar(grammar), grammar)
        if schema is not None:
            return Constraint(compiler().compile_json_schema(schema))
        if response_format == "json_object" and format_schema is None:
            return Constraint(compiler().compile_any_json_object())
        if response_format != "text":
            return Constraint(compiler().compile_json_schema(format_schema))
    except GrammarError as error:
        raise field_error(sources[0], str(error)) from None
    return Constraint()


def _json_schema(fields: Fields) -> Any:
    schema = fields.raw("json_schema")
    if schema is not None and not isinstance(schema, (dict, bool)):
        raise field_error("json_schema", f"must be a JSON schema object, got {schema!r}")
    return schema


def _response_format(fields: Fields) -> tuple[str, Any]:
    """The response_format type ("text" when absent) and its schema, after checking its shape."""
    value = fields.object("response_format")
    if value is None:
        return "text", None
    kind = value.get("type")
    if kind not in RESPONSE_FORMAT_TYPES:
        raise invalid_request(
            f"response_format type must be one of \"text\", \"json_object\" or \"json_schema\", but got: {kind}")
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), (dict, bool)):
            raise field_error("response_format", "type \"json_schema\" needs a 'json_schema' object with a 'schema'")
        return kind, spec.get("schema", {})
    if kind == "json_object" and not isinstance(value.get("schema", {}), (dict, bool)):
        raise field_error("response_format", "'schema' must be a JSON schema object")
    return kind, value.get("schema")


def tool_choice(fields: Fields) -> str:
    value = fields.raw("tool_choice", "auto")
    if isinstance(value, dict):
        raise not_supported_yet("tool_choice as an object")
    if value not in TOOL_CHOICES:
        raise invalid_request(f"Invalid tool_choice: {value!r}")
    return value


def chat_tools(fields: Fields) -> list[dict] | None:
    """The validated `tools` list, or None when the request has none."""
    tools = fields.array("tools")
    if not tools:
        return None
    for index, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type", "function") != "function" \
                or not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise field_error("tools", f"tools[{index}] must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}")
        if not isinstance(function.get("parameters", {}), dict):
            raise field_error("tools", f"tools[{index}].function.parameters must be an object")
    return tools


def _check_tools(fields: Fields, grammar: str) -> None:
    tools = chat_tools(fields)
    choice = tool_choice(fields)
    fields.boolean("parallel_tool_calls", False)
    if tools and grammar:
        raise invalid_request("Cannot use custom grammar constraints with tools.")
    if tools and choice != "none":
        raise not_supported_yet("tool calling ('tools' with tool_choice other than \"none\")")
    if choice == "required" and not tools:
        raise invalid_request("tool_choice \"required\" needs 'tools'")
