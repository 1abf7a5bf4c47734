"""Running the server: bind the port at once, load the model (and its LoRA adapters) in a
background thread (/health answers 503 meanwhile), then serve until interrupted."""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import uvicorn

from lamplight.serve_flags import MAX_DEFAULT_CTX, default_of

from .app import create_app
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
    # None: the runner's default (f16 native, as llama-server; else f32)
    cache_type_k: str | None = default_of("engine.cache_type_k")
    cache_type_v: str | None = default_of("engine.cache_type_v")


class StartupError(RuntimeError):
    """The server cannot start as asked (e.g. a LoRA adapter that does not load): a plain message."""


def load_model(model: Any, options: EngineOptions, **load_options) -> Any:
    """`lamplight.load` with the serve flags that decide the runner (--weights, --compile, the
    LoRA adapters); `load_options`: its other arguments (chat template, progress...)."""
    import lamplight
    from lamplight.loader import AdapterError

    backend = "reference" if options.weights == "reference" else "compiled" if options.compile else "fast"
    try:
        return lamplight.load(model, backend=backend, loras=options.loras,
                              lora_init_without_apply=options.lora_init_without_apply, **load_options)
    except AdapterError as exc:
        raise StartupError(str(exc)) from exc


def build_engine(loaded: Any, options: EngineOptions) -> Any:
    """The engine over a model from `load_model` (its runner and adapters), started."""
    from lamplight.engine.config import EngineConfig
    from lamplight.engine.engine import Engine

    runner = loaded.runner
    n_ctx = options.n_ctx or min(runner.config.n_ctx_train, MAX_DEFAULT_CTX)
    config = EngineConfig(n_ctx=n_ctx, n_parallel=options.n_parallel, n_batch=options.n_batch,
                          n_ubatch=options.n_ubatch, queue_size=options.queue_size,
                          context_shift=options.context_shift,
                          cache_type_k=options.cache_type_k or runner.default_cache_type,
                          cache_type_v=options.cache_type_v or runner.default_cache_type)
    if runner.owns_threads:
        dedicate_threads_to_native()
    engine = Engine(runner, loaded.tokenizer, config, loras=loaded.adapters)
    engine.start()
    return engine


def dedicate_threads_to_native() -> None:
    """The native forward runs on its own pool of -t threads; PyTorch's ops left to the engine
    (sampling) then run on one thread, so the two pools never compete for the cores (on 2 cores:
    a decode step 7.9-8.7 ms instead of 10.8-11.1 at one stream, 22-23 instead of 25 at 16)."""
    import torch

    torch.set_num_threads(1)


def uvicorn_server(state: ServerState) -> uvicorn.Server:
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
