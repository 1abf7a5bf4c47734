"""`lamplight.load()`: a GGUF path or alias to a ready model, tokenizer and chat template."""

from __future__ import annotations

import logging
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

log = logging.getLogger("lamplight")


@dataclass
class LoadedModel:
    path: Path
    name: str  # what responses report as `model`: the alias given, else the file name
    gguf: GGUFFile
    model: CausalLM
    tokenizer: Tokenizer
    chat_template: ChatTemplate
    kernels: str = "pytorch reference"  # what computes the model (start-up log, /props)


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
    check); `fast=True` is the native forward pass on CPU (lamplight.native) where a C++ compiler
    is available, else PyTorch's packed kernels (lamplight.kernels.fast_path).

    >>> m = lamplight.load("smollm2-135m-instruct")
    >>> ids = m.tokenizer.encode("Hello")
    """
    path = resolve_model(spec, progress=progress)
    gguf = GGUFFile(path)
    model = load_model(gguf)  # first: an unsupported architecture is named before anything else fails
    tokenizer = Tokenizer.from_gguf(gguf)
    template = resolve_chat_template(gguf.metadata, chat_template, chat_template_file)
    kernels = "pytorch reference"
    if fast:
        why_not = attach_native(model, progress) if device == "cpu" else f"device {device}"
        kernels = model.native.describe() if model.native is not None else f"pytorch fast ({why_not})"
        if model.native is None:
            use_fast_path(model, device)
        else:
            gguf.release_pages()  # repacked: the raw blocks are read again only for embedding rows
    if device != "cpu":
        model.token_embd  # materialised here so that .to() moves it
        model.to(device)
    name = os.fspath(spec) if spec is not None and os.fspath(spec) in ALIASES else path.name
    return LoadedModel(path, name, gguf, model, tokenizer, template, kernels)


def attach_native(model: CausalLM, progress: Callable[[str], None] | None = None) -> str | None:
    """Give `model` the native forward pass if this machine has it; else say why not."""
    from .native import runtime
    from .native.runner import NativeModel, NativeUnsupported

    lib = runtime.library(progress)
    if lib is None:
        return runtime.unavailable_reason()
    try:
        model.native = NativeModel(model, lib)
    except NativeUnsupported as exc:
        log.warning("no native forward for this model (%s): running on PyTorch's kernels", exc)
        return f"no native forward: {exc}"
    return None
