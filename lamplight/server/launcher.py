"""Running the server: bind the port at once, load the model (and its LoRA adapters) in a
background thread (/health answers 503 meanwhile), then serve until interrupted."""

from __future__ import annotations

import os
import stat
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import uvicorn

from lamplight.serve_flags import CTX_MEMORY_SHARE, default_of
from lamplight.speculative import SpecConfig
from lamplight.threads import set_torch_threads

from .app import create_app
from .connections import timed_protocol
from .state import ServerState


@dataclass
class EngineOptions:
    """The engine's serve flags; the defaults are the flags' (lamplight.serve_flags)."""

    n_ctx: int = default_of("engine.n_ctx")  # 0: from the model (context_from_model)
    n_parallel: int = default_of("engine.n_parallel")
    # One KV pool for the slots: on, as with the default -np auto (the command line decides: serve_options)
    kv_unified: bool = True
    cache_ram_mib: int = default_of("engine.cache_ram_mib")  # the RAM prompt cache's budget (0: off, -1: no limit)
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
    # recurrent models' state snapshots per slot, and the tokens between two (lamplight.engine.checkpoints)
    ctx_checkpoints: int = default_of("engine.ctx_checkpoints")
    checkpoint_interval: int = default_of("engine.checkpoint_interval")
    embedding: bool = default_of("engine.embedding")  # serve embeddings (lamplight.embeddings)
    pooling: str | None = default_of("engine.pooling")  # None: the model file's
    reranking: bool = default_of("engine.reranking")  # serve /rerank (pooling rank)
    # Images (lamplight.server.media): the projector, and where images may come from.
    mmproj: str | None = default_of("engine.mmproj")
    no_mmproj: bool = default_of("engine.no_mmproj")
    mmproj_auto: bool = default_of("engine.mmproj_auto")  # a model from -hf: its repository's mmproj too
    image_min_tokens: int = default_of("engine.image_min_tokens")  # -1: the projector's
    image_max_tokens: int = default_of("engine.image_max_tokens")
    media_path: str | None = default_of("engine.media_path")
    media_allow_urls: bool = default_of("engine.media_allow_urls")
    speculative: SpecConfig = SpecConfig()  # --spec-type and its sizes (lamplight.speculative)


class StartupError(RuntimeError):
    """The server cannot start as asked (e.g. a LoRA adapter that does not load): a plain message."""


def load_model(model: Any, options: EngineOptions, **load_options) -> Any:
    """`lamplight.load` with the serve flags that decide the runner (--weights, --compile, the
    LoRA adapters); `load_options`: its other arguments (chat template, progress...)."""
    import lamplight
    from lamplight.loader import AdapterError

    backend = "reference" if options.weights == "reference" else "compiled" if options.compile else "fast"
    try:
        loaded = lamplight.load(model, backend=backend, loras=options.loras,
                                lora_init_without_apply=options.lora_init_without_apply, **load_options)
    except AdapterError as exc:
        raise StartupError(str(exc)) from exc
    say = load_options.get("progress") or (lambda _msg: None)
    # The server's image input (ServerState.media), or None: beside the text model it reads.
    loaded.media = load_media(loaded, options, say)
    # The draft model of speculative decoding (-md), or None.
    loaded.draft = load_draft_model(loaded, options.speculative.draft_model, backend, say)
    return loaded


def load_draft_model(loaded: Any, path: str | None, backend: str, say: Callable[[str], None]) -> Any:
    """The draft model at `path` on the model's backend, checked to share its vocabulary (as
    llama-server checks it) and to be able to take back a rejected draft; None without a path."""
    if path is None:
        return None
    import lamplight
    from lamplight.gguf.file import GGUFError
    from lamplight.sources import ModelSourceError
    from lamplight.speculative.compat import vocab_mismatch

    try:
        draft = lamplight.load(path, backend=backend)
    except (GGUFError, ModelSourceError, OSError, ValueError) as exc:
        raise StartupError(f"-md {path}: {exc}") from exc
    problem = vocab_mismatch(loaded.tokenizer, draft.tokenizer)
    if problem is not None:
        raise StartupError(f"-md {path}: the draft model's vocabulary must be the model's: {problem}")
    if draft.spec.state_spec.recurrent:
        raise StartupError(f"-md {path}: the draft model has recurrent layers, whose state cannot take back a "
                           "rejected draft")
    say(f"draft model: {draft.name}: {draft.kernels}")
    return draft


def load_media(loaded: Any, options: EngineOptions, say: Callable[[str], None]) -> Any:
    """The MediaInput of --mmproj (or, for a model from -hf, its repository's mmproj with
    --mmproj-auto), checked against the text model; None without a projector."""
    path = None if options.no_mmproj else options.mmproj or (hub_mmproj(loaded.path, say) if options.mmproj_auto
                                                             else None)
    if path is None:
        return None
    from lamplight.gguf.file import GGUFError
    from lamplight.vision import load_vision_model

    from .media import MediaInput, MediaOptions

    tokenizer = loaded.tokenizer
    try:
        vision = load_vision_model(path, text_n_embd=loaded.spec.config.n_embd,
                                   tokenize=lambda text: tokenizer.encode(text, add_special=False, parse_special=True))
    except (GGUFError, OSError) as exc:
        raise StartupError(f"--mmproj: {exc}") from exc
    config = vision.config
    say(f"vision: {Path(path).name}: {config.projector_type} projector, {config.n_layer} blocks of width "
        f"{config.n_embd} at {config.image_size} px; encoder memory {vision.weight_bytes / 2**20:.1f} MiB "
        "(float32 weights)")
    if options.image_min_tokens >= 0 or options.image_max_tokens >= 0:
        say(f"--image-min-tokens / --image-max-tokens: the {config.projector_type} projector lays every image out "
            "in a fixed number of positions; they take effect only for projector types that resize to a token budget")
    import torch

    # The threads PyTorch has now (-t, set before loading), before the native runner's engine
    # keeps it at one (dedicate_threads_to_native): the encoder's.
    return MediaInput(vision, tokenizer, MediaOptions(options.media_path, options.media_allow_urls,
                                                      threads=torch.get_num_threads()))


def hub_mmproj(model_path: str | Path, say: Callable[[str], None]) -> Path | None:
    """The mmproj of a model file in huggingface_hub's cache (a model from -hf): fetched from its
    repository if it has one (media_hub.choose_mmproj), else None."""
    from .media_hub import cached_repo_of, resolve_hf_mmproj

    repo = cached_repo_of(model_path)
    return resolve_hf_mmproj(repo, Path(model_path).name, progress=say) if repo else None


# Architectures that only compute vectors (no generation): served with embeddings alone.
EMBEDDING_ONLY_ARCHITECTURES = ("bert", "nomic-bert", "gemma-embedding")


@dataclass(frozen=True)
class EmbeddingOnlyModel:
    """What the server knows of a model that only embeds (an encoder): no runner, no engine."""

    path: Path
    name: str
    tokenizer: Any
    chat_template: Any = None
    kernels: str = "pytorch float32 encoder"
    file_type: int | None = None  # the GGUF's general.file_type (/props model_ftype)


def embeds_only(path: str | Path) -> bool:
    from lamplight.gguf.file import GGUFFile

    return GGUFFile(path).architecture in EMBEDDING_ONLY_ARCHITECTURES


def wants_embedder(options: EngineOptions) -> bool:
    return options.embedding or options.reranking or options.pooling is not None


# How long an embedding step may wait for the engine's thread (its steps come first).
EMBED_STEP_TIMEOUT = 600.0


def load_embedder(path: str | Path, options: EngineOptions, n_ctx: int | None = None, engine: Any = None) -> Any:
    """The embedder the embedding flags ask for (--reranking: pooling rank). With the generating
    model's `engine` it computes on the engine's own runner (no second copy of the weights),
    between the engine's steps, where that runner can be lent (embeddings.decoders.why_not_shared),
    else on its own copy on the same backend; without one (an embedding-only model) on the
    kernels --weights asks for (fast: native where the architecture has a native forward)."""
    from lamplight.embeddings import load_embedder as load
    from lamplight.embeddings.decoders import ServedRunner

    pooling = "rank" if options.reranking else options.pooling
    served = None
    if engine is not None:
        served = ServedRunner(engine.runner, lambda fn: engine.call_on_engine(fn, timeout=EMBED_STEP_TIMEOUT))
        backend = {"compiled": "pytorch"}.get(engine.runner.backend, engine.runner.backend)
    else:
        backend = "reference" if options.weights == "reference" else "fast"
    try:
        return load(path, pooling=pooling, backend=backend, n_ctx=n_ctx, n_ubatch=options.n_ubatch, served=served)
    except ValueError as exc:  # e.g. --pooling rank on a file without a ranking head
        raise StartupError(f"embeddings: {exc}") from exc


def build_engine(loaded: Any, options: EngineOptions, say: Callable[[str], None] = lambda _msg: None) -> Any:
    """The engine over a model from `load_model` (its runner and adapters), started; `say`: the
    start-up log."""
    from lamplight.engine.config import EngineConfig
    from lamplight.engine.engine import Engine

    runner = loaded.runner
    config = EngineConfig(n_ctx=options.n_ctx, n_parallel=options.n_parallel, n_batch=options.n_batch,
                          n_ubatch=options.n_ubatch, queue_size=options.queue_size,
                          kv_unified=bool(options.kv_unified),
                          cache_ram_mib=options.cache_ram_mib, context_shift=options.context_shift,
                          cache_type_k=options.cache_type_k or runner.default_cache_type,
                          cache_type_v=options.cache_type_v or runner.default_cache_type,
                          ctx_checkpoints=options.ctx_checkpoints, checkpoint_interval=options.checkpoint_interval,
                          speculative=options.speculative)
    if not config.n_ctx:
        config.n_ctx, why = context_from_model(runner, config)
        say(f"context: {config.n_ctx} tokens ({why}; -c sets it)")
    if runner.owns_threads:
        dedicate_threads_to_native()
    draft = getattr(loaded, "draft", None)
    engine = Engine(runner, loaded.tokenizer, config, loras=loaded.adapters,
                    draft_runner=draft.runner if draft is not None else None)
    if config.speculative.enabled:
        say(f"speculative decoding: {config.speculative.types_text()}" if engine.speculation is not None else
            "speculative decoding: off (this model has recurrent layers, whose state cannot take back rejected drafts)")
    engine.start()
    return engine


def context_from_model(runner: Any, config: Any) -> tuple[int, str]:
    """`-c 0`: the model's training context, cut to what fits in CTX_MEMORY_SHARE of the memory
    available now (a multiple of the KV block), and why it is that."""
    from lamplight.engine.engine import available_memory_bytes

    trained = runner.config.n_ctx_train
    per_token = runner.state_spec.bytes_per_token(*config.cache_dtypes)
    free = available_memory_bytes(config.device)
    if not per_token or free is None or trained * per_token <= free * CTX_MEMORY_SHARE:
        return trained, "the model's training context"
    fits = int(free * CTX_MEMORY_SHARE // per_token) // config.block_size * config.block_size
    fits = max(fits, config.block_size * config.n_parallel)
    return fits, (f"the model's {trained} cut to what fits in {CTX_MEMORY_SHARE:.0%} of the {free / 2**30:.1f} GiB "
                  f"available, at {per_token / 1024:.0f} KiB per token")


def dedicate_threads_to_native() -> None:
    """The native forward runs on its own pool of -t threads; PyTorch's ops left to the engine
    then run on one thread, so the two pools never compete for the cores (on 2 cores:
    a decode step 7.9-8.7 ms instead of 10.8-11.1 at one stream, 22-23 instead of 25 at 16).
    Where torch is not imported, it gets the one thread when a feature imports it."""
    set_torch_threads(1)


def uvicorn_server(state: ServerState) -> uvicorn.Server:
    settings = state.settings
    config = uvicorn.Config(create_app(state), log_level=settings.log_level,
                            access_log=settings.log_level in ("info", "debug"), server_header=False,
                            **listen_options(settings), **connection_options(settings))
    return uvicorn.Server(config)


def listen_options(settings) -> dict:
    """uvicorn.Config options for where to listen: host and port, or a UNIX socket (a --host
    ending in .sock, as llama-server); HTTPS with --ssl-key-file and --ssl-cert-file."""
    where = {"uds": settings.unix_socket} if settings.unix_socket else {"host": settings.host, "port": settings.port}
    if settings.ssl_certfile:
        where.update(ssl_keyfile=settings.ssl_keyfile, ssl_certfile=settings.ssl_certfile)
    return where


def connection_options(settings) -> dict:
    """uvicorn.Config options for the connection timeouts (see connections.py)."""
    return {"http": timed_protocol(settings.timeout), "timeout_keep_alive": settings.idle_timeout}


def serve(state: ServerState, load: Callable[[], tuple[Any, Any]], server: uvicorn.Server | None = None) -> int:
    """Serve `state`; `load()` runs in a background thread and returns what ServerState.attach
    takes: (LoadedModel, Engine[, Embedder, reranking])."""
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
        _remove_socket(state.settings.unix_socket)
    return 1 if failure else 0


def _remove_socket(path: str | None) -> None:
    """A UNIX socket's file outlives its server; nothing listens on it any more."""
    if path and os.path.exists(path) and stat.S_ISSOCK(os.stat(path).st_mode):
        os.remove(path)
