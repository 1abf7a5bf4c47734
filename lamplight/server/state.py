"""What the HTTP layer serves: the loaded model and its engine, once loading has finished."""

from __future__ import annotations

import threading

from typing import Any

from .errors import model_loading
from .metrics import ServerMetrics
from .settings import ServerSettings


class ServerState:
    """Shared by every handler. Empty while the model loads (then /health answers 503)."""

    def __init__(self, settings: ServerSettings | None = None):
        self.settings = settings or ServerSettings()
        self.model: Any = None  # lamplight.loader.LoadedModel
        self.engine: Any = None  # lamplight.engine.engine.Engine
        self.metrics = ServerMetrics()
        self._grammar_compiler = None
        self._grammar_lock = threading.Lock()

    def attach(self, model: Any, engine: Any) -> None:
        self.model = model
        self.engine = engine
        self.metrics.engine = engine

    @property
    def ready(self) -> bool:
        return self.engine is not None and bool(getattr(self.engine, "is_ready", True))

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
        self.require_ready()
        return self.model.tokenizer

    def grammar_compiler(self):
        """The model's GrammarCompiler, built on the first constrained request (about a second
        for a 262k vocabulary) and shared after that."""
        with self._grammar_lock:
            if self._grammar_compiler is None:
                from ..grammar import GrammarCompiler

                self._grammar_compiler = GrammarCompiler(self.model.tokenizer)
            return self._grammar_compiler

    def require_ready(self) -> None:
        if not self.ready:
            raise model_loading()
