"""What goes into the engine (a request) and what comes out (a stream of events)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Sequence

from ..sampling import SamplingParams, TokenProbs

# Media rows take prompt positions whose token ids are placeholders: negative, so that no
# vocabulary id is one, and derived from the media's content, so that the prefix cache (which
# compares token ids) hits for the same image again and misses for another one.
_ROW_BITS = 20  # rows per media span: up to 2^20


def placeholder_ids(content_hash: str, n_rows: int) -> list[int]:
    """The placeholder token ids of a media span's rows: unique per (content, row)."""
    if n_rows > 1 << _ROW_BITS:
        raise ValueError(f"a media span of {n_rows} rows is more than {1 << _ROW_BITS}")
    key = int.from_bytes(hashlib.sha256(content_hash.encode()).digest()[:5], "big")  # 40 bits
    base = key << _ROW_BITS
    return [-1 - (base | row) for row in range(n_rows)]


def is_placeholder(token_id: int) -> bool:
    return token_id < 0


@dataclass(frozen=True, eq=False)
class MediaSpan:
    """Rows that replace token embeddings at prompt positions [start, start + n_rows): an
    image's projector output (lamplight.vision). `non_causal`: the rows attend to each other
    both ways (gemma3), so they are always computed in one chunk."""

    start: int
    rows: Any  # torch.Tensor float32 [n_rows, n_embd]
    non_causal: bool
    content_hash: str

    @property
    def n_rows(self) -> int:
        return int(self.rows.shape[0])

    @property
    def end(self) -> int:
        return self.start + self.n_rows


class EngineError(RuntimeError):
    """Base of the errors the engine reports to callers."""


class QueueFullError(EngineError):
    """The waiting queue is at --queue-size: the server answers 503."""


class ContextExceededError(EngineError):
    """The prompt does not fit the slot's context: the server answers 400 exceed_context_size_error."""

    def __init__(self, n_prompt_tokens: int, n_ctx: int):
        super().__init__(
            f"request ({n_prompt_tokens} tokens) exceeds the available context size ({n_ctx} tokens), try increasing it"
        )
        self.n_prompt_tokens = n_prompt_tokens
        self.n_ctx = n_ctx


class InvalidRequestError(EngineError):
    """A request the engine cannot run as asked (e.g. `id_slot` out of range): 400."""


@dataclass(frozen=True)
class GenerationRequest:
    """One prompt to run: built whole (the server: lamplight.server.params, then
    dataclasses.replace for what later steps add), never changed afterwards."""

    prompt_tokens: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    n_predict: int = -1  # -1: until EOS or the context is full; 0: evaluate the prompt only
    stop: Sequence[str] = ()
    cache_prompt: bool = True
    id_slot: int = -1
    n_choices: int = 1
    return_progress: bool = False
    n_indent: int = 0
    n_keep: int = 0  # tokens of the prompt kept on context shift (-1: all of it)
    n_discard: int = 0  # tokens dropped per context shift (0: half of what follows n_keep)
    # Per-request LoRA scales as (adapter id, scale); adapters not listed get 0. None: the server's.
    lora: list[tuple[int, float]] | None = None
    t_max_predict_ms: float = -1.0
    # Constrained decoding (lamplight.grammar.CompiledGrammar): each choice gets its own matcher.
    grammar: Any = None
    # The reasoning budget (lamplight.sampling.ReasoningBudgetSpec): each choice gets its own
    # state machine, which forces the end of its first thinking block once the budget is spent.
    reasoning_budget: Any = None
    # DRY's sequence breakers as a lamplight.sampling.dry.BreakerTable, built before submitting
    # (it walks the vocabulary); None: the engine builds it when the request starts.
    dry_breakers: Any = None
    # The request's effective parameters as the server reports them (generation_settings); the
    # engine only echoes them in /slots.
    settings: dict | None = None
    # Image rows at prompt positions, in position order; prompt_tokens holds their placeholder
    # ids (placeholder_ids) there.
    media: tuple[MediaSpan, ...] = ()
    # The request's speculative.* fields (lamplight.speculative.SpecRequest); None: the server's.
    speculative: Any = None


@dataclass(frozen=True)
class PromptProgress:
    choice: int
    total: int
    cache: int
    processed: int
    time_ms: float


@dataclass(frozen=True)
class TokenEvent:
    """One generated token. `text` is what became safe to show with it (may be empty while held back)."""

    choice: int
    token_id: int
    text: str
    n_decoded: int
    prob: TokenProbs | None = None  # when n_probs > 0 (lamplight.sampling.TokenProbs)
    timings: "Timings | None" = None  # the choice's timings so far (for timings_per_token)


@dataclass(frozen=True)
class Timings:
    cache_n: int
    prompt_n: int
    prompt_ms: float
    predicted_n: int
    predicted_ms: float
    draft_n: int = 0  # tokens drafted by speculative decoding, and those accepted
    draft_n_accepted: int = 0

    def to_json(self) -> dict:
        def per_token(ms: float, n: int) -> float:
            return ms / n if n > 0 else 0.0

        def per_second(ms: float, n: int) -> float:
            return 1e3 * n / ms if ms > 0 and n > 0 else 0.0

        # As llama-server (HEAD): the first token comes from the prompt batch, so generation rates
        # are over n - 1 decode steps, measured from the end of the prompt to the last token.
        decode_steps = max(self.predicted_n - 1, 0)
        drafts = {"draft_n": self.draft_n, "draft_n_accepted": self.draft_n_accepted} if self.draft_n > 0 else {}
        return {
            "cache_n": self.cache_n,
            "prompt_n": self.prompt_n,
            "prompt_ms": self.prompt_ms,
            "prompt_per_token_ms": per_token(self.prompt_ms, self.prompt_n),
            "prompt_per_second": per_second(self.prompt_ms, self.prompt_n),
            "predicted_n": self.predicted_n,
            "predicted_ms": self.predicted_ms,
            "predicted_per_token_ms": per_token(self.predicted_ms, decode_steps),
            "predicted_per_second": per_second(self.predicted_ms, decode_steps),
            **drafts,  # as llama-server: only when speculation drafted tokens
        }


@dataclass(frozen=True)
class FinalEvent:
    """The end of one choice."""

    choice: int
    content: str  # the whole generated text (stop word removed)
    token_ids: tuple[int, ...]  # every generated token id
    stop_type: str  # none | eos | limit | word
    stopping_word: str
    truncated: bool
    n_prompt: int
    n_cached: int  # prompt tokens reused from the cache
    n_decoded: int
    tokens_cached: int  # tokens in the slot's KV at the end
    id_slot: int
    timings: Timings
    has_new_line: bool
    # The probs of every kept token (for non-stream responses), when n_probs > 0.
    probs: tuple[TokenProbs, ...] = ()

    @property
    def finish_reason(self) -> str:
        return "length" if self.stop_type in ("limit", "none") else "stop"


@dataclass(frozen=True)
class ErrorEvent:
    choice: int
    message: str
    code: int = 500
    type: str = "server_error"


Event = PromptProgress | TokenEvent | FinalEvent | ErrorEvent
