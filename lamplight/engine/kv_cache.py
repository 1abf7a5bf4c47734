"""The engine's paged view of the KV pool: fixed-size blocks handed to sequences.

The pool itself (lamplight.state.kv.KVPool) is storage indexed by token slot; here it is cut
into blocks of `block_size` slots. Sequences own lists of blocks (their block table); blocks are
reference-counted so several sequences can share a prefix (the `n` choices of one request share
the prompt's blocks).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..state.kv import KVPool


class KVCacheFullError(RuntimeError):
    pass


class KVCache:
    """A KV pool cut into reference-counted blocks."""

    def __init__(self, pool: KVPool, block_size: int = 16):
        if pool.num_tokens % block_size:
            raise ValueError(f"a pool of {pool.num_tokens} tokens is not a whole number of {block_size}-token blocks")
        self.pool = pool
        self.block_size = block_size
        self.num_blocks = pool.num_tokens // block_size
        self.allocator = BlockAllocator(self.num_blocks)

    def copy_tokens(self, src: np.ndarray, dst: np.ndarray) -> None:
        self.pool.copy_tokens(src, dst)


@dataclass
class BlockAllocator:
    num_blocks: int
    ref_counts: list[int] = field(init=False)
    free: list[int] = field(init=False)

    def __post_init__(self):
        self.ref_counts = [0] * self.num_blocks
        # Hand out low block ids first (pop from the end).
        self.free = list(range(self.num_blocks - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self.free)

    def allocate(self) -> int:
        if not self.free:
            raise KVCacheFullError("the KV cache has no free block")
        block = self.free.pop()
        self.ref_counts[block] = 1
        return block

    def share(self, block: int) -> None:
        self.ref_counts[block] += 1

    def release(self, block: int) -> None:
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:
            self.free.append(block)
        elif self.ref_counts[block] < 0:
            raise RuntimeError(f"block {block} released more often than allocated")


class BlockTable:
    """The blocks of one sequence, in order, and how many token positions are filled."""

    def __init__(self, cache: KVCache):
        self.cache = cache
        self.blocks: list[int] = []
        self.num_tokens = 0

    def slots(self, start: int = 0, end: int | None = None) -> list[int]:
        end = self.num_tokens if end is None else end
        bs = self.cache.block_size
        return [self.blocks[i // bs] * bs + i % bs for i in range(start, end)]

    def reserve(self, num_tokens: int) -> None:
        """Make room for positions up to `num_tokens` (allocating blocks as needed)."""
        bs = self.cache.block_size
        need = (num_tokens + bs - 1) // bs
        while len(self.blocks) < need:
            self.blocks.append(self.cache.allocator.allocate())

    def fill_to(self, num_tokens: int) -> None:
        """Reserve room for positions up to `num_tokens` and count them as held (written by the
        forward pass that follows)."""
        self.reserve(num_tokens)
        self.num_tokens = num_tokens

    def truncate(self, num_tokens: int) -> None:
        """Forget positions from `num_tokens` on, freeing whole blocks past it."""
        bs = self.cache.block_size
        keep = (num_tokens + bs - 1) // bs
        for block in self.blocks[keep:]:
            self.cache.allocator.release(block)
        del self.blocks[keep:]
        self.num_tokens = min(self.num_tokens, num_tokens)

    def release(self) -> None:
        self.truncate(0)

    def fork(self) -> "BlockTable":
        """A new table sharing all of this one's blocks (copy-on-write is the caller's job)."""
        other = BlockTable(self.cache)
        for block in self.blocks:
            self.cache.allocator.share(block)
        other.blocks = list(self.blocks)
        other.num_tokens = self.num_tokens
        return other

    def make_last_block_private(self) -> None:
        """Before writing into a shared partially filled block, give this table its own copy."""
        if self.blocks:
            self.make_private_from(len(self.blocks) - 1)

    def make_private_from(self, first_block: int) -> None:
        """Give this table its own copy of every shared block from `first_block` on."""
        bs = self.cache.block_size
        for i in range(first_block, len(self.blocks)):
            block = self.blocks[i]
            if self.cache.allocator.ref_counts[block] <= 1:
                continue
            fresh = self.cache.allocator.allocate()
            self.cache.copy_tokens(np.arange(block * bs, block * bs + bs), np.arange(fresh * bs, fresh * bs + bs))
            self.cache.allocator.release(block)
            self.blocks[i] = fresh
