"""The paged KV cache: one pool of fixed-size blocks per layer, shared by all slots.

Storage is flat per layer and head-major: `k[layer]` has shape
[n_kv_heads, num_blocks * block_size, head_dim], so a token's K/V lives at index
`block * block_size + offset` of every head. Head-major storage lets one gather of a batch's keys
come out as [n_kv_heads * batch, context, head_dim], the layout batched matmuls take as is.
Sequences own lists of blocks (their block table); blocks are reference-counted so several
sequences can share a prefix (the `n` choices of one request share the prompt's blocks).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


class KVCacheFullError(RuntimeError):
    pass


@dataclass(frozen=True)
class KVLayout:
    num_layers: int
    n_kv_heads: int
    head_dim_k: int
    head_dim_v: int


class KVCache:
    def __init__(
        self,
        layout: KVLayout,
        num_blocks: int,
        block_size: int = 16,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        v_dtype: torch.dtype | None = None,
    ):
        self.layout = layout
        self.block_size = block_size
        self.num_blocks = num_blocks
        n = num_blocks * block_size
        self.k = [torch.zeros(layout.n_kv_heads, n, layout.head_dim_k, dtype=dtype, device=device) for _ in range(layout.num_layers)]
        v_dtype = v_dtype or dtype
        self.v = [torch.zeros(layout.n_kv_heads, n, layout.head_dim_v, dtype=v_dtype, device=device) for _ in range(layout.num_layers)]
        self.allocator = BlockAllocator(num_blocks)

    @staticmethod
    def bytes_needed(layout: KVLayout, num_tokens: int, dtype: torch.dtype = torch.float32,
                     v_dtype: torch.dtype | None = None) -> int:
        bits = layout.head_dim_k * torch.finfo(dtype).bits + layout.head_dim_v * torch.finfo(v_dtype or dtype).bits
        return layout.n_kv_heads * layout.num_layers * num_tokens * bits // 8

    @property
    def device(self) -> torch.device:
        return self.k[0].device

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store K/V of tokens ([T, n_kv_heads, head_dim]) at pool indices `slots` ([T])."""
        self.k[layer].index_copy_(1, slots, k.transpose(0, 1).to(self.k[layer].dtype))
        self.v[layer].index_copy_(1, slots, v.transpose(0, 1).to(self.v[layer].dtype))

    def read(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K/V at pool indices `slots`, token-major: [T, n_kv_heads, head_dim]."""
        return self.k[layer][:, slots].transpose(0, 1), self.v[layer][:, slots].transpose(0, 1)

    def gather(self, layer: int, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K/V at pool indices `index` ([B, C]), head-major: [n_kv_heads, B, C, head_dim]."""
        flat = index.reshape(-1)
        k = self.k[layer].index_select(1, flat)
        v = self.v[layer].index_select(1, flat)
        return k.view(k.shape[0], *index.shape, k.shape[-1]), v.view(v.shape[0], *index.shape, v.shape[-1])

    def copy_tokens(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy K/V entries between pool indices in every layer (used to un-share a block)."""
        for layer in range(self.layout.num_layers):
            self.k[layer][:, dst] = self.k[layer][:, src]
            self.v[layer][:, dst] = self.v[layer][:, src]


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
        device = self.cache.device
        for i in range(first_block, len(self.blocks)):
            block = self.blocks[i]
            if self.cache.allocator.ref_counts[block] <= 1:
                continue
            fresh = self.cache.allocator.allocate()
            src = torch.arange(block * bs, block * bs + bs, device=device)
            dst = torch.arange(fresh * bs, fresh * bs + bs, device=device)
            self.cache.copy_tokens(src, dst)
            self.cache.allocator.release(block)
            self.blocks[i] = fresh
