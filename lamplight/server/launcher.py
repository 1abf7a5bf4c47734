"""Running the server: bind the port at once, load the model (and its LoRA adapters) in a
background thread (/health answers 503 meanwhile), then serve until interrupted."""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import uvicorn

from lamplight.serve_flags import MAX_DEFAULT_CTX, default_of

from .connections import timed_protocol
from .state import ServerState


@dataclass
class EngineOptions:
    """The engine's serve flags; the defaults are the flags' (lamplight.serve_flags)."""

    n_ctx: int = default_of("engine.n_ctx")  # 0: from the model (capped at MAX_DEFAULT_CTX)
    n_parallel: int = default_of("engine.n_parallel")
    n_batch: int = default_of("engine.n_batch")
    n_ubatch: int = default_of("engine.n_ubatch")
    queue_size: int = default_of("engine.queue_size")
    context_shift: bool = default_of("engine.context_shift")
    # LoRA adapters in load order (their ids): (path, scale) from `--lora` (scale 1) and
    # `--lora-scaled FNAME:SCALE`.
    loras: Sequence[tuple[str, float]] = default_of("engine.loras")
    lora_init_without_apply: bool = default_of("engine.lora_init_without_apply")  # every adapter starts at scale 0
    compile: bool = default_of("engine.compile")  # compile decode steps (torch.compile) at start-up
    # fast: the native forward, else PyTorch's fast kernels; reference: float32
    weights: str = default_of("engine.weights")
    # None: f16 on the native forward (llama-server's default), else f32
    cache_type_k: str | None = default_of("engine.cache_type_k")
    cache_type_v: str | None = default_of("engine.cache_type_v")


class StartupError(RuntimeError):
    """The server cannot start as asked (e.g. a LoRA adapter that does not load): a plain message."""


def load_adapters(paths_and_scales: Sequence[tuple[str, float]], architecture: str,
                  init_without_apply: bool = False) -> list:
    from lamplight.models.lora import load_lora

    adapters = []
    for path, scale in paths_and_scales:
        try:
            adapter = load_lora(path, architecture)
        except (OSError, ValueError) as exc:  # GGUFError is a ValueError
            raise StartupError(f"failed to load LoRA adapter {path!r}: {exc}") from exc
        adapter.scale = 0.0 if init_without_apply else float(scale)
        adapters.append(adapter)
    return adapters


def build_engine(loaded: Any, options: EngineOptions) -> Any:
    from lamplight.engine.config import EngineConfig
    from lamplight.engine.engine import Engine
    from lamplight.gguf.file import GGUFError

    n_ctx = options.n_ctx or min(loaded.model.config.n_ctx_train, MAX_DEFAULT_CTX)
    config = EngineConfig(n_ctx=n_ctx, n_parallel=options.n_parallel, n_batch=options.n_batch,
                          n_ubatch=options.n_ubatch, queue_size=options.queue_size,
                          context_shift=options.context_shift, compile=options.compile,
                          cache_type_k=options.cache_type_k or default_cache_type(loaded.model),
                          cache_type_v=options.cache_type_v or default_cache_type(loaded.model))
    loras = load_adapters(options.loras, loaded.model.config.architecture, options.lora_init_without_apply)
    if getattr(loaded.model, "native", None) is not None and not options.compile:
        dedicate_threads_to_native()  # --compile moves the model to PyTorch's kernels, which need them
    try:
        engine = Engine(loaded.model, loaded.tokenizer, config, loras=loras)
    except GGUFError as exc:  # an adapter for weights the model does not have, or of other shapes
        raise StartupError(f"a LoRA adapter does not fit the model: {exc}") from exc
    engine.start()
    return engine


def dedicate_threads_to_native() -> None:
    """The native forward runs on its own pool of -t threads; PyTorch's ops left to the engine
    (sampling) then run on one thread, so the two pools never compete for the cores (on 2 cores:
    a decode step 7.9-8.7 ms instead of 10.8-11.1 at one stream, 22-23 instead of 25 at 16)."""
    import torch

    torch.set_num_threads(1)


def default_cache_type(model: Any) -> str:
    """f16, llama-server's default, where attention reads it at full speed (the native forward
    converts 8 values per instruction); f32 on PyTorch's CPU kernels, where converting the
    gathered keys back cost 2.5x the gather."""
    return "f16" if getattr(model, "native", None) is not None else "f32"


def memory_budget(loaded: Any, engine: Any) -> dict[str, float]:
    """Resident memory by purpose, in MiB: the weights the model computes with, the KV cache,
    and (native forward) the step's working buffers so far."""
    native = getattr(loaded.model, "native", None)
    weights = native.weight_bytes() if native is not None else sum(
        t.numel() * t.element_size() for t in loaded.model.state_dict().values())
    cache = engine.cache
    kv = sum(t.numel() * t.element_size() for t in (*cache.k, *cache.v))
    budget = {"weights": weights, "kv_cache": kv}
    if native is not None:
        budget["scratch"] = native.scratch_bytes()
    return {name: round(size / 2**20, 1) for name, size in budget.items()}


def memory_line(loaded: Any, engine: Any) -> str:
    budget = memory_budget(loaded, engine)
    scratch = f", scratch {budget['scratch']:.0f} MiB so far" if "scratch" in budget else ""
    return f"weights {budget['weights']:.0f} MiB, KV cache {budget['kv_cache']:.0f} MiB{scratch}"


def uvicorn_server(state: ServerState) -> uvicorn.Server:
    from .app import create_app  # here, not at the top: routes_misc imports this module

    settings = state.settings
    config = uvicorn.Config(create_app(state), host=settings.host, port=settings.port, log_level="info",
                            server_header=False, **connection_options(settings))
    return uvicorn.Server(config)


def connection_options(settings) -> dict:
    """uvicorn.Config options for the connection timeouts (see connections.py)."""
    return {"http": timed_protocol(settings.timeout), "timeout_keep_alive": settings.idle_timeout}


def serve(state: ServerState, load: Callable[[], tuple[Any, Any]], server: uvicorn.Server | None = None) -> int:
    """Serve `state`; `load()` runs in a background thread and returns (LoadedModel, Engine)."""
    server = server or uvicorn_server(state)
    failure: list[BaseException] = []

    def load_model() -> None:
        try:
            state.attach(*load())
        except BaseException as exc:  # report and stop the server: it can never become ready
            failure.append(exc)
            reason = str(exc) if isinstance(exc, StartupError) else f"failed to load the model: {exc}"
            print(f"lamplight: error: {reason}", file=sys.stderr)
            server.should_exit = True

    loader = threading.Thread(target=load_model, name="lamplight-loader", daemon=True)
    loader.start()
    try:
        server.run()
    except KeyboardInterrupt:
        pass  # uvicorn re-raises Ctrl-C after its graceful shutdown: a normal way to stop
    finally:
        if state.engine is not None:
            state.engine.stop()
    return 1 if failure else 0
