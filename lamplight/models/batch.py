"""The flattened batch one forward step runs on.

A step holds tokens of several sequences at once: one decode token for each generating slot and
prompt chunks of new requests. All tokens are flattened into one list (ids, positions, where
their K/V is written in the paged pool). Attention is computed per *group*: all single-token
(decode) sequences form one group; each prompt chunk forms its own group. Inside a group the
queries and keys of each sequence are padded to a common length and masked, so one attention
call serves the group. The masks are built once per step and shared by all layers.

A chunk may carry given rows (GivenRows: an image's embeddings at some of its positions), which
replace those rows' token embeddings; a non-causal span of them is masked so that its rows see
each other both ways.
"""

from __future__ import annotations

# Attention groups pad every sequence's keys to a multiple of this, so a query's attention sums
# run over the same aligned lengths whether it decodes alone, beside longer sequences, or sits
# in a prompt chunk (batch invariance: unaligned tails are summed in another order by the CPU
# kernels).
DECODE_KEY_ALIGN = 64

from dataclasses import dataclass, field
from typing import Sequence

import torch
import torch.nn.functional as F


# Query rows of one (KV head, sequence) matmul are padded to a multiple of this: MKL computes a
# row of a 1-3 row product (or of a remainder block) in another order than the rows of a larger
# one, which would make a query's attention depend on how many queries came with it.
QUERY_ROW_MULTIPLE = 4


def padded_query_rows(n_queries: int, heads_per_kv: int) -> int:
    """The rows of one (KV head, sequence) score matmul: its queries' heads, padded."""
    return -(-n_queries * heads_per_kv // QUERY_ROW_MULTIPLE) * QUERY_ROW_MULTIPLE


@dataclass(frozen=True, eq=False)
class GivenRows:
    """Embeddings given for rows [first, first + n) of a chunk (counted from the chunk's first
    token): they replace the token embeddings as they are, without the model's embedding scale
    (an image's projector rows). `non_causal`: these rows attend to each other both ways (gemma3's
    image rows; text stays causal), so the chunk must hold all of them."""

    first: int
    values: torch.Tensor  # float32 [n, n_embd]
    non_causal: bool = False

    @property
    def n_rows(self) -> int:
        return int(self.values.shape[0])


@dataclass(frozen=True)
class SequenceChunk:
    """The part of one sequence computed in this step.

    `kv_slots` lists, in position order, the pool index of every K/V entry the chunk attends to:
    the cached context followed by the chunk's own tokens (whose entries are written this step).
    `state_slot` is the recurrent state slot the sequence owns (models with recurrent layers):
    read at the chunk's start, written at its end. The slot must hold the state after exactly
    `start_pos` tokens (a chunk at 0 starts from zeros whatever the slot held).
    """

    token_ids: Sequence[int]
    start_pos: int
    kv_slots: Sequence[int]
    need_logits: bool = True  # usually only the last chunk of a prompt, or a decode token
    all_logits: bool = False  # logits for every token of the chunk (teacher forcing, scoring)
    state_slot: int = 0
    given_rows: tuple[GivenRows, ...] = field(default=(), compare=False)  # media rows, in row order


@dataclass
class AttentionGroup:
    query_rows: torch.Tensor  # [B, Q] row of each query in the flattened batch (padding: 0)
    query_valid: torch.Tensor  # [B, Q] bool
    kv_index: torch.Tensor  # [B, C] pool index of each key (padding: 0)
    mask: torch.Tensor  # [B, 1, Q, C] bool: query may attend key (causal, valid)
    query_pos: torch.Tensor  # [B, Q] query positions (for sliding windows)
    key_pos: torch.Tensor  # [B, C]
    # Decode groups (one query per sequence) only: whether their rows are the batch's first B.
    leading_rows: bool = False
    _window_masks: dict[int, torch.Tensor] = field(default_factory=dict)
    _biases: dict[tuple, torch.Tensor] = field(default_factory=dict)

    @property
    def is_decode(self) -> bool:
        return self.query_rows.shape[1] == 1

    def row_bias(self, window: int | None, n_kv_heads: int, heads_per_kv: int) -> torch.Tensor:
        """The mask as an additive bias (0 or -inf) in the layout of the batched score matmul
        (lamplight.models.layers._grouped_attention): [n_kv_heads * B, M, C], M the group's
        queries times heads_per_kv padded to the matmul's row multiple (padding rows 0, they are
        dropped); shared by all layers of a step."""
        key = (window, n_kv_heads, heads_per_kv)
        if key not in self._biases:
            mask = self.mask if window is None else self.window_mask(window)
            b, n_q, c = mask.shape[0], mask.shape[2], mask.shape[-1]
            bias = torch.zeros(b, n_q, c, device=mask.device).masked_fill_(~mask.view(b, n_q, c), float("-inf"))
            bias = bias[:, :, None].expand(b, n_q, heads_per_kv, c).reshape(b, n_q * heads_per_kv, c)
            rows = padded_query_rows(n_q, heads_per_kv)
            bias = F.pad(bias, (0, 0, 0, rows - n_q * heads_per_kv))
            self._biases[key] = bias[None].expand(n_kv_heads, b, rows, c).reshape(-1, rows, c)
        return self._biases[key]

    def window_mask(self, window: int) -> torch.Tensor:
        """The mask restricted to keys less than `window` positions behind the query."""
        if window not in self._window_masks:
            near = (self.query_pos[:, :, None] - self.key_pos[:, None, :]) < window
            self._window_masks[window] = self.mask & near[:, None]
        return self._window_masks[window]


@dataclass
class ForwardBatch:
    token_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    kv_write_slots: torch.Tensor  # [T] pool index where each token's K/V is stored
    logit_rows: torch.Tensor  # [N] rows whose logits are returned, in chunk order
    chunks: Sequence[SequenceChunk]  # what the batch was built from, in row order
    # Optional embeddings that replace token embeddings at given rows (multimodal splicing):
    # (rows [R], values [R, n_embd]), used without the model's embedding scale.
    embedding_overrides: tuple[torch.Tensor, torch.Tensor] | None = None
    # Per row, the end (exclusive) of the key positions it attends to; None: every row is causal
    # (position + 1). Rows of a non-causal span see up to the span's end.
    key_ends: torch.Tensor | None = None
    # How many leading rows are single-token (decode) chunks; kernels may treat them apart.
    leading_decode_tokens: int = 0
    device: torch.device | str = "cpu"
    _groups: list[AttentionGroup] | None = None

    @property
    def groups(self) -> list[AttentionGroup]:
        """The PyTorch path's attention groups (built on first use: the native forward reads the
        chunks' key slots directly and never needs them)."""
        if self._groups is None:
            self._groups = _make_groups(self.chunks, self.device)
        return self._groups


def build_forward_batch(chunks: Sequence[SequenceChunk], device: torch.device | str = "cpu") -> ForwardBatch:
    token_ids: list[int] = []
    positions: list[int] = []
    write_slots: list[int] = []
    logit_rows: list[int] = []
    given = _GivenCollector()
    for chunk in chunks:
        n = len(chunk.token_ids)
        if n == 0:
            raise ValueError("a sequence chunk must hold at least one token")
        if len(chunk.kv_slots) != chunk.start_pos + n:
            raise ValueError("kv_slots must cover the cached context and the chunk's own tokens")
        first_row = len(token_ids)
        token_ids.extend(chunk.token_ids)
        given.add(chunk, first_row, token_ids)
        positions.extend(range(chunk.start_pos, chunk.start_pos + n))
        write_slots.extend(chunk.kv_slots[chunk.start_pos :])
        if chunk.all_logits:
            logit_rows.extend(range(first_row, first_row + n))
        elif chunk.need_logits:
            logit_rows.append(first_row + n - 1)
    as_long = lambda xs: torch.tensor(xs, dtype=torch.long, device=device)  # noqa: E731
    return ForwardBatch(
        token_ids=as_long(token_ids),
        positions=as_long(positions),
        kv_write_slots=as_long(write_slots),
        logit_rows=as_long(logit_rows),
        chunks=list(chunks),
        embedding_overrides=given.overrides(device),
        key_ends=given.key_ends(positions, device),
        leading_decode_tokens=count_leading_decode(chunks),
        device=device,
    )


class _GivenCollector:
    """The chunks' given rows as ForwardBatch's overrides and key ends. The rows' token ids
    (placeholders, outside the vocabulary) become 0 for the embedding lookup they skip."""

    def __init__(self):
        self.rows: list[int] = []
        self.values: list[torch.Tensor] = []
        self.spans: list[tuple[int, int]] = []  # (first row, end row) of each non-causal span

    def add(self, chunk: SequenceChunk, first_row: int, token_ids: list[int]) -> None:
        n = len(chunk.token_ids)
        for given in chunk.given_rows:
            if not 0 <= given.first <= given.first + given.n_rows <= n:
                raise ValueError(f"given rows [{given.first}, {given.first + given.n_rows}) are outside the chunk "
                                 f"of {n} tokens")
            start = first_row + given.first
            self.rows.extend(range(start, start + given.n_rows))
            token_ids[start:start + given.n_rows] = [0] * given.n_rows
            self.values.append(given.values)
            if given.non_causal:
                self.spans.append((start, start + given.n_rows))

    def overrides(self, device) -> tuple[torch.Tensor, torch.Tensor] | None:
        if not self.rows:
            return None
        rows = torch.tensor(self.rows, dtype=torch.long, device=device)
        return rows, torch.cat(self.values).to(device=device, dtype=torch.float32)

    def key_ends(self, positions: list[int], device) -> torch.Tensor | None:
        if not self.spans:
            return None
        ends = [p + 1 for p in positions]
        for first, end in self.spans:
            ends[first:end] = [positions[end - 1] + 1] * (end - first)
        return torch.tensor(ends, dtype=torch.long, device=device)


def _make_groups(chunks: Sequence[SequenceChunk], device) -> list[AttentionGroup]:
    """All single-token chunks in one group, then one group per longer chunk."""
    decode: list[tuple[int, SequenceChunk]] = []
    prefill: list[tuple[int, SequenceChunk]] = []
    first_row = 0
    for chunk in chunks:
        (decode if len(chunk.token_ids) == 1 else prefill).append((first_row, chunk))
        first_row += len(chunk.token_ids)
    groups = []
    if decode:
        groups.append(_make_group(decode, device))
    groups.extend(_make_group([item], device) for item in prefill)
    return groups


def count_leading_decode(chunks: Sequence[SequenceChunk]) -> int:
    """How many chunks at the start of a step are single tokens (decode tokens)."""
    return next((i for i, c in enumerate(chunks) if len(c.token_ids) != 1), len(chunks))


def _make_group(items: list[tuple[int, SequenceChunk]], device) -> AttentionGroup:
    n_q = max(len(c.token_ids) for _, c in items)
    n_k = max(len(c.kv_slots) for _, c in items)
    n_k = -(-n_k // DECODE_KEY_ALIGN) * DECODE_KEY_ALIGN
    b = len(items)
    query_rows = torch.zeros(b, n_q, dtype=torch.long)
    query_valid = torch.zeros(b, n_q, dtype=torch.bool)
    query_pos = torch.zeros(b, n_q, dtype=torch.long)
    kv_index = torch.zeros(b, n_k, dtype=torch.long)
    key_valid = torch.zeros(b, n_k, dtype=torch.bool)
    for i, (first_row, chunk) in enumerate(items):
        q = len(chunk.token_ids)
        k = len(chunk.kv_slots)
        query_rows[i, :q] = torch.arange(first_row, first_row + q)
        query_valid[i, :q] = True
        query_pos[i, :q] = torch.arange(chunk.start_pos, chunk.start_pos + q)
        kv_index[i, :k] = torch.as_tensor(chunk.kv_slots, dtype=torch.long)
        key_valid[i, :k] = True
    key_pos = torch.arange(n_k).expand(b, n_k)
    leading = n_q == 1 and [first_row for first_row, _ in items] == list(range(b))
    # Padded queries sit at position 0 and may see key 0, so no softmax row is all -inf.
    causal = key_pos[:, None, :] <= query_pos[:, :, None]
    for i, (_, chunk) in enumerate(items):
        for given in chunk.given_rows:
            if given.non_causal:  # the span's rows see each other both ways
                first, pos = given.first, chunk.start_pos + given.first
                causal[i, first:first + given.n_rows, pos:pos + given.n_rows] = True
    mask = (causal & key_valid[:, None, :])[:, None]
    return AttentionGroup(
        query_rows=query_rows.to(device),
        query_valid=query_valid.to(device),
        kv_index=kv_index.to(device),
        mask=mask.to(device),
        query_pos=query_pos.to(device),
        key_pos=key_pos.contiguous().to(device),
        leading_rows=leading,
    )
