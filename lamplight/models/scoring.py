"""Teacher-forced scoring and greedy decoding of single sequences: the reference path's API."""

from __future__ import annotations

from typing import Sequence

import torch

from ..engine.kv_cache import BlockTable, KVCache
from .base import CausalLM
from .batch import SequenceChunk, build_forward_batch


def new_cache(model: CausalLM, num_tokens: int, block_size: int = 16, dtype: torch.dtype = torch.float32) -> KVCache:
    blocks = (num_tokens + block_size - 1) // block_size
    return KVCache(model.config.kv_layout, blocks, block_size, dtype=dtype)


@torch.inference_mode()
def score(model: CausalLM, token_ids: Sequence[int], kv_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Logits [len(token_ids), vocab] at every position of one sequence."""
    cache = new_cache(model, len(token_ids), dtype=kv_dtype)
    table = BlockTable(cache)
    table.fill_to(len(token_ids))
    chunk = SequenceChunk(list(token_ids), 0, table.slots(), all_logits=True)
    return model(build_forward_batch([chunk]), cache)


@torch.inference_mode()
def greedy(model: CausalLM, prompt: Sequence[int], max_new_tokens: int) -> list[int]:
    """Argmax decoding with the KV cache: the prompt in one chunk, then one token per step."""
    cache = new_cache(model, len(prompt) + max_new_tokens)
    table = BlockTable(cache)
    out: list[int] = []
    tokens = list(prompt)
    start = 0
    while len(out) < max_new_tokens:
        table.fill_to(len(tokens))
        chunk = SequenceChunk(tokens[start:], start, table.slots())
        logits = model(build_forward_batch([chunk]), cache)
        nxt = int(logits[-1].argmax())
        out.append(nxt)
        start = len(tokens)
        tokens.append(nxt)
    return out
