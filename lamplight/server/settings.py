"""Server-wide settings: the CLI flags that shape HTTP behaviour and per-request defaults."""

from __future__ import annotations

from dataclasses import dataclass, field

from lamplight import __version__
from lamplight.serve_flags import default_of

BUILD_INFO = f"b0-lamplight-{__version__}"  # llama-server clients expect a "b<number>-..." build string


@dataclass(frozen=True)
class RequestLimits:
    """What one request may ask for; past a limit the answer is a 400 (413 for the body) naming
    the field and the limit. llama-server has none of these: each bounds memory or engine time
    that one request could otherwise take from all others. The defaults of those with a flag are
    the flags' (lamplight.serve_flags)."""

    max_body_bytes: int = default_of("limits.max_body_bytes")  # --max-body-size
    max_json_depth: int = 64  # nesting of arrays and objects in a body
    max_sequences: int = default_of("limits.max_sequences")  # --max-request-sequences: prompts x n of one request
    max_stop_strings: int = default_of("limits.max_stop_strings")  # --max-stop-strings
    max_stop_chars: int = 256  # characters of one stop string (the hold-back check runs per token)
    # --max-dry-breakers (each is cut to 40 bytes, as llama.cpp does)
    max_dry_breakers: int = default_of("limits.max_dry_breakers")
    max_logit_bias: int = default_of("limits.max_logit_bias")  # --max-logit-bias: entries, and token ids they name
    max_grammar_bytes: int = default_of("limits.max_grammar_bytes")  # --max-grammar-size: grammar or schema text
    max_n_probs: int = default_of("limits.max_n_probs")  # --max-n-probs: n_probs, logprobs, top_logprobs


@dataclass
class ServerSettings:
    """The defaults are the flags' (lamplight.serve_flags)."""

    host: str = default_of("server.host")
    port: int = default_of("server.port")
    api_keys: tuple[str, ...] = default_of("server.api_keys")
    cors_origins: tuple[str, ...] = default_of("server.cors_origins")
    alias: str | None = default_of("server.alias")  # overrides the model name reported in responses
    # Per-request defaults (`--temp`, `--top-k`, ...), keyed by request field name.
    sampling_defaults: dict = field(default_factory=dict)
    n_predict: int = default_of("server.n_predict")
    n_keep: int = default_of("server.n_keep")
    slots_endpoint: bool = default_of("server.slots_endpoint")
    metrics: bool = default_of("server.metrics")
    sse_ping_interval: float = default_of("server.sse_ping_interval")  # silent seconds before a `:` comment
    timeout: float = default_of("server.timeout")  # `-to`: seconds to read a request's headers and body
    # Seconds a connection may stay silent between requests (or before its first) before it is
    # closed: cpp-httplib's keep-alive timeout, which llama-server uses.
    idle_timeout: float = default_of("server.idle_timeout")
    limits: RequestLimits = field(default_factory=RequestLimits)
    build_info: str = BUILD_INFO
    slot_save_path: str | None = default_of("server.slot_save_path")  # enables POST /slots/{id}?action=...
    spm_infill: bool = default_of("server.spm_infill")  # /infill puts the suffix before the prefix
    # Tokens of thinking per chat reply (-1 unlimited, 0 thinking off); a request's
    # `reasoning_budget_tokens` overrides it.
    reasoning_budget: int = default_of("server.reasoning_budget")
    reasoning_budget_message: str = default_of("server.reasoning_budget_message")  # forced before the end of thinking
    webui: bool = default_of("server.webui")  # the chat page at `/`
    static_path: str | None = default_of("server.static_path")  # serve this folder at `/` instead of the chat page

    def origin_allowed(self, origin: str) -> bool:
        return "*" in self.cors_origins or origin in self.cors_origins
