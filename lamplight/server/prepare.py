"""The step between parsing a request and running it: compile its constraint (grammar,
json_schema, response_format, tools) and build DRY's breaker table.

Both are heavy (a grammar compile; a walk over the vocabulary per breaker), so they run here, in
the request's thread (completion_flow calls this off the event loop), and never on the engine
thread, where they would hold up every stream. A grammar that does not compile is a 400 here.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from lamplight.sampling.dry import BreakerTable
from lamplight.sampling.params import SamplingParams
from lamplight.sampling.sequence import uses_dry

from .constraints import compile_constraint
from .errors import invalid_request
from .params import GenerationParams


def prepare_request(params: GenerationParams, tokenizer: Any,
                    grammar_compiler: Callable[[], Any] | None = None) -> GenerationParams:
    """`params` with its compiled grammar and DRY's breaker table. `grammar_compiler`: a callable
    returning the model's GrammarCompiler (made on first use); None: constraints are refused."""
    constraint = compile_constraint(params.constraint, grammar_compiler or _no_grammars, tokenizer)
    request = dataclasses.replace(params.request, grammar=constraint.grammar,
                                  dry_breakers=dry_breakers(params.request.sampling, tokenizer))
    return dataclasses.replace(params, request=request, grammar_text=constraint.echo)


def dry_breakers(sampling: SamplingParams, tokenizer: Any) -> BreakerTable | None:
    """DRY's breaker table when DRY runs for these parameters."""
    if not uses_dry(sampling):
        return None
    return BreakerTable.for_tokenizer(tokenizer, sampling.dry_sequence_breakers)


def _no_grammars():
    raise invalid_request("constrained decoding is not available on this server")
