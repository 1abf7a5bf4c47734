"""Token probabilities as llama-server serializes them (semantics doc 3.5)."""

from __future__ import annotations

import math
from typing import Any, Iterable

from lamplight.sampling import TokenProb, TokenProbs

FLOAT32_LOWEST = -3.4028234663852886e38  # what llama.cpp writes for log(0): JSON has no -inf


def utf8_text(raw: bytes) -> str:
    """The token's text: an incomplete UTF-8 sequence at the end is cut, as llama.cpp does."""
    for cut in range(len(raw), max(len(raw) - 4, 0) - 1, -1):
        try:
            return raw[:cut].decode("utf-8")
        except UnicodeDecodeError as exc:
            if exc.reason != "unexpected end of data":
                break
    return raw.decode("utf-8", "replace")


def _entry(prob: TokenProb, tokenizer: Any, post_sampling: bool) -> dict:
    raw = tokenizer.token_bytes(prob.token_id)
    entry = {"id": prob.token_id, "token": utf8_text(raw), "bytes": list(raw)}
    if post_sampling:
        entry["prob"] = prob.prob
    else:
        entry["logprob"] = prob.logprob if math.isfinite(prob.logprob) else FLOAT32_LOWEST
    return entry


def token_probs_json(probs: TokenProbs, tokenizer: Any, top_limit: int | None = None) -> dict:
    post = probs.post_sampling
    entry = _entry(probs.chosen, tokenizer, post)
    top = probs.top if top_limit is None else probs.top[:top_limit]
    entry["top_probs" if post else "top_logprobs"] = [_entry(p, tokenizer, post) for p in top]
    return entry


def probs_json(probs: Iterable[TokenProbs | None], tokenizer: Any, top_limit: int | None = None) -> list[dict]:
    return [token_probs_json(p, tokenizer, top_limit) for p in probs if p is not None]


def openai_logprobs(probs: Iterable[TokenProbs | None], tokenizer: Any, top_limit: int | None = None) -> dict | None:
    """The OpenAI `logprobs` member: `{"content": [...]}`, or None (JSON null) without probs."""
    content = probs_json(probs, tokenizer, top_limit)
    return {"content": content} if content else None
