"""The path every generating endpoint shares, off the event loop: parse the body, prepare the request
(compile its grammar, build DRY's breakers), build the prompt; then submit to the engine and answer
with one JSON object or an SSE stream."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from lamplight.engine.types import FinalEvent

from lamplight.chat.reasoning import plan_reasoning

from .answer_grammar import constrain_answer_only
from .chat_prompt import continues_thinking, reasoning_budget_spec, render_chat_prompt
from .errors import field_error, invalid_request
from .generation import GenerationRun, collect_unless_disconnected
from .generation_settings import generation_settings, lora_scales, speculative_types
from .json_io import json_response
from .params import Endpoint, GenerationParams, parse_generation_params
from .prepare import prepare_request
from .prompts import chat_prompt_tokens, tokenize_prompts
from .response_context import ResponseContext
from .responses_native import native_final
from .responses_openai import chat_response, completion_response
from .sse import stream_response
from .state import ServerState
from .stream_formats import ChatStream, CompletionStream, NativeStream, StreamFormat


@dataclass(frozen=True)
class PreparedCompletion:
    params: GenerationParams
    prompts: list[list[int]]


PromptBuilder = Callable[[ServerState, dict], list[list[int]]]


def prepare_completion(state: ServerState, body: dict, endpoint: Endpoint,
                       build_prompts: PromptBuilder | None = None) -> PreparedCompletion:
    try:
        prepared = _prepare(state, body, endpoint, build_prompts)
    except RecursionError:  # the last guard: a value nested too deeply for some parser on the way
        raise invalid_request("the request is nested too deeply to process") from None
    _check_size(prepared, state.settings.limits.max_sequences)
    return prepared


def _check_size(prepared: PreparedCompletion, limit: int) -> None:
    """A request runs prompts x n sequences; past the limit it could never be served well."""
    n_prompts, n = len(prepared.prompts), prepared.params.n_choices
    if n_prompts * n > limit:
        raise field_error("prompt", f"{n_prompts} prompts x n={n} make {n_prompts * n} sequences, more than the limit "
                                    f"of {limit} per request (--max-request-sequences)")


def _prepare(state: ServerState, body: dict, endpoint: Endpoint,
             build_prompts: PromptBuilder | None) -> PreparedCompletion:
    tokenizer = state.model.tokenizer
    chat_template = state.model.chat_template if endpoint is Endpoint.CHAT else None
    params = parse_generation_params(body, endpoint, state.settings, tokenizer, state.engine.n_parallel,
                                     chat_template)
    params = prepare_request(params, tokenizer, state.grammar_compiler)
    if build_prompts is not None:  # /infill
        return PreparedCompletion(params, build_prompts(state, body))
    if endpoint is Endpoint.CHAT:
        return _chat_completion(state, body, params)
    return PreparedCompletion(params, tokenize_prompts(body.get("prompt"), tokenizer, state.media))


def _chat_completion(state: ServerState, body: dict, params: GenerationParams) -> PreparedCompletion:
    """The chat prompt, and what depends on it: how the reply's thinking is split, its budget,
    and the grammar moved after the thinking."""
    tokenizer, chat_template = state.model.tokenizer, state.model.chat_template
    media = state.media  # a vision model: image parts render as its marker, then become its rows
    text = render_chat_prompt(body, chat_template, params.tool_plan, reasoning_budget=params.reasoning_budget,
                              template_kwargs=state.settings.template_kwargs,
                              media_marker=media.marker if media is not None else None)
    continues = continues_thinking(body)
    reasoning = plan_reasoning(getattr(chat_template, "reasoning", None), params.reasoning_format, text, continues)
    budget = reasoning_budget_spec(chat_template, text, params.reasoning_budget, params.reasoning_budget_message,
                                   tokenizer, continues)
    grammar = constrain_answer_only(params.request.grammar, reasoning, state.grammar_compiler, tokenizer)
    params = dataclasses.replace(params.with_request(reasoning_budget=budget, grammar=grammar), reasoning=reasoning,
                                 answer_wrapper=getattr(chat_template, "answer_wrapper", None))
    return PreparedCompletion(params, [chat_prompt_tokens(text, body, tokenizer, media)])


_STREAM_FORMATS: dict[Endpoint, Callable[[ResponseContext], StreamFormat]] = {
    Endpoint.NATIVE: NativeStream,
    Endpoint.COMPLETIONS: CompletionStream,
    Endpoint.CHAT: ChatStream,
}


def _native_response(ctx: ResponseContext, finals: dict[int, FinalEvent]) -> Any:
    results = [native_final(ctx, index, final) for index, final in sorted(finals.items())]
    return results[0] if len(results) == 1 else results


_JSON_BUILDERS: dict[Endpoint, Callable[[ResponseContext, dict[int, FinalEvent]], Any]] = {
    Endpoint.NATIVE: _native_response,
    Endpoint.COMPLETIONS: completion_response,
    Endpoint.CHAT: chat_response,
}


async def start_completion(request: Request, state: ServerState, body: dict, endpoint: Endpoint,
                           build_prompts: PromptBuilder | None = None) -> tuple[ResponseContext, GenerationRun]:
    """Parse, prepare and submit a request: what its answer is built from, and its running
    generation. `build_prompts(state, body)` replaces the usual `prompt`/`messages` handling
    (/infill)."""
    state.require_ready()
    prepared = await run_in_threadpool(prepare_completion, state, body, endpoint, build_prompts)
    echo = _settings_echo(state, prepared.params)
    params = prepared.params.with_request(settings=echo)  # the engine shows it in /slots
    ctx = ResponseContext(params=params, prompts=prepared.prompts, model=state.model_name,
                          fingerprint=state.settings.build_info, tokenizer=state.model.tokenizer,
                          generation_settings=echo)
    return ctx, GenerationRun.submit(state.engine, params, prepared.prompts, observer=state.metrics)


def stream_format(endpoint: Endpoint, ctx: ResponseContext) -> StreamFormat:
    return _STREAM_FORMATS[endpoint](ctx)


def json_result(endpoint: Endpoint, ctx: ResponseContext, finals: dict[int, FinalEvent]) -> Any:
    return _JSON_BUILDERS[endpoint](ctx, finals)


def ping_interval(state: ServerState) -> float | None:
    ping = state.settings.sse_ping_interval
    return ping if ping > 0 else None


async def answer_completion(request: Request, state: ServerState, body: dict, endpoint: Endpoint,
                            build_prompts: PromptBuilder | None = None) -> Response:
    ctx, run = await start_completion(request, state, body, endpoint, build_prompts)
    if ctx.params.stream:
        return await stream_response(request, run, stream_format(endpoint, ctx), ping_interval(state))
    finals = await collect_unless_disconnected(request, run)
    return json_response(json_result(endpoint, ctx, finals))


def _settings_echo(state: ServerState, params: GenerationParams) -> dict:
    """The request's generation_settings, as llama-server reports them."""
    request = params.request
    echo = generation_settings(
        params.sampling, n_predict=request.n_predict, stop=request.stop, n_keep=request.n_keep,
        n_discard=request.n_discard, stream=params.stream, timings_per_token=params.timings_per_token,
        eog_ids=state.model.tokenizer.eog_ids,
        lora_scales=lora_scales(request.lora, getattr(state.engine, "loras", [])),
        grammar=params.grammar_text,
        speculative_types=speculative_types(state.engine, request.speculative),
    )
    if params.tool_plan is not None:
        echo.update(params.tool_plan.settings_echo())
    return echo
