"""Building runners and paged state the way the engine does, for the model-level tests."""

from __future__ import annotations

import os

import torch

from lamplight.engine.kv_cache import KVCache
from lamplight.gguf.file import GGUFFile
from lamplight.loader import build_runner
from lamplight.models import define_model
from lamplight.runner.base import ModelRunner
from lamplight.state import ModelState


def runner_for(source: GGUFFile | str | os.PathLike, backend: str = "reference", **kwargs) -> ModelRunner:
    """A file's runner on `backend` (lamplight.loader.BACKENDS)."""
    gguf = source if isinstance(source, GGUFFile) else GGUFFile(source)
    return build_runner(define_model(gguf), backend, **kwargs)


def engine_model(name: str, folder) -> tuple[ModelRunner, "Tokenizer"]:
    """(runner, tokenizer) for the engine tests' model parameters: "llama-reference" and
    "llama-native" (a tiny random llama written into `folder`), "qwen35-native" (the hybrid
    reference file); skips a native one where the library cannot be had."""
    import pytest
    from conftest import reference_path
    from tiny_gguf import write_tiny_llama

    from lamplight.native import runtime
    from lamplight.tokenizer import Tokenizer

    arch, _, backend = name.partition("-")
    if backend == "native" and runtime.library() is None:
        pytest.skip(f"no native library: {runtime.unavailable_reason()}")
    path = write_tiny_llama(folder / "tiny.gguf", n_ctx=512) if arch == "llama" else reference_path("archs2/qwen35.gguf")
    gguf = GGUFFile(path)
    return runner_for(gguf, backend), Tokenizer.from_gguf(gguf)


def paged_state(runner: ModelRunner, num_blocks: int, block_size: int, dtype: torch.dtype = torch.float32,
                v_dtype: torch.dtype | None = None) -> tuple[ModelState, KVCache]:
    """State for num_blocks blocks and the engine's block view of it (for BlockTables)."""
    state = runner.new_state(num_blocks * block_size, dtype, v_dtype)
    return state, KVCache(state.kv, block_size)
