"""Sizes of the benchmark scenarios: moderate defaults, and a quick preset for slow CPU servers."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class BenchConfig:
    # (1) single-stream decode speed
    decode_prompt_tokens: int = 32
    decode_max_tokens: int = 128
    decode_repeats: int = 3
    # (2) time to first token against prompt length
    ttft_lengths: tuple[int, ...] = (16, 512, 2048)
    ttft_repeats: int = 3
    ttft_max_tokens: int = 2
    # (3) aggregate throughput with N requests in flight
    concurrency_levels: tuple[int, ...] = (1, 4, 16, 32)
    # Each of the N streams sends this many requests back to back.
    concurrency_rounds: int = 2
    concurrency_prompt_tokens: int = 32
    concurrency_max_tokens: int = 64
    # (4) prefix cache: one long system prompt, different short user turns
    prefix_system_tokens: int = 1024
    prefix_user_tokens: int = 16
    prefix_requests: int = 5
    prefix_max_tokens: int = 2
    # (5) multi-turn conversations sharing one system prompt, all in flight at once; each turn
    # repeats the conversation so far (the replies as generated) and adds a user message
    conversation_count: int = 4
    conversation_turns: int = 4
    conversation_system_tokens: int = 512
    conversation_user_tokens: int = 32
    conversation_max_tokens: int = 16
    # (6) copy edits: a code listing to give back with one rename, so the answer repeats most of
    # the prompt (what n-gram or draft-model speculation is for); one listing per repeat
    copy_edit_source_tokens: int = 256
    copy_edit_max_tokens: int = 256
    copy_edit_repeats: int = 3
    # (7) one long prompt: prefill at length, then decoding behind a long KV cache
    long_context_tokens: int = 8000
    long_context_max_tokens: int = 64
    long_context_repeats: int = 2
    # (8) embeddings: one request of many short inputs (a RAG tool indexing its chunks); the
    # server needs --embedding (llama-server: --embedding --pooling mean on a decoder)
    embeddings_inputs: int = 256
    embeddings_input_tokens: int = 20
    embeddings_repeats: int = 3
    # (9) rerank: one query against many passages (a RAG tool's second stage); --reranking
    rerank_documents: int = 64
    rerank_document_tokens: int = 200
    rerank_query_tokens: int = 16
    rerank_repeats: int = 3
    # Warm-up request sent to each server before measuring (first requests are often slow).
    warmup_max_tokens: int = 8

    def to_dict(self) -> dict:
        return asdict(self)


DEFAULT_CONFIG = BenchConfig()

QUICK_CONFIG = BenchConfig(
    decode_max_tokens=32,
    decode_repeats=2,
    ttft_repeats=1,
    concurrency_rounds=1,
    concurrency_max_tokens=8,
    prefix_system_tokens=512,
    prefix_requests=3,
    conversation_count=3,
    conversation_turns=3,
    conversation_system_tokens=256,
    conversation_max_tokens=8,
    copy_edit_source_tokens=128,
    copy_edit_max_tokens=64,
    copy_edit_repeats=2,
    long_context_tokens=4000,
    long_context_max_tokens=16,
    long_context_repeats=1,
    embeddings_inputs=32,
    embeddings_repeats=1,
    rerank_documents=8,
    rerank_document_tokens=64,
    rerank_repeats=1,
    warmup_max_tokens=4,
)
