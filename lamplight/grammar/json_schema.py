"""llama.cpp's `json_schema` semantics mapped onto llguidance's JSON-schema compiler.

What follows llama.cpp (`common/json-schema-to-grammar.cpp`):
- objects listing `properties` accept no other property unless `additionalProperties` says so;
- `allOf` over such objects is one object with all their properties (and no others);
- an empty schema (or `true`) at the top means any JSON object;
- whitespace between tokens is llama.cpp's `space ::= | " " | "\\n" [ \\t]{0,20}`.
What is stricter: every keyword llguidance cannot enforce (`not`, `if`, `uniqueItems`,
`contains`, ...) is refused with its name, where llama.cpp silently drops some; number bounds,
`multipleOf` and formats beyond date/time/uuid are enforced.
"""

from __future__ import annotations

import json
from typing import Any

import llguidance

from .errors import GrammarError

# Between any two JSON tokens: nothing, one space, or a newline and up to 20 spaces/tabs.
LLAMA_CPP_JSON_OPTIONS = {
    "whitespace_pattern": r"[ ]|\n[ \t]{0,20}",
    "item_separator": ",",
    "key_separator": ":",
    "lenient": False,
}

_SCHEMA_KEYS = ("additionalProperties", "items", "not", "if", "then", "else", "contains",
                "propertyNames", "unevaluatedItems", "additionalItems")
_SCHEMA_LIST_KEYS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
_SCHEMA_MAP_KEYS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def json_schema_grammar(schema: Any) -> str:
    """The llguidance grammar (a JSON string) for a request's `json_schema`."""
    prepared = llama_cpp_schema(schema)
    try:
        return llguidance.LLMatcher.grammar_from_json_schema(prepared, defaults=LLAMA_CPP_JSON_OPTIONS)
    except ValueError as error:
        raise GrammarError(str(error)) from None


def llama_cpp_schema(schema: Any) -> dict[str, Any] | bool:
    if schema is True or schema == {}:
        return {"type": "object"}
    if not isinstance(schema, (dict, bool)):
        raise GrammarError(f"a JSON schema must be an object or a boolean, not {json.dumps(schema)[:60]}")
    return _close_objects(schema)


# llama.cpp's string formats (json-schema-to-grammar.cpp), as patterns: bounded, unlike RFC 3339's
# unlimited fraction digits, so a model cannot wander off into an endless time.
_DATE = r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
_TIME = r"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{3})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
LLAMA_CPP_FORMATS = {
    "date": _DATE,
    "time": _TIME,
    "date-time": _DATE + "T" + _TIME,
    "uuid": r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
}


def _format_as_pattern(schema: dict) -> dict:
    pattern = LLAMA_CPP_FORMATS.get(schema.get("format"))
    if pattern is None or "pattern" in schema:
        return schema
    result = {key: value for key, value in schema.items() if key != "format"}
    result["pattern"] = f"^{pattern}$"
    return result


def _close_objects(schema: Any) -> Any:
    if not isinstance(schema, dict):
        return schema
    schema = _format_as_pattern(schema)
    result = {key: _close_subschemas(key, value) for key, value in schema.items()}
    if "allOf" in result:
        result = _merge_all_of(result)
    if "properties" in result and not _says_what_else_is_allowed(result):
        result["additionalProperties"] = False
    return result


def _close_subschemas(key: str, value: Any) -> Any:
    if key in _SCHEMA_MAP_KEYS and isinstance(value, dict):
        return {name: _close_objects(sub) for name, sub in value.items()}
    if key in _SCHEMA_LIST_KEYS and isinstance(value, list):
        if key == "allOf":  # closed branches would exclude each other's properties
            return [_close_nested_only(sub) for sub in value]
        return [_close_objects(sub) for sub in value]
    if key in _SCHEMA_KEYS:
        return _close_objects(value)
    return value


def _close_nested_only(schema: Any) -> Any:
    closed = _close_objects(schema)
    if isinstance(schema, dict) and isinstance(closed, dict) and "additionalProperties" not in schema:
        closed.pop("additionalProperties", None)
    return closed


def _says_what_else_is_allowed(schema: dict[str, Any]) -> bool:
    return any(key in schema for key in ("additionalProperties", "patternProperties", "unevaluatedProperties"))


def _merge_all_of(schema: dict[str, Any]) -> dict[str, Any]:
    """allOf of plain object schemas -> one object schema, as llama.cpp builds it."""
    branches = schema["allOf"]
    if not all(_is_plain_object(branch) for branch in branches):
        return schema
    merged = {key: value for key, value in schema.items() if key != "allOf"}
    properties = dict(merged.get("properties", {}))
    required = list(merged.get("required", []))
    for branch in branches:
        for name, sub in branch.get("properties", {}).items():
            properties[name] = {"allOf": [properties[name], sub]} if name in properties else sub
        required += [name for name in branch.get("required", []) if name not in required]
    merged.update(type="object", properties=properties, required=required)
    return merged


def _is_plain_object(schema: Any) -> bool:
    allowed = {"type", "properties", "required", "title", "description"}
    return (
        isinstance(schema, dict)
        and "properties" in schema
        and schema.get("type", "object") == "object"
        and set(schema) <= allowed
    )
