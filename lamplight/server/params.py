"""A request body -> its GenerationParams: every field validated, with the server's defaults.

Field names and defaults are llama.cpp's (server semantics doc, section 2). Per-request values
start from the server's CLI defaults (`--temp`, `--top-k`, ..., `-n`). The sampling fields are read
as their entries in lamplight.sampling.spec say. Parsing only checks and converts: compiling the
grammar and building DRY's breaker table are the next step's work (lamplight.server.prepare).
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any, Callable

from lamplight.chat.reasoning import REASONING_FORMATS
from lamplight.engine.types import GenerationRequest
from lamplight.sampling.logit_bias import resolve_logit_bias
from lamplight.sampling.params import SamplingParams, effective_seed, parse_samplers
from lamplight.sampling.spec import FieldSpec, sampling_fields, server_defaults
from lamplight.speculative import SpecRequest, parse_kinds

from .constraints import ConstraintRequest, check_grammar_size, read_constraint
from .errors import ApiError, field_error, invalid_request
from .fields import INT32_MAX, Fields, value_error_as_field_error
from .settings import RequestLimits, ServerSettings

DEFAULT_TOP_LOGPROBS = 20  # llama-server's default when a chat request sets `logprobs: true`
NO_MULTIMODAL = "this model has no multimodal projector"


class Endpoint(enum.Enum):
    NATIVE = "native"  # /completion, /completions
    COMPLETIONS = "completions"  # /v1/completions
    CHAT = "chat"  # /v1/chat/completions, /chat/completions


@dataclass(frozen=True)
class GenerationParams:
    """Everything a completion request asked for, validated, with the server's defaults filled in.

    Built once by parse_generation_params; each later step (prepare_request, the chat prompt, the
    settings echo) returns a new record with what it adds.
    """

    request: GenerationRequest  # what the engine runs, all but the prompt (request_for adds it)
    sampling: SamplingParams  # as requested (`seed` -1: random), for the echo; request.sampling has the seed drawn
    constraint: ConstraintRequest = field(default_factory=ConstraintRequest)  # compiled by prepare_request
    stream: bool = False
    include_usage: bool = False
    return_tokens: bool = False
    timings_per_token: bool = False
    response_fields: list[str] = field(default_factory=list)
    logprobs: bool = False  # OpenAI answers carry `logprobs`
    top_logprobs: int | None = None  # chat: alternatives shown per token (n_probs may be 1 more)
    reasoning_format: str = "auto"  # chat: how thinking is split from the answer (lamplight.chat.reasoning)
    reasoning_budget: int = -1  # chat: tokens of thinking (-1 unlimited, 0 off): `reasoning_budget_tokens`
    reasoning_budget_message: str = ""  # chat: forced before the end of thinking when the budget runs out
    # Added by the steps after parsing:
    grammar_text: str = ""  # generation_settings' `grammar` (prepare_request)
    reasoning: Any = None  # lamplight.chat.reasoning.ReasoningPlan (the chat prompt)
    answer_wrapper: Any = None  # lamplight.chat.answer_wrappers.AnswerWrapper (the chat prompt)

    @property
    def n_choices(self) -> int:
        return self.request.n_choices

    @property
    def n_probs(self) -> int:
        return self.sampling.n_probs

    @property
    def tool_plan(self) -> Any:
        """lamplight.tools.ToolPlan of a chat request with `tools`, else None."""
        return self.constraint.tool_plan

    def with_request(self, **changes: Any) -> "GenerationParams":
        """This record with those fields of its engine request replaced."""
        return dataclasses.replace(self, request=dataclasses.replace(self.request, **changes))

    def request_for(self, prompt_tokens: list[int]) -> GenerationRequest:
        """The engine request for one prompt; a MediaPrompt (lamplight.server.media) brings its image rows."""
        return dataclasses.replace(self.request, prompt_tokens=list(prompt_tokens),
                                   media=getattr(prompt_tokens, "media", ()))


def default_sampling(settings: ServerSettings) -> SamplingParams:
    """What a request samples with unless it says otherwise: llama-server's defaults, then the flags'."""
    return SamplingParams(**{**server_defaults(SamplingParams), **settings.sampling_defaults})


def parse_generation_params(body: dict, endpoint: Endpoint, settings: ServerSettings, tokenizer: Any,
                            n_parallel: int, chat_template: Any = None) -> GenerationParams:
    """A 400 naming the first bad field, else the request's parameters. `tokenizer` resolves
    logit_bias strings; `chat_template`, the model's ChatTemplate, decides the tool-call format
    (chat only). Nothing is compiled here: prepare_request does that next."""
    fields = Fields(body)
    limits = settings.limits
    reject_unsupported_inputs(fields)
    check_grammar_size(fields, limits.max_grammar_bytes)
    constraint = read_constraint(fields, endpoint is Endpoint.CHAT, chat_template)
    if not constraint.kind:
        constraint = server_constraint(settings)
    n_probs, logprobs, top_logprobs = _probabilities(fields, endpoint, limits.max_n_probs)
    sampling = _sampling(_SamplingInputs(fields, limits, tokenizer, n_probs), default_sampling(settings))
    stream = fields.boolean("stream", False)
    request = _engine_request(fields, settings, sampling, n_parallel, stream)
    fields.integer("n_cache_reuse", 0, minimum=0)  # accepted; shifted chunks would make replies depend on the cache (--cache-reuse)
    return GenerationParams(
        request=request,
        sampling=sampling,
        constraint=constraint,
        stream=stream,
        include_usage=_include_usage(fields) and stream,
        return_tokens=fields.boolean("return_tokens", False),
        timings_per_token=fields.boolean("timings_per_token", False),
        response_fields=fields.string_list("response_fields", []),
        logprobs=logprobs,
        top_logprobs=top_logprobs,
        reasoning_format=_reasoning_format(fields, settings) if endpoint is Endpoint.CHAT else "auto",
        # llama.cpp HEAD's per-request fields; they act on chat replies of templates that think.
        reasoning_budget=fields.integer("reasoning_budget_tokens", settings.reasoning_budget,
                                        minimum=-1, maximum=INT32_MAX),
        reasoning_budget_message=fields.string("reasoning_budget_message", settings.reasoning_budget_message),
    )


def _engine_request(fields: Fields, settings: ServerSettings, sampling: SamplingParams, n_parallel: int,
                    stream: bool) -> GenerationRequest:
    """The engine's part of the request, without its prompt; the grammar, DRY's breakers, the
    reasoning budget and the settings echo are added by the steps after parsing."""
    return GenerationRequest(
        prompt_tokens=[],
        sampling=dataclasses.replace(sampling, seed=effective_seed(sampling.seed)),
        n_predict=_n_predict(fields, settings),
        stop=_stop_strings(fields, settings),
        cache_prompt=fields.boolean("cache_prompt", settings.cache_prompt),
        id_slot=fields.integer("id_slot", -1, minimum=-1),
        n_choices=_n_choices(fields, n_parallel),
        return_progress=fields.boolean("return_progress", False) and stream,
        n_indent=fields.integer("n_indent", 0, minimum=0),
        n_keep=fields.integer("n_keep", settings.n_keep, minimum=-1),
        n_discard=fields.integer("n_discard", 0, minimum=0),
        lora=_lora(fields),
        t_max_predict_ms=fields.number("t_max_predict_ms", -1.0, minimum=-1),
        speculative=_speculative(fields),
    )


SPECULATIVE_FIELDS = ("speculative.type", "speculative.n_max", "speculative.n_min", "speculative.p_min")


def _speculative(fields: Fields) -> SpecRequest | None:
    """The request's speculative decoding (llama-server b7062's `speculative.*` fields, and HEAD's
    `speculative.type`): the kinds (\"none\": off for this request), the most and fewest tokens
    per draft. None: the server's (--spec-type)."""
    if not any(fields.given(name) for name in SPECULATIVE_FIELDS):
        return None
    kinds = None
    if fields.given("speculative.type"):
        try:
            kinds = parse_kinds(fields.string("speculative.type", ""))
        except ValueError as exc:
            raise field_error("speculative.type", str(exc)) from None
    n_max = fields.integer("speculative.n_max", -1, minimum=0) if fields.given("speculative.n_max") else None
    n_min = fields.integer("speculative.n_min", 0, minimum=0)
    if n_max is not None and n_min > n_max:
        raise field_error("speculative.n_min", f"must not exceed speculative.n_max ({n_max}), got {n_min}")
    fields.number("speculative.p_min", 0.0, minimum=0.0, maximum=1.0)  # a draft model's; the n-gram kinds have no probabilities
    return SpecRequest(kinds, n_max, n_min)


def server_constraint(settings: ServerSettings) -> ConstraintRequest:
    """`--grammar` / `--json-schema`: the constraint of a request that asks for none of its own."""
    if settings.grammar:
        return ConstraintRequest("--grammar", "grammar", settings.grammar)
    if settings.json_schema is not None:
        return ConstraintRequest("--json-schema", "json_schema", settings.json_schema)
    return ConstraintRequest()


def _reasoning_format(fields: Fields, settings: ServerSettings) -> str:
    value = fields.string("reasoning_format", settings.reasoning_format)
    if value not in REASONING_FORMATS:
        raise field_error("reasoning_format", f"must be one of {', '.join(REASONING_FORMATS)}, got {value!r}")
    return value


def _stop_strings(fields: Fields, settings: ServerSettings) -> list[str]:
    limits = settings.limits
    # `-r`'s strings stand in for a request that gives none (llama-server's reverse prompt).
    stop = fields.string_list("stop", [], allow_single=True) or list(settings.stop)
    if len(stop) > limits.max_stop_strings:
        raise field_error("stop", f"at most {limits.max_stop_strings} stop strings (--max-stop-strings), got {len(stop)}")
    longest = max(map(len, stop), default=0)
    if longest > limits.max_stop_chars:
        raise field_error("stop", f"a stop string may have at most {limits.max_stop_chars} characters, got {longest}")
    return stop


def reject_unsupported_inputs(fields: Fields) -> None:
    if fields.raw("multimodal_data"):
        raise invalid_request(NO_MULTIMODAL)


# -- sampling fields ---------------------------------------------------------------------------

@dataclass(frozen=True)
class _SamplingInputs:
    """What the fields read with more than their table entry need."""

    fields: Fields
    limits: RequestLimits
    tokenizer: Any
    n_probs: int  # decided with the endpoint's logprobs fields (_probabilities)


def _breakers(inputs: _SamplingInputs, default: list[str]) -> list[str]:
    breakers = inputs.fields.string_list("dry_sequence_breakers", default, non_empty=True)
    limit = inputs.limits.max_dry_breakers
    if len(breakers) > limit:
        raise field_error("dry_sequence_breakers",
                          f"at most {limit} breakers (--max-dry-breakers), got {len(breakers)}")
    return breakers


def _samplers(inputs: _SamplingInputs, default: list[str]) -> list[str]:
    return parse_samplers(inputs.fields.raw("samplers")) if inputs.fields.given("samplers") else default


def _logit_bias(inputs: _SamplingInputs, default: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """Bounded before and after resolving: every entry costs work on the engine thread each step."""
    raw, limit = inputs.fields.raw("logit_bias"), inputs.limits.max_logit_bias
    if raw is None:
        return default
    if isinstance(raw, (list, dict)) and len(raw) > limit:
        raise field_error("logit_bias", f"at most {limit} entries (--max-logit-bias), got {len(raw)}")
    resolved = resolve_logit_bias(raw, inputs.tokenizer, inputs.tokenizer.vocab_size)
    if len(resolved) > limit:
        raise field_error("logit_bias", f"the entries name {len(resolved)} tokens, more than the limit of {limit} "
                                        f"(--max-logit-bias)")
    return resolved


# The sampling fields read with more than their table entry: request limits, the tokenizer, the
# endpoint's logprobs rules. Every other field is read as its entry says (read_sampling_field).
_READ_WITH_INPUTS: dict[str, Callable[[_SamplingInputs, Any], Any]] = {
    "dry_sequence_breakers": _breakers,
    "logit_bias": _logit_bias,
    "samplers": _samplers,
    "n_probs": lambda inputs, default: inputs.n_probs,
}

_KIND_READERS: dict[str, Callable[..., Any]] = {
    "number": Fields.number,
    "integer": Fields.integer,
    "boolean": Fields.boolean,
    "list": lambda fields, name, default: fields.raw(name, default),  # checked by SamplingParams.validate
}


def read_sampling_field(fields: Fields, name: str, spec: FieldSpec, default: Any) -> Any:
    """One sampling field as its table entry says: its kind and range, under its name or an alias."""
    given = fields.first_given(name, *spec.aliases) or name
    return _KIND_READERS[spec.kind](fields, given, default, **spec.bounds())


def _sampling(inputs: _SamplingInputs, defaults: SamplingParams) -> SamplingParams:
    """Every sampling field, read over `defaults`, then checked together (samplers, breakers...)."""
    values = {}
    try:
        for name, spec in sampling_fields(SamplingParams):
            default = getattr(defaults, name)
            read = _READ_WITH_INPUTS.get(name)
            values[name] = read(inputs, default) if read else read_sampling_field(inputs.fields, name, spec, default)
        sampling = SamplingParams(**values)
        sampling.validate()
    except ValueError as exc:
        raise value_error_as_field_error(exc) from None
    return sampling


def _probabilities(fields: Fields, endpoint: Endpoint, limit: int) -> tuple[int, bool, int | None]:
    """(n_probs, logprobs, top_logprobs): how many probabilities each step reports, whether an
    OpenAI answer carries `logprobs`, and (chat) how many alternatives it shows per token."""
    if endpoint is Endpoint.CHAT:
        return _chat_probabilities(fields, limit)
    if endpoint is Endpoint.COMPLETIONS:
        name = "n_probs" if fields.given("n_probs") else "logprobs"
        n_probs = fields.integer(name, 0, minimum=0, maximum=limit)
        return n_probs, n_probs > 0, None
    return fields.integer("n_probs", 0, minimum=0, maximum=limit), False, None


def _chat_probabilities(fields: Fields, limit: int) -> tuple[int, bool, int | None]:
    logprobs = fields.boolean("logprobs", False)
    top = fields.integer("top_logprobs", DEFAULT_TOP_LOGPROBS, minimum=0, maximum=limit)
    if fields.given("top_logprobs") and not logprobs:
        raise invalid_request("top_logprobs requires logprobs to be set to true")
    if logprobs:
        # The chosen token's own logprob needs at least one probability per step.
        return max(top, 1), True, top
    n_probs = fields.integer("n_probs", 0, minimum=0, maximum=limit)
    return n_probs, n_probs > 0, None


def _n_predict(fields: Fields, settings: ServerSettings) -> int:
    # An explicit `n_predict` wins over the OpenAI names.
    name = fields.first_given("n_predict", "max_completion_tokens", "max_tokens")
    if name is None:
        return settings.n_predict
    value = fields.integer(name, -1, minimum=-1, maximum=INT32_MAX)
    return settings.n_predict if value == -1 else value


def _n_choices(fields: Fields, n_parallel: int) -> int:
    name = fields.first_given("n_cmpl", "n") or "n"
    return fields.integer(name, 1, minimum=1, maximum=n_parallel)


def _include_usage(fields: Fields) -> bool:
    options = fields.object("stream_options")
    if not options:
        return False
    return Fields(options).boolean("include_usage", False)


def _lora(fields: Fields) -> list[tuple[int, float]] | None:
    """`[{"id": 0, "scale": 0.5}, ...]`; the engine rejects ids of adapters it does not have."""
    adapters = fields.array("lora")
    if adapters is None:
        return None
    return parse_lora_entries(adapters, "lora")


def parse_lora_entries(adapters: list, name: str) -> list[tuple[int, float]]:
    """A list of `{"id": int, "scale": number}` objects -> [(id, scale)] (also POST /lora-adapters)."""
    parsed = []
    for index, entry in enumerate(adapters):
        entry_fields = Fields(entry) if isinstance(entry, dict) else None
        if entry_fields is None or not entry_fields.given("id") or not entry_fields.given("scale"):
            raise field_error(name, f"entry {index} must be an object with an integer 'id' and a number 'scale'")
        try:
            parsed.append((entry_fields.integer("id", 0, minimum=0), entry_fields.number("scale", 1.0)))
        except ApiError as exc:
            raise field_error(name, f"entry {index}: {exc.message.removeprefix('Field ')}") from None
    return parsed
