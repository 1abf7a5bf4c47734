"""llama.cpp's native endpoints: /completion(s), /infill, /tokenize, /detokenize, /apply-template."""

from __future__ import annotations

import functools

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from .chat_prompt import render_chat_prompt
from .completion_flow import answer_completion
from .errors import field_error
from .fields import Fields, is_number
from .infill import fim_tokens, format_infill_prompt, parse_infill_input
from .json_io import json_response, read_json_object
from .params import Endpoint
from .prompts import tokenize_mixed
from .routes_openai import server_state

router = APIRouter()


@router.post("/completion")
@router.post("/completions")
async def completion(request: Request) -> Response:
    body = await read_json_object(request)
    return await answer_completion(request, server_state(request), body, Endpoint.NATIVE)


@router.post("/infill")
async def infill(request: Request) -> Response:
    """Code infill: the /completion options and answer, with llama.cpp's FIM prompt."""
    body = await read_json_object(request)
    state = server_state(request)
    state.require_ready()
    fim_tokens(state.model.tokenizer)  # a model without FIM tokens: 400 before anything else
    parse_infill_input(body)
    return await answer_completion(request, state, body, Endpoint.NATIVE, build_prompts=infill_prompts)


def infill_prompts(state, body: dict) -> list[list[int]]:
    tokenizer = state.model.tokenizer
    engine = state.engine
    config = getattr(engine, "config", None)
    return [format_infill_prompt(
        tokenizer, fim_tokens(tokenizer), parse_infill_input(body),
        n_batch=getattr(config, "n_batch", 2048), n_predict=state.settings.n_predict,
        n_ctx=engine.n_ctx_slot, spm_infill=state.settings.spm_infill)]


@router.post("/tokenize")
async def tokenize(request: Request) -> Response:
    body = await read_json_object(request)
    state = server_state(request)
    tokenizer = state.tokenizer
    fields = Fields(body)
    add_special = fields.boolean("add_special", False)
    parse_special = fields.boolean("parse_special", True)
    with_pieces = fields.boolean("with_pieces", False)
    content = fields.raw("content", "")
    if isinstance(content, str):
        content = [content]
    if not isinstance(content, list):
        raise field_error("content", "must be a string or an array of token ids and strings")
    tokens = await run_in_threadpool(tokenize_mixed, content, tokenizer, add_special, parse_special)
    if with_pieces:
        return json_response({"tokens": [{"id": t, "piece": _piece(tokenizer, t)} for t in tokens]})
    return json_response({"tokens": tokens})


def _piece(tokenizer, token_id: int) -> str | list[int]:
    """The token's text, or its bytes when they are not valid UTF-8 on their own."""
    raw = tokenizer.token_bytes(token_id)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)


@router.post("/detokenize")
async def detokenize(request: Request) -> Response:
    body = await read_json_object(request)
    tokenizer = server_state(request).tokenizer
    tokens = Fields(body).array("tokens") or []
    for token in tokens:
        if not is_number(token) or not float(token).is_integer() or not 0 <= token < tokenizer.vocab_size:
            raise field_error("tokens", f"token id {token!r} is not in the vocabulary [0, {tokenizer.vocab_size})")
    # Pieces concatenated as llama-server's tokens_to_str does (no leading-space clean-up).
    text = b"".join(tokenizer.token_bytes(int(t)) for t in tokens).decode("utf-8", "replace")
    return json_response({"content": text})


@router.post("/apply-template")
async def apply_template(request: Request) -> Response:
    body = await read_json_object(request)
    state = server_state(request)
    state.require_ready()
    # As for a chat request: a budget of 0 (the flag's or the request's) renders thinking off.
    budget = Fields(body).integer("reasoning_budget_tokens", state.settings.reasoning_budget, minimum=-1)
    prompt = await run_in_threadpool(functools.partial(render_chat_prompt, for_generation=False,
                                                       reasoning_budget=budget,
                                                       template_kwargs=state.settings.template_kwargs,
                                                       media_marker=_marker(state)),
                                    body, state.model.chat_template)
    return json_response({"prompt": prompt})


def _marker(state) -> str | None:
    """The marker image parts render as, when the model takes images."""
    return state.media.marker if state.media is not None else None
