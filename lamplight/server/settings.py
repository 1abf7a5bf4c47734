"""Server-wide settings: the CLI flags that shape HTTP behaviour and per-request defaults."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

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

    host: str = default_of("server.host")  # a path ending in .sock: a UNIX socket
    port: int = default_of("server.port")
    api_keys: tuple[str, ...] = default_of("server.api_keys")  # --api-key's, then --api-key-file's
    api_prefix: str = default_of("server.api_prefix")  # every route is also served under it
    ssl_keyfile: str | None = default_of("server.ssl_keyfile")  # with ssl_certfile: HTTPS
    ssl_certfile: str | None = default_of("server.ssl_certfile")
    cors_origins: tuple[str, ...] = default_of("server.cors_origins")
    cors_methods: str = default_of("server.cors_methods")  # a preflight's Access-Control-Allow-Methods
    cors_headers: str = default_of("server.cors_headers")  # "*": the headers the preflight asks for
    cors_credentials: bool = default_of("server.cors_credentials")
    alias: str | None = default_of("server.alias")  # overrides the model name reported in responses
    tags: tuple[str, ...] = default_of("server.tags")  # informational, listed by /v1/models
    # Per-request defaults (`--temp`, `--top-k`, ...), keyed by request field name.
    sampling_defaults: dict = field(default_factory=dict)
    n_predict: int = default_of("server.n_predict")
    n_keep: int = default_of("server.n_keep")
    stop: tuple[str, ...] = default_of("server.stop")  # `-r`: the stop strings of requests that give none
    cache_prompt: bool = default_of("server.cache_prompt")  # requests' default cache_prompt
    # `--grammar` / `--json-schema`: the constraint of requests that ask for none of their own.
    grammar: str | None = default_of("server.grammar")
    json_schema: Any = default_of("server.json_schema")
    # `--chat-template-kwargs`: template variables under each chat request's own chat_template_kwargs.
    chat_template_kwargs: dict = field(default_factory=dict)
    reasoning_effort: str = default_of("server.reasoning_effort")  # "default": the template's own
    reasoning_format: str = default_of("server.reasoning_format")  # chat requests' default reasoning_format
    slots_endpoint: bool = default_of("server.slots_endpoint")
    metrics: bool = default_of("server.metrics")
    props: bool = default_of("server.props")  # POST /props answers (and changes nothing, as llama-server's)
    sse_ping_interval: float = default_of("server.sse_ping_interval")  # silent seconds before a `:` comment
    timeout: float = default_of("server.timeout")  # `-to`: seconds to read a request's headers and body
    # Seconds a connection may stay silent between requests (or before its first) before it is
    # closed: cpp-httplib's keep-alive timeout, which llama-server uses.
    idle_timeout: float = default_of("server.idle_timeout")
    limits: RequestLimits = field(default_factory=RequestLimits)
    build_info: str = BUILD_INFO
    log_level: str = "info"  # uvicorn's, from --log-disable, -v and -lv (lamplight.serve_options)
    slot_save_path: str | None = default_of("server.slot_save_path")  # enables POST /slots/{id}?action=...
    spm_infill: bool = default_of("server.spm_infill")  # /infill puts the suffix before the prefix
    # Tokens of thinking per chat reply (-1 unlimited, 0 thinking off); a request's
    # `reasoning_budget_tokens` overrides it.
    reasoning_budget: int = default_of("server.reasoning_budget")
    embd_normalize: int = default_of("server.embd_normalize")  # embeddings' normalisation unless a request says
    reasoning_budget_message: str = default_of("server.reasoning_budget_message")  # forced before the end of thinking
    webui: bool = default_of("server.webui")  # the chat page at `/`
    static_path: str | None = default_of("server.static_path")  # serve this folder at `/` instead of the chat page

    def origin_allowed(self, origin: str) -> bool:
        if "*" in self.cors_origins or origin in self.cors_origins:
            return True
        return "localhost" in self.cors_origins and _is_localhost(origin)

    @property
    def unix_socket(self) -> str | None:
        """llama-server's rule: a --host ending in .sock is the path of a UNIX socket."""
        return self.host if self.host.endswith(".sock") else None

    def template_kwargs(self, requested: dict | None) -> dict:
        """A chat request's template variables: the server's (--reasoning-effort, then
        --chat-template-kwargs), with the request's own over them."""
        effort = {} if self.reasoning_effort == "default" else {"reasoning_effort": self.reasoning_effort}
        return {**effort, **self.chat_template_kwargs, **(requested or {})}


def _is_localhost(origin: str) -> bool:
    host = urlsplit(origin).hostname or ""
    return host in ("localhost", "127.0.0.1", "::1") or host.endswith(".localhost")
