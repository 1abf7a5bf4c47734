"""Constrained decoding requests (grammar, JSON schema, response_format, tools).

Their shapes are validated as llama-server does; until constrained decoding lands, a request
that needs it is answered with a 400 rather than silently generating unconstrained text.
"""

from __future__ import annotations

from typing import Any

from .errors import field_error, invalid_request
from .fields import Fields

RESPONSE_FORMAT_TYPES = ("text", "json_object", "json_schema")
TOOL_CHOICES = ("auto", "none", "required")


def not_supported_yet(what: str) -> Exception:
    return invalid_request(f"{what} is not supported yet")


def reject_unsupported_constraints(fields: Fields, is_chat: bool) -> None:
    grammar = fields.string("grammar", "")
    schema = _json_schema(fields)
    response_format = _response_format(fields)
    if grammar and (schema is not None or response_format in ("json_object", "json_schema")):
        raise invalid_request("Cannot use both json_schema and grammar")
    if is_chat:
        _check_tools(fields, grammar)
    if grammar:
        raise not_supported_yet("'grammar' (grammar-constrained sampling)")
    if schema is not None:
        raise not_supported_yet("'json_schema' (schema-constrained sampling)")
    if response_format != "text":
        raise not_supported_yet(f"response_format type \"{response_format}\"")


def _json_schema(fields: Fields) -> Any:
    schema = fields.raw("json_schema")
    if schema is not None and not isinstance(schema, (dict, bool)):
        raise field_error("json_schema", f"must be a JSON schema object, got {schema!r}")
    return schema


def _response_format(fields: Fields) -> str:
    """The response_format type ("text" when absent), after checking its shape."""
    value = fields.object("response_format")
    if value is None:
        return "text"
    kind = value.get("type")
    if kind not in RESPONSE_FORMAT_TYPES:
        raise invalid_request(
            f"response_format type must be one of \"text\", \"json_object\" or \"json_schema\", but got: {kind}")
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), (dict, bool)):
            raise field_error("response_format", "type \"json_schema\" needs a 'json_schema' object with a 'schema'")
    if kind == "json_object" and not isinstance(value.get("schema", {}), (dict, bool)):
        raise field_error("response_format", "'schema' must be a JSON schema object")
    return kind


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
