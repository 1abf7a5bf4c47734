"""Server-wide settings: the CLI flags that shape HTTP behaviour and per-request defaults."""

from __future__ import annotations

from dataclasses import dataclass, field

from lamplight import __version__

BUILD_INFO = f"b0-lamplight-{__version__}"  # llama-server clients expect a "b<number>-..." build string


@dataclass(frozen=True)
class RequestLimits:
    """What one request may ask for; past a limit the answer is a 400 (413 for the body) naming
    the field and the limit. llama-server has none of these: each bounds memory or engine time
    that one request could otherwise take from all others."""

    max_body_bytes: int = 16 * 2**20  # --max-body-size
    max_json_depth: int = 64  # nesting of arrays and objects in a body
    max_sequences: int = 256  # --max-request-sequences: prompts x n of one request
    max_stop_strings: int = 32  # --max-stop-strings
    max_stop_chars: int = 256  # characters of one stop string (the hold-back check runs per token)
    max_dry_breakers: int = 64  # --max-dry-breakers (each is cut to 40 bytes, as llama.cpp does)
    max_logit_bias: int = 1024  # --max-logit-bias: entries, and token ids they resolve to
    max_grammar_bytes: int = 256 * 2**10  # --max-grammar-size: grammar or JSON schema text
    max_n_probs: int = 100  # --max-n-probs: n_probs, logprobs, top_logprobs


@dataclass
class ServerSettings:
    host: str = "127.0.0.1"
    port: int = 8080
    api_keys: tuple[str, ...] = ()
    cors_origins: tuple[str, ...] = ("*",)
    alias: str | None = None  # overrides the model name reported in responses
    # Per-request defaults (`--temp`, `--top-k`, ...), keyed by request field name.
    sampling_defaults: dict = field(default_factory=dict)
    n_predict: int = -1
    n_keep: int = 0
    slots_endpoint: bool = True
    metrics: bool = False
    sse_ping_interval: float = 30.0  # seconds of silence in a stream before a `:` comment is sent
    timeout: float = 3600.0  # `-to`: seconds to read a request's headers and body (llama-server's read timeout)
    # Seconds a connection may stay silent between requests (or before its first) before it is
    # closed: cpp-httplib's keep-alive timeout, which llama-server uses.
    idle_timeout: float = 5.0
    limits: RequestLimits = field(default_factory=RequestLimits)
    build_info: str = BUILD_INFO
    slot_save_path: str | None = None  # `--slot-save-path`: enables POST /slots/{id}?action=...
    spm_infill: bool = False  # `--spm-infill`: /infill puts the suffix before the prefix
    # `--reasoning-budget`: tokens of thinking per chat reply (-1 unlimited, 0 thinking off); a
    # request's `reasoning_budget_tokens` overrides it.
    reasoning_budget: int = -1
    reasoning_budget_message: str = ""  # `--reasoning-budget-message`: forced before the end of thinking
    webui: bool = True  # `--no-webui` turns the chat page at `/` off
    static_path: str | None = None  # `--path DIR`: serve this folder at `/` instead of the chat page

    def origin_allowed(self, origin: str) -> bool:
        return "*" in self.cors_origins or origin in self.cors_origins
