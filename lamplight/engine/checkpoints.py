"""Recurrent-state checkpoints: how a follow-up turn on a hybrid model avoids re-reading its prompt.

A recurrent layer's state (lamplight.state.recurrent) holds the whole history folded into a fixed
size, so unlike K/V it cannot be cut back to an earlier position. A slot therefore keeps
snapshots of its state at these positions (the engine cuts prompt chunks there):
- multiples of `interval`, in prompts and generated text alike;
- PROMPT_END_OFFSET tokens before a prompt's end: the state before the generation prompt, which
  the next turn of a chat shares even when it renders the previous reply otherwise (a template
  that strips the reply's thinking, a reply whose text tokenizes differently; llama.cpp's server
  keeps one there too);
- in generated text, every `reply_interval` tokens as well (multiples of it): a follow-up that
  repeats a reply and diverges inside it (its text tokenized otherwise, an edit) re-reads at
  most reply_interval - 1 tokens of it, where a transformer keeps its whole cache.
A request whose common prefix with the slot's tokens ends anywhere resumes from the live state
when the prefix is everything the slot holds, or else from the last checkpoint inside the
prefix: it re-reads at most `interval - 1` tokens of its prefix, never the whole prompt
(llama.cpp's server re-reads everything when the prefix diverges after its last checkpoint).
The recurrences compute a token the same way in a prompt chunk and a decode step (token by
token), so where a checkpoint lies changes no bit of what follows it.

Each slot keeps at most `max_per_slot` checkpoints (`--ctx-checkpoints`). When full, the oldest
is dropped, except the last one at or before the current request's prompt end: that is the one a
follow-up needs when the reply is not repeated verbatim (templates that strip a reply's thinking).

Snapshots are copies and never change, so a slot's checkpoints can be shared with the sibling
choices (`n > 1`) that fork from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Tokens between two checkpoints (and where prompt chunks of recurrent models are cut).
DEFAULT_INTERVAL = 256
# Checkpoints kept per slot unless --ctx-checkpoints says otherwise (llama-server's default).
DEFAULT_PER_SLOT = 8
# A checkpoint this many tokens before a prompt's end (llama-server's offset): chat templates'
# generation prompts are a few tokens ("<|im_start|>assistant\n"), before which the next turn
# of the conversation renders the same tokens.
PROMPT_END_OFFSET = 4
# Generated text is also snapshot every this many tokens (at most; never more often than the
# interval): a snapshot costs one copy of the state (19 MiB for Qwen 3.5 0.8B: a few ms, against
# 32 decode steps of 40 ms), and the budget of --ctx-checkpoints stays what it is.
REPLY_INTERVAL = 32


@dataclass(frozen=True)
class Checkpoint:
    n_tokens: int  # the state after this many tokens of the slot's sequence
    state: Any  # ModelState.snapshot(): one flat float32 array (a tensor for a PyTorch pool)


class CheckpointStore:
    """Every slot's checkpoints, each slot's sorted by position."""

    def __init__(self, n_slots: int, max_per_slot: int = DEFAULT_PER_SLOT, interval: int = DEFAULT_INTERVAL):
        if max_per_slot < 0:
            raise ValueError(f"--ctx-checkpoints must be >= 0, not {max_per_slot}")
        if interval < 1:
            raise ValueError(f"the checkpoint interval must be >= 1, not {interval}")
        self.max_per_slot = max_per_slot
        self.interval = interval
        self.reply_interval = min(interval, REPLY_INTERVAL)
        self._slots: list[list[Checkpoint]] = [[] for _ in range(n_slots)]

    def positions(self, slot: int) -> list[int]:
        return [c.n_tokens for c in self._slots[slot]]

    def is_boundary(self, n_tokens: int, n_prompt: int) -> bool:
        """Whether the state after `n_tokens` of a sequence whose prompt has `n_prompt` tokens is kept."""
        if self.max_per_slot == 0 or n_tokens <= 0:
            return False
        return (n_tokens % self.interval == 0 or n_tokens == n_prompt - PROMPT_END_OFFSET
                or (n_tokens > n_prompt and n_tokens % self.reply_interval == 0))

    def chunk_end(self, start: int, end: int, n_prompt: int) -> int:
        """Where a prompt chunk from `start` wanting to reach `end` must stop: at the first
        checkpoint position strictly inside it, so that the state there can be saved."""
        if self.max_per_slot == 0:
            return end
        boundary = (start // self.interval + 1) * self.interval
        before_end = n_prompt - PROMPT_END_OFFSET
        return min(end, boundary, before_end if before_end > start else end)

    def add(self, slot: int, checkpoint: Checkpoint, protect_until: int) -> None:
        """Keep `checkpoint`; past the budget, drop the oldest one other than the last one at or
        before `protect_until` (the running request's prompt length)."""
        kept = [c for c in self._slots[slot] if c.n_tokens != checkpoint.n_tokens]
        kept.append(checkpoint)
        kept.sort(key=lambda c: c.n_tokens)
        while len(kept) > self.max_per_slot:
            protected = self._last_at_or_before(kept, protect_until)
            victim = next(c for c in kept if c is not protected) if len(kept) > 1 else kept[0]
            kept.remove(victim)
        self._slots[slot] = kept

    def best(self, slot: int, limit: int) -> Checkpoint | None:
        """The checkpoint furthest along at or before position `limit`."""
        return self._last_at_or_before(self._slots[slot], limit)

    def drop_after(self, slot: int, n_tokens: int) -> None:
        """Forget checkpoints past `n_tokens` (the slot's tokens after it are being replaced)."""
        self._slots[slot] = [c for c in self._slots[slot] if c.n_tokens <= n_tokens]

    def clear(self, slot: int) -> None:
        self._slots[slot] = []

    def share(self, src: int, dst: int) -> None:
        """`dst` forks from `src` (n > 1 choices): the same checkpoints, which never change."""
        self._slots[dst] = list(self._slots[src])

    @staticmethod
    def _last_at_or_before(checkpoints: list[Checkpoint], limit: int) -> Checkpoint | None:
        found = None
        for checkpoint in checkpoints:
            if checkpoint.n_tokens <= limit:
                found = checkpoint
        return found

    def bytes_held(self) -> int:
        return sum(c.state.nbytes for slot in self._slots for c in slot)
