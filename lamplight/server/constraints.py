"""Constrained decoding requests: `grammar`, `json_schema`, `response_format`, `tools`.

Two steps. `read_constraint` (parsing) validates the shapes as llama-server does and says what is
asked for; `compile_constraint` (lamplight.server.prepare) compiles it, in the request's thread,
so an invalid grammar or schema is a 400 with the parser's message before anything runs.
Never silently unconstrained: a keyword the grammar engine cannot enforce is a 400 naming it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

from ..grammar import CompiledGrammar, GrammarCompiler, GrammarError
from ..tools import ToolPlan, ToolRequestError, plan_tool_calling
from .errors import field_error, invalid_request
from .fields import Fields

RESPONSE_FORMAT_TYPES = ("text", "json_object", "json_schema")


@dataclass(frozen=True)
class ConstraintRequest:
    """What a request's constraint fields ask for, checked but not compiled."""

    source_field: str = ""  # the field it comes from, named by compile errors; "": unconstrained
    kind: str = ""  # "grammar" (GBNF text), "json_schema", "json_object" (any object), "tools"
    source: Any = None  # the grammar text or the schema
    tool_plan: ToolPlan | None = None  # chat requests with tools (with tool_choice "none" too)


@dataclass(frozen=True)
class Constraint:
    grammar: CompiledGrammar | None = None
    echo: str = ""  # what generation_settings reports as `grammar`


def read_constraint(fields: Fields, is_chat: bool, chat_template: Any = None) -> ConstraintRequest:
    """The constraint a request asks for (or none), after every shape check. Chat requests with
    `tools` ask for their tool-call grammar (lamplight.tools), in the template's format."""
    grammar = fields.string("grammar", "")
    schema = _json_schema(fields)
    response_format, format_schema = _response_format(fields)
    sources = [name for name, given in (("grammar", bool(grammar)), ("json_schema", schema is not None),
                                        ("response_format", response_format != "text")) if given]
    if len(sources) > 1:
        raise invalid_request(f"Cannot use both {sources[0]} and {sources[1]}")
    if is_chat:
        tools = _tool_constraint(fields, chat_template, sources)
        if tools is not None:
            return tools
    if grammar:
        return ConstraintRequest("grammar", "grammar", grammar)
    if schema is not None:
        return ConstraintRequest("json_schema", "json_schema", schema)
    if response_format == "json_object" and format_schema is None:
        return ConstraintRequest("response_format", "json_object")
    if response_format != "text":
        return ConstraintRequest("response_format", "json_schema", format_schema)
    return ConstraintRequest()


def compile_constraint(request: ConstraintRequest, compiler: Callable[[], GrammarCompiler],
                       tokenizer: Any) -> Constraint:
    """The compiled grammar of `request`; a grammar that does not compile is a 400 naming its field.
    `compiler()` is only called when there is something to compile."""
    if request.kind == "tools":
        return _compile_tools(request.tool_plan, compiler, tokenizer)
    try:
        if request.kind == "grammar":
            return Constraint(compiler().compile_grammar(request.source), request.source)
        if request.kind == "json_schema":
            return Constraint(compiler().compile_json_schema(request.source))
        if request.kind == "json_object":
            return Constraint(compiler().compile_any_json_object())
    except GrammarError as error:
        raise field_error(request.source_field, str(error)) from None
    except RecursionError:
        raise field_error(request.source_field, "nested too deeply to compile") from None
    return Constraint()


def check_grammar_size(fields: Fields, limit: int) -> None:
    """`grammar` text and JSON schemas are compiled in the request's thread; bound that work."""
    grammar = fields.raw("grammar")
    if isinstance(grammar, str) and len(grammar.encode("utf-8", "surrogatepass")) > limit:
        raise field_error("grammar", f"at most {limit} bytes (--max-grammar-size)")
    for name in ("json_schema", "response_format"):
        value = fields.raw(name)
        if isinstance(value, (dict, list)) and len(json.dumps(value, ensure_ascii=False)) > limit:
            raise field_error(name, f"the schema may have at most {limit} bytes of JSON (--max-grammar-size)")


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


def chat_tool_plan(fields: Fields, chat_template: Any) -> ToolPlan | None:
    """The request's tool plan (None without tools), or a 400 for malformed tool fields."""
    try:
        return plan_tool_calling(fields.raw("tools"), fields.raw("tool_choice"), fields.raw("parallel_tool_calls"),
                                 chat_template)
    except ToolRequestError as error:
        raise (field_error(error.field, error.message) if error.field else invalid_request(error.message)) from None


def _tool_constraint(fields: Fields, chat_template: Any, sources: list[str]) -> ConstraintRequest | None:
    """The constraint of a request with tools (None when it has none). Tools do not combine with
    another constraint, whatever tool_choice says (llama-server refuses tools + grammar)."""
    plan = chat_tool_plan(fields, chat_template)
    if plan is None:
        return None
    if sources:
        if sources[0] == "grammar":
            raise invalid_request("Cannot use custom grammar constraints with tools.")
        raise invalid_request(f"Cannot use {sources[0]} with tools.")
    return ConstraintRequest("tools", "tools", tool_plan=plan)


def _compile_tools(plan: ToolPlan, compiler: Callable[[], GrammarCompiler], tokenizer: Any) -> Constraint:
    source = plan.grammar(tokenizer)
    if source is None:  # tool_choice "none": tools are only shown to the model
        return Constraint()
    try:
        if source.kind == "json_schema":
            grammar = compiler().compile_json_schema(source.source)
        else:
            grammar = compiler().compile_lark(source.source)
    except GrammarError as error:
        raise field_error("tools", str(error)) from None
    return Constraint(grammar, source.text)
