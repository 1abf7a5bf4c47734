"""`lamplight.load()`: a GGUF path or alias to a ready runner, tokenizer and chat template.

`build_runner` is the one place a backend is chosen (lamplight.runner.base lists them).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from .chat import ChatTemplate, resolve_chat_template
from .gguf.file import GGUFError, GGUFFile
from .models import define_model
from .models.lora import LoraAdapter, load_lora
from .models.spec import DecoderSpec
from .runner.base import ModelRunner
from .sources import ALIASES, resolve_model
from .tokenizer import Tokenizer

log = logging.getLogger("lamplight")

# What `load(backend=...)` takes: "fast" is the native forward where this machine has it, else
# PyTorch's fast kernels; the others name one backend.
BACKENDS = ("reference", "fast", "compiled", "native", "pytorch")


@dataclass
class LoadedModel:
    path: Path
    name: str  # what responses report as `model`: the alias given, else the file name
    gguf: GGUFFile
    spec: DecoderSpec
    runner: ModelRunner
    tokenizer: Tokenizer
    chat_template: ChatTemplate
    adapters: list[LoraAdapter] = field(default_factory=list)  # in load order: their ids

    @property
    def kernels(self) -> str:
        """What computes the model (start-up log, /props)."""
        return self.runner.describe()

    @property
    def file_type(self) -> int | None:
        """The GGUF's general.file_type (llama_ftype), as EmbeddingOnlyModel has it."""
        return self.gguf.metadata.get("general.file_type")


def load(
    spec: str | os.PathLike | None = None,
    *,
    backend: str = "reference",
    loras: Sequence[tuple[str, float]] = (),
    lora_init_without_apply: bool = False,
    chat_template: str | None = None,
    chat_template_file: str | None = None,
    progress: Callable[[str], None] | None = None,
    device: str = "cpu",
) -> LoadedModel:
    """Load a model by GGUF path or built-in alias (default: smollm2-135m-instruct).

    `backend="reference"` is the float32 reference path (dequantized weights, what the fidelity
    tests check); "fast" is the native forward pass on CPU (lamplight.native) where a C++
    compiler is available, else PyTorch's packed kernels; "compiled" adds torch.compile'd decode
    steps to PyTorch's. `loras`: LoRA adapter files with their scales (ids in this order).

    >>> m = lamplight.load("smollm2-135m-instruct")
    >>> ids = m.tokenizer.encode("Hello")
    """
    path = resolve_model(spec, progress=progress)
    gguf = GGUFFile(path)
    definition = define_model(gguf)  # first: an unsupported architecture is named before anything else fails
    tokenizer = Tokenizer.from_gguf(gguf)
    template = resolve_chat_template(gguf.metadata, chat_template, chat_template_file)
    adapters = load_adapters(loras, definition.config.architecture, lora_init_without_apply)
    runner = build_runner(definition, backend, device, adapters, progress)
    if runner.backend == "native":
        gguf.release_pages()  # repacked: the raw blocks are read again only for embedding rows
    name = os.fspath(spec) if spec is not None and os.fspath(spec) in ALIASES else path.name
    return LoadedModel(path, name, gguf, definition, runner, tokenizer, template, adapters)


def load_adapters(paths_and_scales: Sequence[tuple[str, float]], architecture: str,
                  init_without_apply: bool = False) -> list[LoraAdapter]:
    """LoRA adapters with their server-wide scales (0 for all with `init_without_apply`)."""
    adapters = []
    for path, scale in paths_and_scales:
        try:
            adapter = load_lora(path, architecture)
        except (OSError, ValueError) as exc:  # GGUFError is a ValueError
            raise AdapterError(f"failed to load LoRA adapter {path!r}: {exc}") from exc
        adapter.scale = 0.0 if init_without_apply else float(scale)
        adapters.append(adapter)
    return adapters


class AdapterError(ValueError):
    """A LoRA adapter that does not load, or does not fit the model."""


def build_runner(spec: DecoderSpec, backend: str = "reference", device: str = "cpu",
                 adapters: Sequence[LoraAdapter] = (), progress: Callable[[str], None] | None = None) -> ModelRunner:
    """The runner computing `spec` on `backend` (one of BACKENDS), with `adapters` attached.

    "fast" tries the native forward first; a model, adapter or machine it does not serve falls
    back to PyTorch's fast kernels, and the runner's description says why."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r} (use one of {', '.join(BACKENDS)})")
    if backend in ("fast", "native"):
        native, why_not = _native_runner(spec, device, adapters, progress)
        if native is not None:
            return native
        if backend == "native":
            raise RuntimeError(f"no native forward here: {why_not}")
        return _with_adapters(_torch_runner(spec, "pytorch", device, why_not), adapters)
    return _with_adapters(_torch_runner(spec, backend, device), adapters)


def _torch_runner(spec: DecoderSpec, backend: str, device: str, why_not_native: str | None = None) -> ModelRunner:
    if backend == "compiled":
        from .runner.compiled import CompiledRunner

        return CompiledRunner(spec, device)
    from .runner.torch_runner import TorchRunner

    return TorchRunner(spec, fast=backend == "pytorch", device=device, why_not_native=why_not_native)


def _with_adapters(runner: ModelRunner, adapters: Sequence[LoraAdapter]) -> ModelRunner:
    if adapters:
        try:
            runner.attach_loras(list(adapters))
        except GGUFError as exc:  # an adapter for weights the model does not have, or of other shapes
            raise AdapterError(f"a LoRA adapter does not fit the model: {exc}") from exc
    return runner


def _native_runner(spec: DecoderSpec, device: str, adapters: Sequence[LoraAdapter],
                   progress: Callable[[str], None] | None) -> tuple[ModelRunner | None, str | None]:
    """The native runner, or None and why not (no compiler, another device, a model or an
    adapter it does not compute)."""
    if device != "cpu":
        return None, f"device {device}"
    from .native import runtime
    from .native.prefetch import choose_one_row_reads
    from .native.runner import NativeRunner, NativeUnsupported

    lib = runtime.library(progress)
    if lib is None:
        return None, runtime.unavailable_reason()
    try:
        runner = _with_adapters(NativeRunner(spec, lib), adapters)
    except NativeUnsupported as exc:
        log.warning("no native forward for this model (%s): running on PyTorch's kernels", exc)
        return None, f"no native forward: {exc}"
    runner.one_row_reads = choose_one_row_reads(runner)
    return runner, None
