"""OpenAI-compatible result objects and stream chunks, key for key as llama-server writes them."""

from __future__ import annotations

from lamplight.engine.types import FinalEvent, Timings
from lamplight.sampling import TokenProbs
from lamplight.tools import finish_reason as tool_finish_reason
from lamplight.tools import message_json

from .probs import openai_logprobs
from .response_context import ResponseContext
from .responses_native import select_response_fields


def _logprobs(ctx: ResponseContext, probs: list[TokenProbs | None]) -> dict | None:
    if not ctx.params.logprobs:
        return None
    return openai_logprobs(probs, ctx.tokenizer, ctx.params.top_logprobs)


def _first_timings(finals: dict[int, FinalEvent]) -> dict:
    return finals[min(finals)].timings.to_json()


# -- /v1/completions --------------------------------------------------------------------------

def completion_response(ctx: ResponseContext, finals: dict[int, FinalEvent]) -> dict:
    choices = [
        {"text": final.content, "index": index, "logprobs": _logprobs(ctx, list(final.probs)),
         "finish_reason": final.finish_reason}
        for index, final in sorted(finals.items())
    ]
    return {
        "choices": choices,
        "created": ctx.created,
        "model": ctx.model,
        "system_fingerprint": ctx.fingerprint,
        "object": "text_completion",
        "usage": ctx.usage(finals),
        "id": ctx.id,
        "timings": _first_timings(finals),
    }


def completion_chunk(ctx: ResponseContext, index: int, text: str, prob: TokenProbs | None = None,
                     finish_reason: str | None = None) -> dict:
    return {
        "choices": [{"text": text, "index": index, "logprobs": _logprobs(ctx, [prob]),
                     "finish_reason": finish_reason}],
        "created": ctx.created,
        "model": ctx.model,
        "system_fingerprint": ctx.fingerprint,
        "object": "text_completion",
        "id": ctx.id,
    }


def completion_final_chunk(ctx: ResponseContext, index: int, final: FinalEvent, unsent_text: str) -> dict:
    chunk = completion_chunk(ctx, index, unsent_text, finish_reason=final.finish_reason)
    chunk["usage"] = ctx.usage({index: final})
    chunk["id"] = chunk.pop("id")  # llama-server's key order: ..., usage, id, timings
    chunk["timings"] = final.timings.to_json()
    return chunk


# -- /v1/chat/completions ---------------------------------------------------------------------

def chat_message(ctx: ResponseContext, final: FinalEvent) -> tuple[dict, str]:
    """-> (message, finish_reason). Thinking is split off first (lamplight.chat.reasoning), then
    with tools the answer is parsed for calls (lamplight.tools): calls are never in the thinking."""
    reasoning, content = split_reply(ctx.params, final.content)
    plan = ctx.params.tool_plan
    if plan is None or not plan.active:
        message = {"role": "assistant", "content": content}
        finish_reason = final.finish_reason
    else:
        parsed = plan.parse_final(content, final.stop_type)
        message = message_json(parsed)
        finish_reason = tool_finish_reason(parsed, final.stop_type, final.finish_reason)
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    return message, finish_reason


def split_reply(params, text: str, partial: bool = False) -> tuple[str | None, str]:
    """(thinking or None, answer) of a chat reply: the thinking split off under the request's
    reasoning plan, then the template's answer markers taken off (lamplight.chat.answer_wrappers)."""
    reasoning, content = None, text
    if params.reasoning is not None:
        split = params.reasoning.split(text, partial)
        reasoning, content = split.reasoning, split.content
    if params.answer_wrapper is not None:
        content = params.answer_wrapper.unwrap(content, partial)
    return reasoning, content


def chat_response(ctx: ResponseContext, finals: dict[int, FinalEvent]) -> dict:
    choices = []
    for index, final in sorted(finals.items()):
        message, finish_reason = chat_message(ctx, final)
        choice = {"finish_reason": finish_reason, "index": index, "message": message}
        logprobs = _logprobs(ctx, list(final.probs))
        if logprobs is not None:
            choice["logprobs"] = logprobs
        choices.append(choice)
    return {
        "choices": choices,
        "created": ctx.created,
        "model": ctx.model,
        "system_fingerprint": ctx.fingerprint,
        "object": "chat.completion",
        "usage": ctx.usage(finals),
        "id": ctx.id,
        "timings": _first_timings(finals),
        **_completion_fields(ctx, finals),
    }


def _completion_fields(ctx: ResponseContext, finals: dict[int, FinalEvent]) -> dict:
    """Jan's dialect: the fields of llama-server's /completion result that Jan documents on a chat
    completion too (of the first choice); `response_fields` trims them by /completion's paths
    ("generation_settings/n_predict" under that key), as it does there."""
    index = min(finals)
    final = finals[index]
    fields = {"generation_settings": ctx.generation_settings, "prompt": ctx.prompt_text(index),
              "truncated": final.truncated, "tokens_cached": final.tokens_cached, "tokens_evaluated": final.n_prompt}
    if not ctx.params.response_fields:
        return fields
    return select_response_fields(fields, ctx.params.response_fields)


def chat_chunk(ctx: ResponseContext, choices: list[dict]) -> dict:
    return {
        "choices": choices,
        "created": ctx.created,
        "id": ctx.id,
        "model": ctx.model,
        "system_fingerprint": ctx.fingerprint,
        "object": "chat.completion.chunk",
    }


def chat_delta_chunk(ctx: ResponseContext, index: int, delta: dict, prob: TokenProbs | None = None) -> dict:
    choice = {"finish_reason": None, "index": index, "delta": delta}
    logprobs = _logprobs(ctx, [prob])
    if logprobs is not None:
        choice["logprobs"] = logprobs
    return chat_chunk(ctx, [choice])


def chat_finish_chunk(ctx: ResponseContext, index: int, final: FinalEvent, finish_reason: str | None = None) -> dict:
    return chat_chunk(ctx, [{"finish_reason": finish_reason or final.finish_reason, "index": index, "delta": {}}])


def chat_usage_chunk(ctx: ResponseContext, finals: dict[int, FinalEvent], timings: Timings) -> dict:
    chunk = chat_chunk(ctx, [])
    chunk["usage"] = ctx.usage(finals)
    chunk["timings"] = timings.to_json()
    return chunk
