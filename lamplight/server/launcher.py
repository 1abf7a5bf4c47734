"""Running the server: bind the port at once, load the model in a background thread (/health
answers 503 meanwhile), then serve until interrupted."""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable

import uvicorn

from .app import create_app
from .state import ServerState

MAX_DEFAULT_CTX = 4096  # `-c 0` takes the model's training context, but not more than this


@dataclass
class EngineOptions:
    n_ctx: int = 0  # 0: from the model (capped at MAX_DEFAULT_CTX)
    n_parallel: int = 4
    n_batch: int = 2048
    n_ubatch: int = 512
    queue_size: int = 64
    context_shift: bool = False


def build_engine(loaded: Any, options: EngineOptions) -> Any:
    from lamplight.engine.config import EngineConfig
    from lamplight.engine.engine import Engine

    n_ctx = options.n_ctx or min(loaded.model.config.n_ctx_train, MAX_DEFAULT_CTX)
    config = EngineConfig(n_ctx=n_ctx, n_parallel=options.n_parallel, n_batch=options.n_batch,
                          n_ubatch=options.n_ubatch, queue_size=options.queue_size,
                          context_shift=options.context_shift)
    engine = Engine(loaded.model, loaded.tokenizer, config)
    engine.start()
    return engine


def uvicorn_server(state: ServerState) -> uvicorn.Server:
    settings = state.settings
    config = uvicorn.Config(create_app(state), host=settings.host, port=settings.port, log_level="info",
                            server_header=False, timeout_keep_alive=int(min(settings.timeout, 3600)))
    return uvicorn.Server(config)


def serve(state: ServerState, load: Callable[[], tuple[Any, Any]], server: uvicorn.Server | None = None) -> int:
    """Serve `state`; `load()` runs in a background thread and returns (LoadedModel, Engine)."""
    server = server or uvicorn_server(state)
    failure: list[BaseException] = []

    def load_model() -> None:
        try:
            state.attach(*load())
        except BaseException as exc:  # report and stop the server: it can never become ready
            failure.append(exc)
            print(f"lamplight: error: failed to load the model: {exc}", file=sys.stderr)
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
