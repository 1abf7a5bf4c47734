"""llama.cpp's native /completion result objects (semantics doc 3.1 and 3.6)."""

from __future__ import annotations

from lamplight.engine.types import FinalEvent, PromptProgress, Timings, TokenEvent

from .probs import probs_json, token_probs_json
from .response_context import ResponseContext


def native_final(ctx: ResponseContext, index: int, final: FinalEvent, *, streamed_text: str | None = None) -> dict:
    """The final object; in a stream `streamed_text` is what the partials already carried."""
    streamed = streamed_text is not None
    params = ctx.params
    body = {
        "index": index,
        "content": _unsent(final.content, streamed_text) if streamed else final.content,
        "tokens": list(final.token_ids) if params.return_tokens and not streamed else [],
        "id_slot": final.id_slot,
        "stop": True,
        "model": ctx.model,
        "tokens_predicted": final.n_decoded,
        "tokens_evaluated": final.n_prompt,
        "generation_settings": ctx.generation_settings,
        "prompt": ctx.prompt_text(index),
        "has_new_line": final.has_new_line,
        "truncated": final.truncated,
        "stop_type": final.stop_type,
        "stopping_word": final.stopping_word,
        "tokens_cached": final.tokens_cached,
        "timings": final.timings.to_json(),
    }
    if params.n_probs > 0 and not streamed:
        body["completion_probabilities"] = probs_json(final.probs, ctx.tokenizer)
    return select_response_fields(body, params.response_fields)


def _unsent(content: str, streamed_text: str) -> str:
    return content[len(streamed_text):] if content.startswith(streamed_text) else ""


def native_partial(ctx: ResponseContext, index: int, event: TokenEvent, timings: Timings | None) -> dict:
    body = _partial_head(ctx, index, event.text, [event.token_id], event.n_decoded)
    if timings is not None:
        body["timings"] = timings.to_json()
    if event.prob is not None and ctx.params.n_probs > 0:
        body["completion_probabilities"] = [token_probs_json(event.prob, ctx.tokenizer)]
    return body


def native_progress(ctx: ResponseContext, index: int, progress: PromptProgress, timings: Timings | None) -> dict:
    body = _partial_head(ctx, index, "", [], 0)
    if timings is not None:
        body["timings"] = timings.to_json()
    body["prompt_progress"] = progress_json(progress)
    return body


def _partial_head(ctx: ResponseContext, index: int, text: str, tokens: list[int], n_decoded: int) -> dict:
    return {
        "index": index,
        "content": text,
        "tokens": tokens,
        "stop": False,
        "id_slot": -1,
        "tokens_predicted": n_decoded,
        "tokens_evaluated": len(ctx.prompt_of(index)),
    }


def progress_json(progress: PromptProgress) -> dict:
    return {"total": progress.total, "cache": progress.cache, "processed": progress.processed,
            "time_ms": int(progress.time_ms)}


def select_response_fields(body: dict, paths: list[str]) -> dict:
    """Only the asked-for fields; "a/b" looks up body["a"]["b"] and is returned under the key "a/b"."""
    if not paths:
        return body
    selected = {}
    for path in paths:
        value, found = body, True
        for part in path.split("/"):
            if not isinstance(value, dict) or part not in value:
                found = False
                break
            value = value[part]
        if found:
            selected[path] = value
    return selected
