"""The `prompt` forms of /completion, /completions and /v1/completions (semantics doc 3.1a)."""

from __future__ import annotations

from typing import Any

from .errors import invalid_request
from .fields import is_number
from .params import NO_MULTIMODAL


def tokenize_prompts(prompt: Any, tokenizer: Any) -> list[list[int]]:
    """One token list per prompt of the request."""
    if prompt is None:
        raise invalid_request('"prompt" is required')
    if isinstance(prompt, list):
        if not prompt:
            raise invalid_request('"prompt" must not be empty')
        # Any number at the top level makes the whole array one (mixed) token prompt.
        if any(is_number(item) for item in prompt):
            return [tokenize_mixed(prompt, tokenizer)]
        return [_tokenize_one(item, tokenizer) for item in prompt]
    return [_tokenize_one(prompt, tokenizer)]


def _tokenize_one(prompt: Any, tokenizer: Any) -> list[int]:
    if isinstance(prompt, str):
        return tokenizer.encode(prompt, add_special=True, parse_special=True)
    if isinstance(prompt, list):
        return tokenize_mixed(prompt, tokenizer)
    if isinstance(prompt, dict):
        return _tokenize_object(prompt, tokenizer)
    raise invalid_request('"prompt" must be a string, an array of token ids (and strings) or an array of prompts')


def tokenize_mixed(items: list, tokenizer: Any, add_special: bool = True, parse_special: bool = True) -> list[int]:
    """Token ids and strings in one list; only a leading string gets the model's BOS."""
    tokens: list[int] = []
    for position, item in enumerate(items):
        if isinstance(item, str):
            tokens += tokenizer.encode(item, add_special=add_special and position == 0, parse_special=parse_special)
        elif is_number(item) and float(item).is_integer():
            tokens.append(_token_id(int(item), tokenizer))
        else:
            raise invalid_request(f"element {item!r} is neither a token id nor a string")
    return tokens


def _token_id(token: int, tokenizer: Any) -> int:
    if not 0 <= token < tokenizer.vocab_size:
        raise invalid_request(f"token id {token} is out of range [0, {tokenizer.vocab_size})")
    return token


def _tokenize_object(prompt: dict, tokenizer: Any) -> list[int]:
    if prompt.get("multimodal_data"):
        raise invalid_request(NO_MULTIMODAL)
    text = prompt.get("prompt_string")
    if not isinstance(text, str):
        raise invalid_request('a "prompt" object needs a string "prompt_string"')
    return tokenizer.encode(text, add_special=True, parse_special=True)
