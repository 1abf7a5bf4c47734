"""Room in the KV pool when the slots share it (--kv-unified): who gives blocks back, and how.

With one pool for every slot a sequence may grow up to the whole context, so the pool can run
out while sequences run. Blocks come back in this order:
1. idle slots' cached tokens (kept only for prefix reuse), least recently used first;
2. running sequences, newest first (the last admitted gives way to the first): a preempted
   sequence gives back all its blocks and later computes its tokens again (vLLM's
   recompute preemption), then goes on exactly where it was: the same sampler, grammar and
   random stream, and its tokens so far. Nothing it sent is lost or sent twice.
By the reproducibility rule a token's K/V (and a recurrent state) is the same whether it was
computed in a prompt chunk or a decode step, so a preempted request's tokens are those it gets
alone. A single sequence always fits (it holds at most the pool's context), so the oldest
waiting one can always go on once the newer ones have given way.
"""

from __future__ import annotations

from typing import Callable, Iterable

from .checkpoints import CheckpointStore
from .kv_cache import KVCache
from .sequence import Sequence, SeqState
from .slots import Slot


class KVRoom:
    def __init__(self, cache: KVCache, slots: list[Slot], checkpoints: CheckpointStore | None,
                 keep_elsewhere: Callable[[Slot], None] = lambda slot: None):
        self.cache = cache
        self.slots = slots
        self.checkpoints = checkpoints  # a recurrent model's: they go with the K/V they were taken beside
        self.keep_elsewhere = keep_elsewhere  # an idle slot's tokens before they go (the RAM prompt cache)
        self.preempted = 0  # sequences preempted so far (/metrics)

    @property
    def free_blocks(self) -> int:
        return self.cache.allocator.num_free

    def blocks_needed(self, seq: Sequence, end: int) -> int:
        """The blocks `seq` must take to hold positions up to `end`: new blocks, and a copy of its
        last block where that one is shared (n > 1 choices) and will be written."""
        bs, table = self.cache.block_size, seq.table
        need = max(0, -(-end // bs) - len(table.blocks))
        if table.blocks and end > table.num_tokens and self.cache.allocator.ref_counts[table.blocks[-1]] > 1:
            need += 1
        return need

    def make_room(self, blocks: int) -> bool:
        """At least `blocks` free blocks, dropping idle slots' cached tokens (least recently used
        first) where needed; False if even that is not enough."""
        if self.free_blocks >= blocks:
            return True
        for slot in sorted((s for s in self.slots if s.is_idle and s.table.blocks), key=lambda s: s.last_used):
            self.drop_cache(slot)
            if self.free_blocks >= blocks:
                return True
        return False

    def drop_cache(self, slot: Slot) -> None:
        """Forget an idle slot's cached tokens (its blocks go back to the pool; a copy may be kept
        elsewhere first)."""
        self.keep_elsewhere(slot)
        slot.table.release()
        slot.cached_tokens = []
        self._forget_state(slot.id)

    def preempt(self, seq: Sequence) -> None:
        """Give back every block of `seq`: a running sequence computes its tokens again later (up to
        where it was: Sequence.resume_to), a finished one of a running request just lets go of
        its cache."""
        if seq.state == SeqState.DECODE:
            seq.resume_to = seq.n_computed
            seq.state = SeqState.PREFILL
        elif seq.state == SeqState.PREFILL and seq.resume_to is None:
            seq.n_cached = 0  # its prompt is read again from the start
        seq.table.release()
        self._forget_state(seq.slot_id)
        self.preempted += seq.state != SeqState.DONE

    def victim(self, running: Iterable[Sequence], keep: Sequence | None) -> Sequence | None:
        """The newest sequence holding blocks, other than `keep` (None: nothing left to take)."""
        holders = [s for s in running if s is not keep and s.table.blocks]
        return holders[-1] if holders else None

    def _forget_state(self, slot_id: int) -> None:
        # A recurrent state needs no reset: a chunk at position 0 starts from zeros.
        if self.checkpoints is not None:
            self.checkpoints.clear(slot_id)
