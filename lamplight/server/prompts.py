"""The `prompt` forms of /completion, /completions and /v1/completions (semantics doc 3.1a), and
a chat prompt's tokens; with a vision model, prompts with images (lamplight.server.media)."""

from __future__ import annotations

from typing import Any

from lamplight.chat import ChatTemplateError
from lamplight.chat.messages import chat_media_parts, image_url_of

from .errors import field_error, invalid_request
from .fields import is_number
from .media_sources import base64_bytes
from .params import NO_MULTIMODAL


def tokenize_prompts(prompt: Any, tokenizer: Any, media: Any = None) -> list[list[int]]:
    """One token list per prompt of the request. `media`: the server's MediaInput (a vision
    model is loaded), which turns `{prompt_string, multimodal_data}` prompts into MediaPrompts."""
    if prompt is None:
        raise invalid_request('"prompt" is required')
    if isinstance(prompt, list):
        if not prompt:
            raise invalid_request('"prompt" must not be empty')
        # Any number at the top level makes the whole array one (mixed) token prompt.
        if any(is_number(item) for item in prompt):
            return [tokenize_mixed(prompt, tokenizer)]
        return [_tokenize_one(item, tokenizer, media, f"prompt[{i}]") for i, item in enumerate(prompt)]
    return [_tokenize_one(prompt, tokenizer, media, "prompt")]


def _tokenize_one(prompt: Any, tokenizer: Any, media: Any, where: str) -> list[int]:
    if isinstance(prompt, str):
        return tokenizer.encode(prompt, add_special=True, parse_special=True)
    if isinstance(prompt, list):
        return tokenize_mixed(prompt, tokenizer)
    if isinstance(prompt, dict):
        return _tokenize_object(prompt, tokenizer, media, where)
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


def _tokenize_object(prompt: dict, tokenizer: Any, media: Any, where: str) -> list[int]:
    """`{prompt_string, multimodal_data: [base64, ...]}`: one image per media marker."""
    if media is None and prompt.get("multimodal_data"):
        raise invalid_request(NO_MULTIMODAL)
    text = prompt.get("prompt_string")
    if not isinstance(text, str):
        raise invalid_request(f'a "prompt" object needs a string "prompt_string" ({where})')
    if media is None:
        return tokenizer.encode(text, add_special=True, parse_special=True)
    data = prompt.get("multimodal_data", [])
    if not isinstance(data, list):
        raise field_error(f"{where}.multimodal_data", "must be an array of base64 strings")
    images = [base64_bytes(item, f"{where}.multimodal_data[{i}]") for i, item in enumerate(data)]
    return media.prompt(text, images, where)


def chat_prompt_tokens(text: str, body: dict, tokenizer: Any, media: Any = None) -> list[int]:
    """A rendered chat prompt's tokens; with a vision model, its images (the request's image
    parts, in message order: render_chat_prompt made each a media marker) at the markers."""
    if media is None:
        return tokenizer.encode(text, add_special=True, parse_special=True)
    try:
        parts = chat_media_parts(body["messages"])
        images = [media.url_bytes(image_url_of(part, where), where) for where, part in parts]
    except ChatTemplateError as exc:
        raise invalid_request(str(exc)) from None
    return media.prompt(text, images, "messages")
