"""Choosing a model's chat template, as llama-server does at start-up.

Precedence: `override` (`--chat-template NAME|JINJA`: a built-in name, otherwise Jinja source),
then `override_file` (`--chat-template-file`; giving both is an error), then the GGUF's
`tokenizer.chat_template`.

Fallback when the model has no template (e.g. the gemma-3-270m base model): the built-in "gemma"
template when `general.architecture` is gemma, gemma2 or gemma3, otherwise "chatml".
This deliberately differs from llama-server, which always falls back to ChatML: a Gemma model
prompted with ChatML markers sees tokens it was never trained on.

BOS/EOS text comes from `tokenizer.ggml.tokens` at `tokenizer.ggml.bos_token_id`/`eos_token_id`.
Whether the vocabulary adds BOS/EOS itself (so a template's own leading BOS is cut) comes from
`tokenizer.ggml.add_bos_token`/`add_eos_token`; when absent, BOS is assumed added only for
SentencePiece (`tokenizer.ggml.model == "llama"`) vocabularies, like llama.cpp's defaults.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lamplight.chat.builtin import BUILTIN_TEMPLATES
from lamplight.chat.errors import ChatTemplateError
from lamplight.chat.template import ChatTemplate

GEMMA_ARCHITECTURES = ("gemma", "gemma2", "gemma3")


def resolve_chat_template(metadata: dict, override: str | None = None,
                          override_file: str | None = None) -> ChatTemplate:
    """Return the ChatTemplate llama-server would use for a model with this GGUF metadata."""
    source, name = _choose_source(metadata, override, override_file)
    return ChatTemplate(
        source,
        bos_token=_token_text(metadata, "tokenizer.ggml.bos_token_id"),
        eos_token=_token_text(metadata, "tokenizer.ggml.eos_token_id"),
        name=name,
        add_bos=_adds_bos(metadata),
        add_eos=bool(metadata.get("tokenizer.ggml.add_eos_token", False)),
    )


def _choose_source(metadata: dict, override: str | None, override_file: str | None) -> tuple[str, str]:
    if override and override_file:
        raise ChatTemplateError("give either a chat template or a chat template file, not both")
    if override:
        return (BUILTIN_TEMPLATES[override], override) if override in BUILTIN_TEMPLATES else (override, "custom")
    if override_file:
        return _read_template_file(override_file), Path(override_file).name
    embedded = metadata.get("tokenizer.chat_template")
    if isinstance(embedded, str) and embedded.strip():
        return embedded, "gguf"
    fallback = "gemma" if metadata.get("general.architecture") in GEMMA_ARCHITECTURES else "chatml"
    return BUILTIN_TEMPLATES[fallback], fallback


def _read_template_file(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ChatTemplateError(f"cannot read chat template file {path}: {exc}") from exc


def _token_text(metadata: dict, id_key: str) -> str:
    tokens: Any = metadata.get("tokenizer.ggml.tokens")
    token_id = metadata.get(id_key)
    if tokens is None or token_id is None or not 0 <= int(token_id) < len(tokens):
        return ""
    return str(tokens[int(token_id)])


def _adds_bos(metadata: dict) -> bool:
    if "tokenizer.ggml.add_bos_token" in metadata:
        return bool(metadata["tokenizer.ggml.add_bos_token"])
    return metadata.get("tokenizer.ggml.model") == "llama"
