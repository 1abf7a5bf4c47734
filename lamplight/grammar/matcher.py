"""Per-sequence grammar state and the batched token masks the sampler applies."""

from __future__ import annotations

import threading

import llguidance
import numpy as np

from .vocabulary import Vocabulary


class CompiledGrammar:
    """A validated grammar; `new_matcher()` is cheap (a copy of a fresh llguidance matcher)."""

    def __init__(self, template: llguidance.LLMatcher, vocabulary: Vocabulary, kind: str, source: str = ""):
        self._template = template
        self.vocabulary = vocabulary
        self.kind = kind  # "gbnf" | "json_schema" | "lark" | "after"
        self.source = source  # the llguidance grammar (Lark text or top-level JSON) it was built from

    def new_matcher(self) -> "GrammarMatcher":
        return GrammarMatcher(self._template.deep_copy(), self.vocabulary)


class GrammarMatcher:
    """Where one sequence stands in its grammar."""

    def __init__(self, matcher: llguidance.LLMatcher, vocabulary: Vocabulary):
        self._matcher = matcher
        self.vocabulary = vocabulary

    def fill_mask(self, out_row: np.ndarray) -> None:
        """True where the token may come next; end-of-generation ids only where complete."""
        out_row[...] = fill_masks([self], out_row.shape[-1])[0]

    def accept(self, token_id: int) -> bool:
        """Advance by the sampled token; False (state unchanged for EOG) if it was not allowed."""
        if token_id in self.vocabulary.eog_ids:
            return self.is_accepting() and self._matcher.consume_token(token_id)
        if not 0 <= token_id < self.vocabulary.size:
            return False
        return self._matcher.consume_token(token_id)

    def is_accepting(self) -> bool:
        return self._matcher.is_accepting() and not self._matcher.is_error()

    def is_stopped(self) -> bool:
        """Nothing but end-of-generation can follow (also true after an error)."""
        return self._matcher.is_stopped()

    @property
    def error(self) -> str | None:
        """Set once a disallowed token was accepted: the mask then allows only EOG."""
        return self._matcher.get_error() or None

    def rollback(self, n_tokens: int) -> bool:
        """Undo the last accepted tokens (speculative decoding, stop-string trimming)."""
        return self._matcher.rollback(n_tokens)


# -- batched masks ------------------------------------------------------------------------------

_executor: llguidance.LLExecutor | None = None
_executor_lock = threading.Lock()


def _shared_executor() -> llguidance.LLExecutor:
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = llguidance.LLExecutor()
        return _executor


def fill_masks(matchers: list[GrammarMatcher | None], n_vocab: int) -> np.ndarray | None:
    """[B, n_vocab] numpy bool, True = allowed. Rows without a grammar are all True; ids the
    tokenizer does not have (model vocabularies can be padded) are False in constrained rows.
    None when no row has a grammar."""
    rows = [(i, m) for i, m in enumerate(matchers) if m is not None]
    if not rows:
        return None
    vocabulary = rows[0][1].vocabulary
    if n_vocab < vocabulary.size:
        raise ValueError(f"the model's {n_vocab} logits cannot hold the tokenizer's {vocabulary.size} tokens")
    bitmask = _bitmask_buffer(len(matchers), (vocabulary.size + 31) // 32)
    _compute_bitmasks(rows, bitmask)
    for index, matcher in rows:
        _set_end_of_generation(bitmask[index], matcher)
    allowed = np.unpackbits(bitmask.view(np.uint8), axis=1, count=n_vocab, bitorder="little")
    for index, matcher in enumerate(matchers):
        if matcher is None:
            allowed[index] = 1
    return allowed.view(np.bool_)  # unpackbits' 0/1 bytes are bools as they are


_buffers = threading.local()


def _bitmask_buffer(batch: int, words: int) -> np.ndarray:
    """Reused between steps. No clearing needed: llguidance writes whole rows, and rows
    without a grammar are overwritten after unpacking."""
    buffers = getattr(_buffers, "by_shape", None)
    if buffers is None:
        buffers = _buffers.by_shape = {}
    if (batch, words) not in buffers:
        buffers[(batch, words)] = np.zeros((batch, words), dtype=np.int32)
    return buffers[(batch, words)]


def _compute_bitmasks(rows: list[tuple[int, GrammarMatcher]], bitmask: np.ndarray) -> None:
    if len(rows) == 1:  # skips the thread pool: cheaper for one sequence
        index, matcher = rows[0]
        row = bitmask[index]
        matcher._matcher.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)
        return
    _shared_executor().unsafe_compute_mask_ptr(
        [(matcher._matcher, index) for index, matcher in rows],
        bitmask.ctypes.data,
        bitmask.shape[1] * 4,
        bitmask.shape[0],
    )


def _set_end_of_generation(row: np.ndarray, matcher: GrammarMatcher) -> None:
    """EOG exactly where the grammar is complete; after an error, only EOG (so the row ends
    instead of having nothing to sample)."""
    words = row.view(np.uint32)
    if matcher._matcher.is_error():
        words[:] = 0
    complete = matcher.is_accepting() or matcher._matcher.is_error()
    for token_id in matcher.vocabulary.eog_ids:
        bit = np.uint32(1 << (token_id % 32))
        if complete:
            words[token_id // 32] |= bit
        else:
            words[token_id // 32] &= ~bit
