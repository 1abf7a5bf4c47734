"""`lamplight.load()`: a GGUF path or alias to a ready model, tokenizer and chat template."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .chat import ChatTemplate, resolve_chat_template
from .gguf.file import GGUFFile
from .kernels.fast_path import use_fast_path
from .models import CausalLM, load_model
from .sources import ALIASES, resolve_model
from .tokenizer import Tokenizer


@dataclass
class LoadedModel:
    path: Path
    name: str  # what responses report as `model`: the alias given, else the file name
    gguf: GGUFFile
    model: CausalLM
    tokenizer: Tokenizer
    chat_template: ChatTemplate


def load(
    spec: str | os.PathLike | None = None,
    *,
    chat_template: str | None = None,
    chat_template_file: str | None = None,
    progress: Callable[[str], None] | None = None,
    fast: bool = False,
    device: str = "cpu",
) -> LoadedModel:
    """Load a model by GGUF path or built-in alias (default: smollm2-135m-instruct).

    `fast=False` is the float32 reference path (dequantized weights, what the fidelity tests
    check); `fast=True` packs weights for speed (see lamplight.kernels.fast_path).

    >>> m = lamplight.load("smollm2-135m-instruct")
    >>> ids = m.tokenizer.encode("Hello")
    """
    path = resolve_model(spec, progress=progress)
    gguf = GGUFFile(path)
    tokenizer = Tokenizer.from_gguf(gguf)
    template = resolve_chat_template(gguf.metadata, chat_template, chat_template_file)
    model = load_model(gguf)
    if fast:
        use_fast_path(model, device)
    if device != "cpu":
        model.to(device)
    name = os.fspath(spec) if spec is not None and os.fspath(spec) in ALIASES else path.name
    return LoadedModel(path, name, gguf, model, tokenizer, template)
