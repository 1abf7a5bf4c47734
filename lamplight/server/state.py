"""What the HTTP layer serves: the loaded model and its engine, once loading has finished."""

from __future__ import annotations

import threading

from typing import Any

from .errors import model_loading, not_supported
from .metrics import ServerMetrics
from .settings import ServerSettings


class ServerState:
    """Shared by every handler. Empty while the model loads (then /health answers 503)."""

    def __init__(self, settings: ServerSettings | None = None):
        self.settings = settings or ServerSettings()
        self.model: Any = None  # lamplight.loader.LoadedModel
        self.engine: Any = None  # lamplight.engine.engine.Engine; None for a model that only embeds
        self.embedder: Any = None  # lamplight.embeddings.Embedder (--embedding, --reranking, encoder models)
        self.reranking = False  # started with --reranking (the embedder then scores with its rank head)
        self.metrics = ServerMetrics()
        self._grammar_compiler = None
        self._grammar_lock = threading.Lock()

    def attach(self, model: Any, engine: Any, embedder: Any = None, reranking: bool = False) -> None:
        self.model = model
        self.embedder = embedder
        self.reranking = reranking
        self.engine = engine
        self.metrics.engine = engine

    @property
    def ready(self) -> bool:
        if self.engine is None:
            return self.embedder is not None  # an encoder: embeddings only
        return bool(getattr(self.engine, "is_ready", True))

    @property
    def media(self) -> Any:
        """The image input (lamplight.server.media.MediaInput) of a model loaded with a
        projector (launcher.load_model attaches it), else None."""
        return getattr(self.model, "media", None)

    @property
    def model_name(self) -> str:
        if self.settings.alias:
            return self.settings.alias.split(",")[0]
        return self.model.name if self.model is not None else ""

    @property
    def aliases(self) -> list[str]:
        if self.settings.alias:
            return [a for a in self.settings.alias.split(",") if a]
        return [self.model_name]

    @property
    def tokenizer(self) -> Any:
        """The model's tokenizer, also of a model that only embeds (/tokenize works there, as in
        llama-server)."""
        self.require_loaded()
        return self.model.tokenizer

    def grammar_compiler(self):
        """The model's GrammarCompiler, built on the first constrained request (about a second
        for a 262k vocabulary) and shared after that."""
        with self._grammar_lock:
            if self._grammar_compiler is None:
                from ..grammar import GrammarCompiler

                self._grammar_compiler = GrammarCompiler(self.model.tokenizer)
            return self._grammar_compiler

    def require_loaded(self) -> None:
        """The model has loaded (a generating model or an embedding-only one)."""
        if not self.ready:
            raise model_loading()

    def require_ready(self) -> None:
        """Before generating: the model is loaded and can generate."""
        self.require_loaded()
        if self.engine is None:
            raise not_supported(f"{self.model_name} computes embeddings only (/v1/embeddings, /embedding"
                                f"{', /rerank' if self.reranking else ''}): it cannot generate text")
