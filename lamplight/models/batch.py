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

The rows are flattened once, as numpy (lamplight.models.rows, what the native forward reads);
this module puts them on a device as PyTorch tensors and adds the attention groups the PyTorch
path computes with. SequenceChunk, GivenRows and count_leading_decode are lamplight.models.chunks'
(imported from here too).
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

from .chunks import GivenRows, SequenceChunk, count_leading_decode
from .rows import BatchRows, batch_rows

__all__ = ["AttentionGroup", "DECODE_KEY_ALIGN", "ForwardBatch", "GivenRows", "SequenceChunk", "build_forward_batch",
           "count_leading_decode"]


# Query rows of one (KV head, sequence) matmul are padded to a multiple of this, and computed in
# products of exactly this many rows (lamplight.models.layers._grouped_attention): MKL chooses
# its kernels by the product's sizes, and a row of one kernel is summed in another order than
# the same row of another, which would make a query's attention depend on how many queries came
# with it. On AMD (Zen 5) padding to 4 rows was enough; Intel's MKL paths use other kernels for
# every product under 16 rows, and its threads split a lone product differently from a batch.
QUERY_ROW_MULTIPLE = 16


def padded_query_rows(n_queries: int, heads_per_kv: int) -> int:
    """The rows of one (KV head, sequence) score matmul: its queries' heads, padded."""
    return -(-n_queries * heads_per_kv // QUERY_ROW_MULTIPLE) * QUERY_ROW_MULTIPLE


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

    def host_rows(self) -> BatchRows:
        """The batch's rows as numpy arrays on the CPU (what the native forward reads), from its
        tensors as they are (a test may have changed one)."""
        host = lambda t: None if t is None else t.cpu().numpy()  # noqa: E731
        rows, values = self.embedding_overrides or (None, None)
        return BatchRows(host(self.token_ids), host(self.positions), host(self.kv_write_slots), host(self.logit_rows),
                         self.chunks, host(rows), None if values is None else host(values.float()),
                         host(self.key_ends), self.leading_decode_tokens)

    @property
    def groups(self) -> list[AttentionGroup]:
        """The PyTorch path's attention groups (built on first use: the native forward reads the
        chunks' key slots directly and never needs them)."""
        if self._groups is None:
            self._groups = _make_groups(self.chunks, self.device)
        return self._groups


def build_forward_batch(chunks: Sequence[SequenceChunk], device: torch.device | str = "cpu") -> ForwardBatch:
    rows = batch_rows(chunks)
    on_device = lambda a: None if a is None else torch.from_numpy(a).to(device)  # noqa: E731
    given = on_device(rows.given_rows)
    return ForwardBatch(
        token_ids=on_device(rows.token_ids),
        positions=on_device(rows.positions),
        kv_write_slots=on_device(rows.kv_write_slots),
        logit_rows=on_device(rows.logit_rows),
        chunks=rows.chunks,
        embedding_overrides=None if given is None else (given, on_device(rows.given_values)),
        key_ends=on_device(rows.key_ends),
        leading_decode_tokens=rows.leading_decode_tokens,
        device=device,
    )


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
