"""Teacher-forced scoring and greedy decoding of single sequences over any runner (what the
fidelity tests compare with llama.cpp's logits and continuations)."""

from __future__ import annotations

from typing import Sequence

import torch

from ..models.batch import SequenceChunk
from .base import ModelRunner


@torch.inference_mode()
def score(runner: ModelRunner, token_ids: Sequence[int], kv_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Logits [len(token_ids), vocab] at every position of one sequence."""
    state = runner.new_state(len(token_ids), kv_dtype)
    chunk = SequenceChunk(list(token_ids), 0, range(len(token_ids)), all_logits=True)
    return runner.run([chunk], state)


@torch.inference_mode()
def greedy(runner: ModelRunner, prompt: Sequence[int], max_new_tokens: int) -> list[int]:
    """Argmax decoding with the KV cache: the prompt in one chunk, then one token per step."""
    state = runner.new_state(len(prompt) + max_new_tokens)
    out: list[int] = []
    tokens = list(prompt)
    start = 0
    while len(out) < max_new_tokens:
        chunk = SequenceChunk(tokens[start:], start, range(len(tokens)))
        nxt = int(runner.run([chunk], state)[-1].argmax())
        out.append(nxt)
        start = len(tokens)
        tokens.append(nxt)
    return out
