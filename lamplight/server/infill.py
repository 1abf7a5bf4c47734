"""/infill: llama.cpp's fill-in-the-middle prompt (`server-common.cpp:format_prompt_infill`).

With the repo-level FIM tokens when the model has them (https://arxiv.org/pdf/2409.12186):

    [FIM_REP]myproject\\n [FIM_SEP]{filename}\\n{text} ... [FIM_SEP]filename\\n
    [BOS] [FIM_PRE]{input_prefix}{prompt} [FIM_SUF]{input_suffix} [FIM_MID]

The request's `prompt` goes right after the prefix, before FIM_SUF (the README's "after
FIM_MID" is not what the code does). `--spm-infill` swaps the two parts: [FIM_SUF]suffix
[FIM_PRE]prefix prompt [FIM_MID]. Without FIM_SEP the extra chunks are joined by a
"--- snippet ---" line. As in llama-server, the prefix keeps at most 3/4 of `n_batch` tokens (its
end), the suffix what is left of the last quarter (its start), and the extra context only what
fits in `n_ctx - n_batch - 2 * n_predict` (its end, placed even before BOS).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import invalid_request
from .prompts import tokenize_mixed

CHUNK_SEPARATOR = "\n\n--- snippet ---\n\n"
REPO_NAME = "myproject\n"  # llama-server's fixed project name
CURRENT_FILE = "filename\n"  # llama-server's fixed name of the file being completed


@dataclass(frozen=True)
class FimTokens:
    prefix: int
    suffix: int
    middle: int
    repo: int | None
    sep: int | None


def fim_tokens(tokenizer: Any) -> FimTokens:
    """The model's FIM tokens; a 400 naming the missing ones when it cannot do infill."""
    prefix, suffix, middle = tokenizer.fim_prefix_id, tokenizer.fim_suffix_id, tokenizer.fim_middle_id
    missing = [name for name, token in (("prefix", prefix), ("suffix", suffix), ("middle", middle)) if token is None]
    if missing:
        raise invalid_request("Infill is not supported by this model: "
                              + " ".join(f"{name} token is missing." for name in missing))
    return FimTokens(prefix, suffix, middle, tokenizer.fim_rep_id, tokenizer.fim_sep_id)


@dataclass
class InfillInput:
    prefix: Any  # a string, or a list of token ids and strings
    suffix: Any
    extra: list[dict]  # [{"filename": str, "text": str}]
    prompt: str


def parse_infill_input(body: dict) -> InfillInput:
    """The infill fields, checked with llama-server's messages."""
    prompt = body.get("prompt")
    if prompt is not None and not isinstance(prompt, str):
        raise invalid_request('"prompt" must be a string')
    for name in ("input_prefix", "input_suffix"):
        if name not in body:
            raise invalid_request(f'"{name}" is required')
        if not isinstance(body[name], (str, list)):
            raise invalid_request(f'"{name}" must be a string or an array of token ids and strings')
    extra = body.get("input_extra")
    if extra is None:
        extra = []
    if not isinstance(extra, list):
        raise invalid_request('"input_extra" must be an array of {"filename": string, "text": string}')
    for chunk in extra:
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text"), str):
            raise invalid_request('extra_context chunk must contain a "text" field with a string value')
        if chunk.get("filename") is not None and not isinstance(chunk["filename"], str):
            raise invalid_request('extra_context chunk\'s "filename" field must be a string')
    return InfillInput(body["input_prefix"], body["input_suffix"], extra, prompt or "")


def format_infill_prompt(tokenizer: Any, fim: FimTokens, infill: InfillInput, *, n_batch: int, n_predict: int,
                         n_ctx: int, spm_infill: bool = False) -> list[int]:
    def plain(text: str) -> list[int]:
        return tokenizer.encode(text, add_special=False, parse_special=False)

    extra: list[int] = []
    if fim.repo is not None:
        extra += [fim.repo] + plain(REPO_NAME)
    for chunk in infill.extra:
        if fim.sep is not None:
            extra += [fim.sep] + plain((chunk.get("filename") or "tmp") + "\n")
        else:
            extra += plain(CHUNK_SEPARATOR)
        extra += plain(chunk["text"])
    if fim.sep is not None:
        extra += [fim.sep] + plain(CURRENT_FILE)

    prefix = _tokens(infill.prefix, tokenizer)
    suffix = _tokens(infill.suffix, tokenizer)
    prompt = tokenizer.encode(infill.prompt, add_special=False, parse_special=True)
    n_prefix_take = min(len(prefix), 3 * (n_batch // 4))
    n_suffix_take = min(len(suffix), max(0, n_batch // 4 - (2 + len(prompt))))
    n_extra_take = min(max(0, n_ctx - n_batch - 2 * n_predict), len(extra))

    prefix_part = [fim.prefix] + prefix[len(prefix) - n_prefix_take:] + prompt
    suffix_part = [fim.suffix] + suffix[:n_suffix_take]
    first, last = (suffix_part, prefix_part) if spm_infill else (prefix_part, suffix_part)
    if tokenizer.add_bos:
        first = [tokenizer.bos_id] + first
    return extra[len(extra) - n_extra_take:] + first + last + [fim.middle]


def _tokens(value: Any, tokenizer: Any) -> list[int]:
    if isinstance(value, str):
        return tokenizer.encode(value, add_special=False, parse_special=False)
    return tokenize_mixed(value, tokenizer, add_special=False, parse_special=False)
