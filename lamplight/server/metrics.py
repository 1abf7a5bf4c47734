"""GET /metrics (with --metrics): llama-server's Prometheus metric names, from finished requests
and the engine's counters."""

from __future__ import annotations

import threading
import time
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from lamplight.engine.types import FinalEvent

CONTENT_TYPE = "text/plain; version=0.0.4"


class ServerMetrics:
    """Totals over finished choices; thread-safe, cheap enough to update on every request."""

    def __init__(self):
        self._lock = threading.Lock()
        self.start_time = int(time.time())
        self.prompt_tokens = 0
        self.prompt_ms = 0.0
        self.predicted_tokens = 0
        self.predicted_ms = 0.0
        self.n_tokens_max = 0
        self.engine: Any = None

    def on_final(self, final: FinalEvent) -> None:
        with self._lock:
            self.prompt_tokens += final.timings.prompt_n
            self.prompt_ms += final.timings.prompt_ms
            self.predicted_tokens += final.timings.predicted_n
            self.predicted_ms += final.timings.predicted_ms
            self.n_tokens_max = max(self.n_tokens_max, final.tokens_cached)

    def collect(self):
        with self._lock:
            prompt_tokens, prompt_ms = self.prompt_tokens, self.prompt_ms
            predicted_tokens, predicted_ms = self.predicted_tokens, self.predicted_ms
            n_tokens_max = self.n_tokens_max
        yield CounterMetricFamily("llamacpp:prompt_tokens", "Number of prompt tokens processed.", prompt_tokens)
        yield CounterMetricFamily("llamacpp:prompt_seconds", "Prompt process time", prompt_ms / 1e3)
        yield CounterMetricFamily("llamacpp:tokens_predicted", "Number of generation tokens processed.",
                                  predicted_tokens)
        yield CounterMetricFamily("llamacpp:tokens_predicted_seconds", "Predict process time", predicted_ms / 1e3)
        yield GaugeMetricFamily("llamacpp:prompt_tokens_seconds", "Average prompt throughput in tokens/s.",
                                1e3 * prompt_tokens / prompt_ms if prompt_ms > 0 else 0.0)
        yield GaugeMetricFamily("llamacpp:predicted_tokens_seconds", "Average generation throughput in tokens/s.",
                                1e3 * predicted_tokens / predicted_ms if predicted_ms > 0 else 0.0)
        # A counter in llama-server; a gauge here so that the name keeps no "_total" suffix.
        yield GaugeMetricFamily("llamacpp:n_tokens_max", "Largest observed n_tokens.", n_tokens_max)
        yield from self._engine_metrics()

    def _engine_metrics(self):
        engine = self.engine
        if engine is None:
            return
        stats = getattr(engine, "stats", {})
        yield CounterMetricFamily("llamacpp:n_decode", "Total number of llama_decode() calls", stats.get("steps", 0))
        processing = sum(1 for slot in engine.slots_json() if slot.get("is_processing"))
        yield GaugeMetricFamily("llamacpp:requests_processing", "Number of requests processing.", processing)
        yield GaugeMetricFamily("llamacpp:requests_deferred", "Number of requests deferred.",
                                len(getattr(engine, "waiting", ())))
        yield from _kv_metrics(engine)
        yield from _spec_metrics(engine)

    def render(self) -> bytes:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        return generate_latest(registry)


def _spec_metrics(engine: Any):
    """Speculative decoding's totals, with llama-server's names."""
    stats = getattr(engine, "spec_stats", None)
    if stats is None:
        return
    yield CounterMetricFamily("llamacpp:spec_decode_num_draft_tokens", "Speculative: Total draft tokens generated",
                              stats.draft_tokens)
    yield CounterMetricFamily("llamacpp:spec_decode_num_accepted_tokens",
                              "Speculative: Total draft tokens accepted by the target model", stats.accepted_tokens)
    yield CounterMetricFamily("llamacpp:spec_decode_num_drafts", "Speculative: Total speculative decoding verification "
                              "steps", stats.drafts)
    if stats.accepted_per_position:
        per_position = CounterMetricFamily("llamacpp:spec_decode_num_accepted_tokens_per_pos",
                                           "Accepted tokens per draft position", labels=["position"])
        for position, count in enumerate(list(stats.accepted_per_position)):
            per_position.add_metric([str(position)], count)
        yield per_position


def _kv_metrics(engine: Any):
    """KV cache use (the names of llama-server versions that still reported it): blocks in use over
    all blocks, and the tokens the slots hold (running or kept for reuse)."""
    if not hasattr(engine, "kv_usage"):
        return
    usage, tokens = engine.kv_usage()
    yield GaugeMetricFamily("llamacpp:kv_cache_usage_ratio", "KV-cache usage. 1 means 100 percent usage.", usage)
    yield GaugeMetricFamily("llamacpp:kv_cache_tokens", "KV-cache tokens.", tokens)
