"""HTTP client for one OpenAI-compatible server: probing it and timing streamed requests.

Everything is measured on the client side, so any server (lamplight, llama.cpp's llama-server,
vLLM...) is measured the same way. Server-reported timings are kept as extra data only.
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import asdict, dataclass
from typing import Any

import httpx

from lamplight.bench.prompts import Prompt


REPLICA_HEADER = "x-lamplight-replica"  # lamplight serve --replicas: the replica that answered


class BenchError(Exception):
    """A failure the user should see as a one-line message, not a traceback."""


@dataclass
class ServerInfo:
    url: str
    model: str | None
    n_ctx: int | None
    n_ctx_source: str | None
    tokenize: bool
    # The model file as the server names it (/props model_path), for the single-stream roofline.
    model_path: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class RequestResult:
    """Client-side figures for one streamed request."""

    max_tokens: int
    total_s: float
    ttft_s: float | None = None
    # From the first content chunk to the last one.
    decode_s: float | None = None
    content_chunks: int = 0
    usage_completion_tokens: int | None = None
    usage_prompt_tokens: int | None = None
    finish_reason: str | None = None
    server_timings: dict | None = None
    # Prompt tokens the server took from its cache (usage.prompt_tokens_details or timings.cache_n).
    cached_tokens: int | None = None
    # Speculative decoding: tokens drafted and those of them accepted (timings.draft_n and
    # timings.draft_n_accepted of llama-server and lamplight, sent only when speculation drafted).
    draft_n: int | None = None
    draft_n_accepted: int | None = None
    # The replica that served the request, when a router says so (lamplight --replicas).
    replica: str | None = None
    error: str | None = None
    # The generated text (a conversation's next turn repeats it); not written to the report.
    text: str = ""

    @property
    def output_tokens(self) -> int:
        # Servers may pack several tokens into one chunk; their own count is then the right one.
        if self.usage_completion_tokens is not None:
            return self.usage_completion_tokens
        return self.content_chunks

    @property
    def decode_tps(self) -> float | None:
        if self.error or not self.decode_s or self.output_tokens < 2:
            return None
        return (self.output_tokens - 1) / self.decode_s

    @property
    def short(self) -> bool:
        """The server stopped before max_tokens (it probably ignores `ignore_eos`)."""
        return self.error is None and self.output_tokens < self.max_tokens

    def to_dict(self) -> dict:
        fields = asdict(self)
        del fields["text"]
        return {
            **fields,
            "output_tokens": self.output_tokens,
            "decode_tps": self.decode_tps,
            "short": self.short,
        }


@dataclass
class TimedAnswer:
    """A non-streamed request's wall time and its JSON body (None with an error)."""

    total_s: float
    data: Any = None
    error: str | None = None


class StreamRecorder:
    """Turns the SSE events of one response into a RequestResult, stamping arrival times."""

    def __init__(self, max_tokens: int):
        self.result = RequestResult(max_tokens=max_tokens, total_s=0.0)
        self.started = time.perf_counter()
        self.first_at: float | None = None
        self.last_at: float | None = None

    def on_event(self, event: dict, now: float) -> None:
        if "error" in event:
            self.result.error = f"server error in stream: {_error_text(event['error'])}"
            return
        usage = event.get("usage")
        if isinstance(usage, dict):
            self.result.usage_completion_tokens = usage.get("completion_tokens")
            self.result.usage_prompt_tokens = usage.get("prompt_tokens")
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
            if isinstance(cached, int):
                self.result.cached_tokens = cached
        if isinstance(event.get("timings"), dict):
            self._on_timings(event["timings"])
        for choice in event.get("choices") or []:
            self._on_choice(choice, now)

    def _on_timings(self, timings: dict) -> None:
        """The final chunk's timings (the last seen) win; their draft counts are cumulative, so an
        object without them (one sent before speculation drafted) never erases earlier ones."""
        self.result.server_timings = timings
        if self.result.cached_tokens is None and isinstance(timings.get("cache_n"), int):
            self.result.cached_tokens = timings["cache_n"]
        drafted = _count(timings, "draft_n")
        if drafted is not None:
            self.result.draft_n = drafted
            self.result.draft_n_accepted = _count(timings, "draft_n_accepted")

    def _on_choice(self, choice: dict, now: float) -> None:
        if choice.get("finish_reason"):
            self.result.finish_reason = choice["finish_reason"]
        text = _choice_text(choice)
        if not text:
            return
        if choice.get("text") or (choice.get("delta") or {}).get("content"):
            self.result.text += text  # the answer, not the thinking
        self.result.content_chunks += 1
        if self.first_at is None:
            self.first_at = now
        self.last_at = now

    def finish(self, error: str | None = None) -> RequestResult:
        result = self.result
        result.total_s = time.perf_counter() - self.started
        result.error = error or result.error
        if self.first_at is not None:
            result.ttft_s = self.first_at - self.started
            result.decode_s = self.last_at - self.first_at
        if result.error is None and result.content_chunks == 0:
            result.error = "the stream carried no content"
        return result


class ServerClient:
    """One server under test; use as `async with ServerClient(...) as client`."""

    def __init__(self, url: str, *, api: str = "completions", model: str | None = None,
                 timeout_s: float = 600.0, max_connections: int = 64):
        if not url.startswith(("http://", "https://")):
            raise BenchError(f"{url!r} is not an http(s) URL")
        self.url = url.rstrip("/")
        self.api = api
        self.model = model
        self._tokenize_style: str | None = None
        # trust_env=False: a proxy from the environment must never sit between us and the server.
        self._http = httpx.AsyncClient(
            base_url=self.url,
            timeout=httpx.Timeout(timeout_s, connect=10.0),
            transport=httpx.AsyncHTTPTransport(
                # An idle connection is dropped after 2 s: llama.cpp's server closes its own after
                # 5 s (cpp-httplib's keep-alive timeout), and httpx's 5 s default raced it.
                limits=httpx.Limits(max_connections=max_connections,
                                    max_keepalive_connections=max_connections, keepalive_expiry=2.0),
                # Never let Nagle's algorithm delay a small request write.
                socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
            ),
            trust_env=False,
        )

    async def __aenter__(self) -> ServerClient:
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self._http.aclose()

    async def probe(self) -> ServerInfo:
        """Learn the model name, context size and whether /tokenize works."""
        models = await self._get_json("/v1/models")
        props = await self._get_json("/props")
        if self.model is None:
            self.model = _first_model_id(models)
        n_ctx, source = find_context_size(props, models)
        self._tokenize_style = await self._detect_tokenize_style()
        path = props.get("model_path") if isinstance(props, dict) else None
        return ServerInfo(self.url, self.model, n_ctx, source, self._tokenize_style is not None,
                          path if isinstance(path, str) else None)

    async def count_tokens(self, text: str) -> int | None:
        if self._tokenize_style is None:
            return None
        return await self._tokenize(text, self._tokenize_style)

    async def stream(self, prompt: Prompt, max_tokens: int) -> RequestResult:
        body = self._request_body(max_tokens)
        if self.api == "chat":
            body["messages"] = prompt.messages()
        else:
            body["prompt"] = prompt.text()
        return await self._stream(self._endpoint(), body, max_tokens)

    async def stream_chat(self, messages: list[dict], max_tokens: int) -> RequestResult:
        """One turn of a conversation: chat completions whatever `api` says."""
        return await self._stream("/v1/chat/completions", {**self._request_body(max_tokens), "messages": messages},
                                  max_tokens)

    async def _stream(self, endpoint: str, body: dict, max_tokens: int) -> RequestResult:
        for attempt in range(2):
            recorder = StreamRecorder(max_tokens)
            answered = False
            try:
                async with self._http.stream("POST", endpoint, json=body) as response:
                    answered = True
                    recorder.result.replica = response.headers.get(REPLICA_HEADER)
                    if response.status_code >= 400:
                        return recorder.finish(await _describe_http_error(response))
                    await _read_events(response, recorder)
            except httpx.RemoteProtocolError as exc:
                # Closed before any answer: most often a kept-alive connection the server closed
                # as we reused it. The request is sent once more, on a new connection.
                if not answered and attempt == 0:
                    continue
                return recorder.finish(describe_transport_error(self.url, exc))
            except httpx.HTTPError as exc:
                return recorder.finish(describe_transport_error(self.url, exc))
            return recorder.finish()
        raise AssertionError("unreachable: the second attempt always returns")

    async def post_timed(self, path: str, body: dict) -> TimedAnswer:
        """One non-streamed POST (embeddings, rerank), timed from sending to the whole body read."""
        if self.model:
            body = {"model": self.model, **body}
        started = time.perf_counter()
        try:
            response = await self._http.post(path, json=body)
            if response.status_code >= 400:
                return TimedAnswer(time.perf_counter() - started, error=await _describe_http_error(response))
            data = response.json()
        except httpx.HTTPError as exc:
            return TimedAnswer(time.perf_counter() - started, error=describe_transport_error(self.url, exc))
        except ValueError:
            return TimedAnswer(time.perf_counter() - started, error=f"{path} answered a body that is not JSON")
        return TimedAnswer(time.perf_counter() - started, data)

    def _endpoint(self) -> str:
        return "/v1/chat/completions" if self.api == "chat" else "/v1/completions"

    def _request_body(self, max_tokens: int) -> dict:
        body: dict[str, Any] = {
            "max_tokens": max_tokens,
            "temperature": 0,
            # llama.cpp and vLLM honour ignore_eos; others may stop early (reported as "short").
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.model:
            body["model"] = self.model
        return body

    async def _get_json(self, path: str) -> Any:
        """GET a JSON document; None when the server lacks it, BenchError when unreachable."""
        try:
            response = await self._http.get(path)
        except httpx.HTTPError as exc:
            raise BenchError(describe_transport_error(self.url, exc)) from None
        if response.status_code != 200:
            return None
        try:
            return response.json()
        except ValueError:
            return None

    async def _detect_tokenize_style(self) -> str | None:
        for style in ("llama.cpp", "vllm"):
            if await self._tokenize("hello world", style) is not None:
                return style
        return None

    async def _tokenize(self, text: str, style: str) -> int | None:
        if style == "llama.cpp":
            body: dict[str, Any] = {"content": text}
        else:
            body = {"model": self.model, "prompt": text, "add_special_tokens": False}
        try:
            response = await self._http.post("/tokenize", json=body)
            data = response.json() if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None
        if isinstance(data, dict) and isinstance(data.get("tokens"), list):
            return len(data["tokens"])
        return None


async def _read_events(response: httpx.Response, recorder: StreamRecorder) -> None:
    # Read to the end even after [DONE]: a half-read response closes the connection, and the
    # next request would then pay for a new one.
    done = False
    async for line in response.aiter_lines():
        if done or not line.startswith("data:"):
            continue
        payload = line[len("data:"):].strip()
        if payload == "[DONE]":
            done = True
            continue
        try:
            event = json.loads(payload)
        except ValueError:
            recorder.result.error = f"malformed SSE data: {payload[:120]!r}"
            done = True
            continue
        if isinstance(event, dict):
            recorder.on_event(event, time.perf_counter())


def _count(mapping: dict, key: str) -> int | None:
    value = mapping.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _choice_text(choice: dict) -> str:
    if choice.get("text"):
        return choice["text"]
    delta = choice.get("delta") or {}
    # Reasoning models stream their thinking tokens separately; they are output tokens too.
    return delta.get("content") or delta.get("reasoning_content") or ""


def _first_model_id(models: Any) -> str | None:
    entries = models.get("data") if isinstance(models, dict) else None
    if entries and isinstance(entries[0], dict):
        return entries[0].get("id")
    return None


def find_context_size(props: Any, models: Any) -> tuple[int | None, str | None]:
    """The context length from llama.cpp's /props or the /v1/models entry, whichever has it."""
    props = props if isinstance(props, dict) else {}
    settings = props.get("default_generation_settings") or {}
    entries = models.get("data") if isinstance(models, dict) else None
    entry = entries[0] if entries and isinstance(entries[0], dict) else {}
    meta = entry.get("meta") or {}
    candidates = (
        ("/props default_generation_settings.n_ctx", settings.get("n_ctx")),
        ("/props n_ctx", props.get("n_ctx")),
        ("/v1/models max_model_len", entry.get("max_model_len")),
        ("/v1/models meta.n_ctx", meta.get("n_ctx")),
        # The training context is only an upper bound; used when nothing better is known.
        ("/v1/models meta.n_ctx_train", meta.get("n_ctx_train")),
    )
    for source, value in candidates:
        if isinstance(value, int) and value > 0:
            return value, source
    return None, None


async def _describe_http_error(response: httpx.Response) -> str:
    body = (await response.aread()).decode("utf-8", "replace")
    try:
        message = _error_text(json.loads(body).get("error", body))
    except (ValueError, AttributeError):
        message = body
    return f"HTTP {response.status_code} from {response.request.url}: {message.strip()[:300]}"


def _error_text(error: Any) -> str:
    if isinstance(error, dict):
        return str(error.get("message") or error)
    return str(error)


def describe_transport_error(url: str, exc: httpx.HTTPError) -> str:
    if isinstance(exc, httpx.ConnectError):
        return f"cannot connect to {url} ({exc or 'connection refused'}); is the server running?"
    if isinstance(exc, httpx.TimeoutException):
        return f"timed out talking to {url} ({type(exc).__name__})"
    return f"request to {url} failed: {type(exc).__name__}: {exc}"
