"""Grammars and JSON schemas that constrained generation must handle, kept as data.

The unit tests (test_grammar.py) drive matchers over them with random walks; the end-to-end
tests (test_structured_output.py) send them to the server (`grammar` / `json_schema` /
`response_format`) and check the outputs; grammar_bench.py times masks on two of them.
Every string length, repetition count and array size is bounded so that a valid output fits
in about 200 tokens. `check` is a regular expression a valid output matches in full
(a spot check on top of the grammar itself), or None where a regex cannot say it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class GbnfCase:
    name: str
    grammar: str
    check: str | None = None
    examples: tuple[str, ...] = ()  # strings llama.cpp's grammar engine accepts in full


@dataclass(frozen=True)
class SchemaCase:
    name: str
    schema: dict[str, Any] | bool
    examples: list[Any] = field(default_factory=list)  # valid documents (tests feed them as tokens)


GBNF_CASES: list[GbnfCase] = [
    GbnfCase(
        "arithmetic",
        r"""
# integer arithmetic with bounded length
root   ::= expr
expr   ::= term (("+" | "-") term){0,3}
term   ::= factor (("*" | "/") factor){0,2}
factor ::= number | "(" expr ")"
number ::= [0-9]{1,4}
""",
        r"[0-9+\-*/()]+",
        ("12+3*(4-1)", "7"),
    ),
    GbnfCase(
        "json",
        r"""
root   ::= object
# Two levels of nesting at most, so that a valid document always fits the token budget.
value  ::= inner-object | inner-array | scalar
scalar ::= string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value){0,3}
  )? "}" ws

inner-object ::=
  "{" ws (
            string ":" ws scalar
    ("," ws string ":" ws scalar){0,3}
  )? "}" ws

inner-array  ::=
  "[" ws (
            scalar
    ("," ws scalar){0,3}
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})
  ){0,16} "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,5})) ("." [0-9]{1,4})? ([eE] [-+]? [0-9]{1,2})? ws

# optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= | " " | "\n" [ \t]{0,20}
""",
        None,
        ('{"a": [1, 2.5, "x"], "b": {"c": null}}', "{}"),
    ),
    GbnfCase(
        "bullet-list",
        r"""
root ::= item{1,5}
item ::= "- " [a-z] [a-z ]{0,19} "\n"
""",
        r"(- [a-z][a-z ]{0,19}\n){1,5}",
        ("- milk\n- eggs and ham\n",),
    ),
    GbnfCase(
        "identifiers",
        r"""
root  ::= ident ("," " "? ident){0,4}
ident ::= [a-zA-Z_] [a-zA-Z0-9_]{0,15}
""",
        r"[a-zA-Z_][a-zA-Z0-9_]{0,15}(, ?[a-zA-Z_][a-zA-Z0-9_]{0,15}){0,4}",
        ("foo, _bar,baz9",),
    ),
    GbnfCase(
        "unicode-classes",
        r"""
root  ::= greek " " cjk emoji?
greek ::= [\u0391-\u03A9\u03B1-\u03C9]{1,8}
cjk   ::= [\u4E00-\u9FFF]{1,4}
emoji ::= " " [\U0001F600-\U0001F64F]
""",
        "[\u0391-\u03a9\u03b1-\u03c9]{1,8} [\u4e00-\u9fff]{1,4}( [\U0001f600-\U0001f64f])?",
        ("\u03b1\u03b2\u03b3 \u4e2d\u6587", "\u03a9 \u4e00 \U0001f600"),
    ),
    GbnfCase(
        "bounded-repetition",
        r"""
root   ::= digits "-" code suffix
digits ::= [0-9]{3}
code   ::= [0-9]{3,4}
suffix ::= ("-" [A-Z]{0,3})?
""",
        r"[0-9]{3}-[0-9]{3,4}(-[A-Z]{0,3})?",
        ("123-4567-AB", "123-456", "123-456-"),
    ),
    GbnfCase(
        "alternation",
        r"""
root ::= answer punct
answer ::= "yes" | "no" | "maybe" | "it depends"
punct ::= "!" | "." | ""
""",
        r"(yes|no|maybe|it depends)[!.]?",
        ("maybe!", "it depends", "no."),
    ),
    GbnfCase(
        "s-expression",
        r"""
root ::= sexp
sexp ::= atom | "(" sexp (" " sexp){0,3} ")"
atom ::= [a-z]{1,6} | [0-9]{1,3}
""",
        r"[()a-z0-9 ]+",
        ("(add 1 (mul 2 3))", "x"),
    ),
    GbnfCase(
        "escapes-and-comments",
        r"""
# string literals with escapes; comments at the end of lines too
root ::= "say \"hi\"" "\t" tail   # a quoted word, then a tab
tail ::= "\x41\u00e9\\" [\[\]-]{1,3} "\n"
""",
        re.escape('say "hi"\tA\u00e9\\') + r"[\[\]-]{1,3}\n",
        ('say "hi"\tA\u00e9\\[]\n',),
    ),
    GbnfCase(
        "negated-class",
        r"""
root ::= "\"" [^"\n\\]{1,30} "\""
""",
        r'"[^"\n\\]{1,30}"',
        ('"hello world"',),
    ),
    GbnfCase(
        "date",
        r"""
root  ::= year "-" month "-" day
year  ::= "19" [0-9] [0-9] | "20" [0-2] [0-9]
month ::= "0" [1-9] | "1" [0-2]
day   ::= "0" [1-9] | [12] [0-9] | "3" [01]
""",
        r"(19[0-9]{2}|20[0-2][0-9])-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])",
        ("2024-02-29", "1999-12-31"),
    ),
    GbnfCase(
        "chess",
        r"""
root   ::= (
    # "1. " then a pair of moves, then up to three more numbered pairs
    "1. " move " " move "\n"
    ([1-9] [0-9]? ". " move " " move "\n"){0,3}
)
move    ::= (pawn | nonpawn | castle) [+#]?
pawn    ::= ([a-h] "x")? [a-h] [1-8] ("=" [NBKQR])?
nonpawn ::= [NBKQR] [a-h]? [1-8]? "x"? [a-h] [1-8]
castle  ::= "O-O" "-O"?
""",
        None,
        ("1. e4 e5\n2. Nf3 Nc6\n3. O-O-O Qxd8#\n",),
    ),
    GbnfCase(
        "any-char",
        r"""
root ::= "Answer: " .{1,20} "\n"
""",
        r"(?s)Answer: .{1,20}\n",
        ("Answer: 42\n", "Answer: \u00e9\n\n"),
    ),
    GbnfCase(
        "dashed-names-multiline",
        r"""
root ::= key-value-1 ( "; " key-value-1 ){0,2}
key-value-1 ::=
    key "=" (
      number
    | quoted
    | "true"
    | "false"
    )
key ::= [a-z]{1,8}
number ::= "-"? [0-9]{1,5}
quoted ::= "'" [a-zA-Z0-9 ]{0,10} "'"
""",
        r"[a-z]{1,8}=(-?[0-9]{1,5}|'[a-zA-Z0-9 ]{0,10}'|true|false)(; [a-z]{1,8}=(-?[0-9]{1,5}|'[a-zA-Z0-9 ]{0,10}'|true|false)){0,2}",
        ("a=1; bb='x y'; c=true",),
    ),
    GbnfCase(
        # what llama.cpp's json_schema_to_grammar.py emits for a two-property schema
        "llama-cpp-schema-output",
        r"""
age-kv ::= "\"age\"" space ":" space integer
char ::= [^"\\\x7F\x00-\x1F] | [\\] (["\\bfnrt] | "u" [0-9a-fA-F]{4})
integer ::= ("-"? integral-part) space
integral-part ::= [0] | [1-9] [0-9]{0,15}
name-kv ::= "\"name\"" space ":" space string
root ::= "{" space name-kv "," space age-kv "}" space
space ::= | " " | "\n" [ \t]{0,20}
string ::= "\"" char{0,20} "\"" space
""",
        None,
        ('{"name": "Ada", "age": 36}', '{\n  "name": "a\\"b\\u00e9",\n  "age": -7\n}'),
    ),
    GbnfCase(
        # llama.cpp's engine is a pure CFG: a repetition gives characters back to what follows
        "adjacent-repetition",
        r"""
root ::= word "s" " " [0-9]{1,6} "0"
word ::= [a-z]{1,8}
""",
        r"[a-z]{1,8}s [0-9]{1,6}0",
        ("cats 100", "ss 00"),
    ),
    GbnfCase(
        "empty-alternative",
        r"""
root ::= "x" ws "y" ws "z"
ws   ::= | " " | "  "
""",
        r"x {0,2}y {0,2}z",
        ("x y  z", "xyz"),
    ),
]


SCHEMA_CASES: list[SchemaCase] = [
    SchemaCase(
        "flat-object",
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 20},
                "age": {"type": "integer", "minimum": 0, "maximum": 150},
            },
            "required": ["name", "age"],
        },
        [{"name": "Ada", "age": 36}],
    ),
    SchemaCase(
        "nested-object",
        {
            "type": "object",
            "properties": {
                "user": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "integer", "minimum": 1, "maximum": 99999},
                        "address": {
                            "type": "object",
                            "properties": {
                                "city": {"type": "string", "maxLength": 16},
                                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                            },
                            "required": ["city", "zip"],
                        },
                    },
                    "required": ["id", "address"],
                }
            },
            "required": ["user"],
        },
        [{"user": {"id": 7, "address": {"city": "Paris", "zip": "75001"}}}],
    ),
    SchemaCase(
        "optional-properties",
        {
            "type": "object",
            "properties": {
                "title": {"type": "string", "maxLength": 24},
                "subtitle": {"type": "string", "maxLength": 24},
                "draft": {"type": "boolean"},
            },
            "required": ["title"],
        },
        [{"title": "t"}, {"title": "t", "draft": True}],
    ),
    SchemaCase(
        "enum",
        {
            "type": "object",
            "properties": {
                "color": {"enum": ["red", "green", "blue"]},
                "size": {"type": "string", "enum": ["S", "M", "L", "XL"]},
            },
            "required": ["color", "size"],
        },
        [{"color": "red", "size": "XL"}],
    ),
    SchemaCase(
        "const",
        {
            "type": "object",
            "properties": {"version": {"const": 2}, "kind": {"const": "event"}},
            "required": ["version", "kind"],
        },
        [{"version": 2, "kind": "event"}],
    ),
    SchemaCase(
        "array-bounds",
        {
            "type": "array",
            "items": {"type": "integer", "minimum": -50, "maximum": 50},
            "minItems": 2,
            "maxItems": 5,
        },
        [[1, 2], [-50, 0, 50, 3, 4]],
    ),
    SchemaCase(
        "array-of-objects",
        {
            "type": "object",
            "properties": {
                "items": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"},
                            "qty": {"type": "integer", "minimum": 1, "maximum": 9},
                        },
                        "required": ["sku", "qty"],
                    },
                    "minItems": 1,
                    "maxItems": 3,
                }
            },
            "required": ["items"],
        },
        [{"items": [{"sku": "ABC-123", "qty": 2}]}],
    ),
    SchemaCase(
        "any-of",
        {
            "type": "object",
            "properties": {
                "value": {
                    "anyOf": [
                        {"type": "integer", "minimum": 0, "maximum": 1000},
                        {"type": "string", "maxLength": 10},
                        {"type": "null"},
                    ]
                }
            },
            "required": ["value"],
        },
        [{"value": 3}, {"value": "x"}, {"value": None}],
    ),
    SchemaCase(
        "one-of-objects",
        {
            "oneOf": [
                {
                    "type": "object",
                    "properties": {"circle": {"type": "number", "minimum": 0, "maximum": 100}},
                    "required": ["circle"],
                },
                {
                    "type": "object",
                    "properties": {
                        "rect": {
                            "type": "array",
                            "items": {"type": "integer", "minimum": 0, "maximum": 100},
                            "minItems": 2,
                            "maxItems": 2,
                        }
                    },
                    "required": ["rect"],
                },
            ]
        },
        [{"circle": 1.5}, {"rect": [1, 2]}],
    ),
    SchemaCase(
        "ref-defs",
        {
            "$defs": {
                "point": {
                    "type": "object",
                    "properties": {
                        "x": {"type": "integer", "minimum": -9, "maximum": 9},
                        "y": {"type": "integer", "minimum": -9, "maximum": 9},
                    },
                    "required": ["x", "y"],
                }
            },
            "type": "object",
            "properties": {
                "start": {"$ref": "#/$defs/point"},
                "end": {"$ref": "#/$defs/point"},
            },
            "required": ["start", "end"],
        },
        [{"start": {"x": 0, "y": 1}, "end": {"x": -2, "y": 3}}],
    ),
    SchemaCase(
        # Two levels through $ref; a recursive $ref has no depth bound, so a model may nest past
        # any token budget (the unit tests walk a recursive schema with a step cap instead).
        "nested-ref",
        {
            "$defs": {
                "leaf": {
                    "type": "object",
                    "properties": {"label": {"type": "string", "maxLength": 6}},
                    "required": ["label"],
                },
                "node": {
                    "type": "object",
                    "properties": {
                        "label": {"type": "string", "maxLength": 6},
                        "children": {"type": "array", "items": {"$ref": "#/$defs/leaf"}, "maxItems": 2},
                    },
                    "required": ["label"],
                },
            },
            "$ref": "#/$defs/node",
        },
        [{"label": "a", "children": [{"label": "b"}]}],
    ),
    SchemaCase(
        "string-pattern",
        {
            "type": "object",
            "properties": {
                "phone": {"type": "string", "pattern": "^\\+?[0-9]{2,3}-[0-9]{3}-[0-9]{4}$"},
                "code": {"type": "string", "pattern": "^[A-F0-9]{4,8}$"},
            },
            "required": ["phone", "code"],
        },
        [{"phone": "+33-123-4567", "code": "BEEF"}],
    ),
    SchemaCase(
        "formats",
        {
            "type": "object",
            "properties": {
                "id": {"type": "string", "format": "uuid"},
                "day": {"type": "string", "format": "date"},
                "at": {"type": "string", "format": "date-time"},
                "time": {"type": "string", "format": "time"},
            },
            "required": ["id", "day", "at", "time"],
        },
        [
            {
                "id": "123e4567-e89b-12d3-a456-426614174000",
                "day": "2024-02-29",
                "at": "2024-02-29T12:30:00Z",
                "time": "08:15:00Z",
            }
        ],
    ),
    SchemaCase(
        "integer-bounds",
        {
            "type": "object",
            "properties": {
                "percent": {"type": "integer", "minimum": 0, "maximum": 100},
                "delta": {"type": "integer", "exclusiveMinimum": -10, "exclusiveMaximum": 10},
                "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
            },
            "required": ["percent", "delta", "year"],
        },
        [{"percent": 100, "delta": -9, "year": 2024}],
    ),
    SchemaCase(
        "string-lengths",
        {
            "type": "object",
            "properties": {
                "short": {"type": "string", "minLength": 2, "maxLength": 5},
                "tags": {
                    "type": "array",
                    "items": {"type": "string", "minLength": 1, "maxLength": 8},
                    "maxItems": 4,
                },
            },
            "required": ["short", "tags"],
        },
        [{"short": "ab", "tags": []}],
    ),
    SchemaCase(
        "all-of",
        {
            "allOf": [
                {
                    "type": "object",
                    "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}},
                    "required": ["a"],
                },
                {
                    "type": "object",
                    "properties": {"b": {"type": "boolean"}},
                    "required": ["b"],
                },
            ]
        },
        [{"a": 1, "b": False}],
    ),
    SchemaCase(
        "additional-properties-schema",
        {
            "type": "object",
            "properties": {"kind": {"const": "scores"}},
            "required": ["kind"],
            "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 10},
            "maxProperties": 4,
        },
        [{"kind": "scores", "alice": 3}],
    ),
    SchemaCase(
        "number-and-nullable",
        {
            "type": "object",
            "properties": {
                "price": {"type": "number", "minimum": 0, "maximum": 1000},
                "note": {"type": ["string", "null"], "maxLength": 12},
            },
            "required": ["price", "note"],
        },
        [{"price": 9.99, "note": None}],
    ),
]


INVALID_GBNF: list[str] = [
    'root ::= "unterminated',
    "root ::= missing-rule",
    "root ::= [a-z",
    'root ::= ("a" | "b"',
    'rule ::= "a"',  # no root
]

INVALID_SCHEMAS: list[dict[str, Any]] = [
    {"type": "strnig"},
    {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}},
    {"type": "string", "pattern": "^[a-z$"},
]

# Keywords that constrain outputs but that the grammar cannot enforce: each must be refused.
UNENFORCEABLE_SCHEMAS: list[tuple[str, dict[str, Any]]] = [
    ("uniqueItems", {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}),
    ("not", {"not": {"type": "string"}}),
    ("if", {"if": {"type": "integer"}, "then": {"minimum": 0}}),
    ("contains", {"type": "array", "contains": {"const": 1}}),
]
