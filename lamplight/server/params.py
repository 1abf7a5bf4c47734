"""A request body -> the generation parameters of a GenerationRequest plus how to answer.

Field names and defaults are llama.cpp's (server semantics doc, section 2). Per-request values
start from the server's CLI defaults (`--temp`, `--top-k`, ..., `-n`).
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any

from lamplight.chat.reasoning import REASONING_FORMATS
from lamplight.engine.types import GenerationRequest
from lamplight.sampling.dry import BreakerTable
from lamplight.sampling.logit_bias import resolve_logit_bias
from lamplight.sampling.params import SamplingParams, effective_seed, parse_samplers
from lamplight.sampling.sequence import uses_dry

from .constraints import check_grammar_size, resolve_constraint
from .errors import ApiError, field_error, invalid_request
from .fields import INT32_MAX, Fields, value_error_as_field_error
from .settings import RequestLimits, ServerSettings

UINT32_MAX = 0xFFFFFFFF
DEFAULT_TOP_LOGPROBS = 20  # llama-server's default when a chat request sets `logprobs: true`
NO_MULTIMODAL = "this model has no multimodal projector"

# llama-server's own defaults where they differ from the sampling library's.
SERVER_SAMPLING_DEFAULTS = {"dry_penalty_last_n": 64}


class Endpoint(enum.Enum):
    NATIVE = "native"  # /completion, /completions
    COMPLETIONS = "completions"  # /v1/completions
    CHAT = "chat"  # /v1/chat/completions, /chat/completions


# (field, reader, reader arguments) for the plain numeric and boolean sampling fields.
_SAMPLING_FIELDS: tuple[tuple[str, str, dict], ...] = (
    ("temperature", "number", {"minimum": 0}),
    ("dynatemp_range", "number", {"minimum": 0}),
    ("dynatemp_exponent", "number", {"minimum": 0}),
    ("top_k", "integer", {}),  # <= 0 disables top-k
    ("top_p", "number", {"minimum": 0, "maximum": 1}),
    ("min_p", "number", {"minimum": 0, "maximum": 1}),
    ("typical_p", "number", {"minimum": 0, "maximum": 1}),
    ("top_n_sigma", "number", {}),  # <= 0 disables it
    ("min_keep", "integer", {"minimum": 0}),
    ("xtc_probability", "number", {"minimum": 0, "maximum": 1}),
    ("xtc_threshold", "number", {"minimum": 0, "maximum": 1}),
    ("repeat_last_n", "integer", {"minimum": -1}),
    ("repeat_penalty", "positive_number", {}),
    ("presence_penalty", "number", {}),
    ("frequency_penalty", "number", {}),
    ("dry_multiplier", "number", {"minimum": 0}),
    ("dry_base", "number", {"minimum": 1}),
    ("dry_allowed_length", "integer", {"minimum": 0}),
    ("dry_penalty_last_n", "integer", {"minimum": -1}),
    ("mirostat", "integer", {"minimum": 0, "maximum": 2}),
    ("mirostat_tau", "number", {"minimum": 0}),
    ("mirostat_eta", "number", {"minimum": 0}),
    ("ignore_eos", "boolean", {}),
    ("seed", "integer", {"minimum": -1, "maximum": UINT32_MAX}),
    ("post_sampling_probs", "boolean", {}),
)


@dataclass
class GenerationParams:
    """Everything a completion request asked for, validated, with server defaults filled in."""

    sampling: SamplingParams  # `seed` as requested (-1: random), for the echo
    seed: int  # the seed the engine really uses
    n_predict: int
    stop: list[str]
    n_choices: int = 1
    cache_prompt: bool = True
    id_slot: int = -1
    n_indent: int = 0
    t_max_predict_ms: float = -1.0
    n_keep: int = 0
    n_discard: int = 0
    stream: bool = False
    include_usage: bool = False
    return_tokens: bool = False
    timings_per_token: bool = False
    return_progress: bool = False
    response_fields: list[str] = field(default_factory=list)
    lora: list[tuple[int, float]] | None = None  # None: the server's adapter scales
    logprobs: bool = False  # OpenAI answers carry `logprobs`
    top_logprobs: int | None = None  # chat: alternatives shown per token (n_probs may be 1 more)
    settings_echo: dict | None = None  # generation_settings, echoed by the engine in /slots
    grammar: Any = None  # lamplight.grammar.CompiledGrammar
    grammar_text: str = ""
    tool_plan: Any = None  # lamplight.tools.ToolPlan: chat requests with `tools`
    reasoning_format: str = "auto"  # chat: how thinking is split from the answer (lamplight.chat.reasoning)
    reasoning: Any = None  # lamplight.chat.reasoning.ReasoningPlan, set once the prompt is rendered
    answer_wrapper: Any = None  # lamplight.chat.answer_wrappers.AnswerWrapper: chat, markers around the answer
    reasoning_budget: int = -1  # chat: tokens of thinking (-1 unlimited, 0 off): `reasoning_budget_tokens`
    reasoning_budget_message: str = ""  # chat: forced before the end of thinking when the budget runs out
    reasoning_budget_spec: Any = None  # lamplight.sampling.ReasoningBudgetSpec, set once the prompt is rendered
    dry_breakers: Any = None  # lamplight.sampling.dry.BreakerTable when DRY runs

    @property
    def n_probs(self) -> int:
        return self.sampling.n_probs

    def request_for(self, prompt_tokens: list[int]) -> GenerationRequest:
        return GenerationRequest(
            prompt_tokens=prompt_tokens,
            sampling=dataclasses.replace(self.sampling, seed=self.seed),
            n_predict=self.n_predict,
            stop=tuple(self.stop),
            cache_prompt=self.cache_prompt,
            id_slot=self.id_slot,
            n_choices=self.n_choices,
            return_progress=self.return_progress and self.stream,
            n_indent=self.n_indent,
            n_keep=self.n_keep,
            n_discard=self.n_discard,
            lora=self.lora,
            t_max_predict_ms=self.t_max_predict_ms,
            settings=self.settings_echo,
            grammar=self.grammar,
            reasoning_budget=self.reasoning_budget_spec,
            dry_breakers=self.dry_breakers,
        )


def default_sampling(settings: ServerSettings) -> SamplingParams:
    return SamplingParams(**{**SERVER_SAMPLING_DEFAULTS, **settings.sampling_defaults})


def parse_generation_params(body: dict, endpoint: Endpoint, settings: ServerSettings,
                            tokenizer: Any, n_parallel: int, grammar_compiler: Any = None,
                            chat_template: Any = None) -> GenerationParams:
    """`grammar_compiler`: a callable returning the model's GrammarCompiler (made on first use).
    `chat_template`: the model's ChatTemplate, which decides the tool-call format (chat only)."""
    fields = Fields(body)
    limits = settings.limits
    reject_unsupported_inputs(fields)
    check_grammar_size(fields, limits.max_grammar_bytes)
    constraint = resolve_constraint(fields, endpoint is Endpoint.CHAT, grammar_compiler or _no_grammars,
                                    chat_template, tokenizer)
    sampling = _sampling(fields, settings, tokenizer, endpoint)
    stream = fields.boolean("stream", False)
    params = GenerationParams(
        sampling=sampling,
        seed=effective_seed(sampling.seed),
        n_predict=_n_predict(fields, settings),
        stop=_stop_strings(fields, limits),
        n_choices=_n_choices(fields, n_parallel),
        cache_prompt=fields.boolean("cache_prompt", True),
        id_slot=fields.integer("id_slot", -1, minimum=-1),
        n_indent=fields.integer("n_indent", 0, minimum=0),
        t_max_predict_ms=fields.number("t_max_predict_ms", -1.0, minimum=-1),
        n_keep=fields.integer("n_keep", settings.n_keep, minimum=-1),
        n_discard=fields.integer("n_discard", 0, minimum=0),
        stream=stream,
        include_usage=_include_usage(fields) and stream,
        return_tokens=fields.boolean("return_tokens", False),
        timings_per_token=fields.boolean("timings_per_token", False),
        return_progress=fields.boolean("return_progress", False),
        response_fields=fields.string_list("response_fields", []),
        lora=_lora(fields),
        grammar=constraint.grammar,
        grammar_text=constraint.echo,
        tool_plan=constraint.tool_plan,
        dry_breakers=_dry_breakers(sampling, tokenizer),
    )
    # llama.cpp HEAD's per-request fields; they act on chat replies of templates that think.
    params.reasoning_budget = fields.integer("reasoning_budget_tokens", settings.reasoning_budget,
                                             minimum=-1, maximum=INT32_MAX)
    params.reasoning_budget_message = fields.string("reasoning_budget_message", settings.reasoning_budget_message)
    fields.integer("n_cache_reuse", 0, minimum=0)  # accepted; chunk reuse is not implemented
    if endpoint is Endpoint.CHAT:
        _chat_logprobs(fields, params, limits.max_n_probs)
        params.reasoning_format = _reasoning_format(fields)
    elif endpoint is Endpoint.COMPLETIONS:
        params.logprobs = params.n_probs > 0
    return params


def _reasoning_format(fields: Fields) -> str:
    value = fields.string("reasoning_format", "auto")
    if value not in REASONING_FORMATS:
        raise field_error("reasoning_format", f"must be one of {', '.join(REASONING_FORMATS)}, got {value!r}")
    return value


def _dry_breakers(sampling: SamplingParams, tokenizer: Any) -> Any:
    """DRY's breaker table, built here in the request's thread: it walks the vocabulary once per
    breaker, which would hold up every stream if the engine thread did it."""
    if not uses_dry(sampling):
        return None
    return BreakerTable.for_tokenizer(tokenizer, sampling.dry_sequence_breakers)


def _stop_strings(fields: Fields, limits: RequestLimits) -> list[str]:
    stop = fields.string_list("stop", [], allow_single=True)
    if len(stop) > limits.max_stop_strings:
        raise field_error("stop", f"at most {limits.max_stop_strings} stop strings (--max-stop-strings), got {len(stop)}")
    longest = max(map(len, stop), default=0)
    if longest > limits.max_stop_chars:
        raise field_error("stop", f"a stop string may have at most {limits.max_stop_chars} characters, got {longest}")
    return stop


def _no_grammars():
    raise invalid_request("constrained decoding is not available on this server")


def reject_unsupported_inputs(fields: Fields) -> None:
    if fields.raw("multimodal_data"):
        raise invalid_request(NO_MULTIMODAL)


def _sampling(fields: Fields, settings: ServerSettings, tokenizer: Any, endpoint: Endpoint) -> SamplingParams:
    params = default_sampling(settings)
    for name, reader, options in _SAMPLING_FIELDS:
        setattr(params, name, getattr(fields, reader)(name, getattr(params, name), **options))
    limits = settings.limits
    params.dry_sequence_breakers = fields.string_list(
        "dry_sequence_breakers", params.dry_sequence_breakers, non_empty=True)
    if len(params.dry_sequence_breakers) > limits.max_dry_breakers:
        raise field_error("dry_sequence_breakers", f"at most {limits.max_dry_breakers} breakers (--max-dry-breakers), "
                                                   f"got {len(params.dry_sequence_breakers)}")
    params.n_probs = _n_probs(fields, endpoint, limits.max_n_probs)
    try:
        if fields.given("samplers"):
            params.samplers = parse_samplers(fields.raw("samplers"))
        if fields.given("logit_bias"):
            params.logit_bias = _logit_bias(fields, tokenizer, limits.max_logit_bias)
        params.validate()
    except ValueError as exc:
        raise value_error_as_field_error(exc) from None
    return params


def _logit_bias(fields: Fields, tokenizer: Any, limit: int) -> list[tuple[int, float]]:
    """Bounded before and after resolving: every entry costs work on the engine thread each step."""
    raw = fields.raw("logit_bias")
    if isinstance(raw, (list, dict)) and len(raw) > limit:
        raise field_error("logit_bias", f"at most {limit} entries (--max-logit-bias), got {len(raw)}")
    resolved = resolve_logit_bias(raw, tokenizer, tokenizer.vocab_size)
    if len(resolved) > limit:
        raise field_error("logit_bias", f"the entries name {len(resolved)} tokens, more than the limit of {limit} "
                                        f"(--max-logit-bias)")
    return resolved


def _n_probs(fields: Fields, endpoint: Endpoint, limit: int) -> int:
    if endpoint is Endpoint.COMPLETIONS and not fields.given("n_probs"):
        return fields.integer("logprobs", 0, minimum=0, maximum=limit)
    if endpoint is Endpoint.CHAT and fields.raw("logprobs") is True:
        return 0  # decided by _chat_logprobs
    return fields.integer("n_probs", 0, minimum=0, maximum=limit)


def _chat_logprobs(fields: Fields, params: GenerationParams, limit: int) -> None:
    logprobs = fields.boolean("logprobs", False)
    top = fields.integer("top_logprobs", DEFAULT_TOP_LOGPROBS, minimum=0, maximum=limit)
    if fields.given("top_logprobs") and not logprobs:
        raise invalid_request("top_logprobs requires logprobs to be set to true")
    params.logprobs = params.n_probs > 0
    if logprobs:
        params.logprobs = True
        params.top_logprobs = top
        # The chosen token's own logprob needs at least one probability per step.
        params.sampling.n_probs = max(top, 1)


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
