"""Speculative decoding with a draft model (-md, kind draft-simple).

A smaller model with the target's vocabulary guesses each sequence's next tokens: its likeliest
token at each position (among its 10 likeliest, llama-server's draft sampler), one forward per
drafted position for all drafting sequences together, as llama-server's draft-simple does.

It keeps its own K/V for each engine slot: the tokens it last read there. A step reads only
what the slot's sequence gained since (the tokens the model accepted and its own next one), from
the first position where the two differ: a rejected draft's tokens are dropped, a new request in
the slot reuses the prefix it shares with the last. The model verifies every draft
(lamplight.engine.speculation), so what the draft model computes changes how many tokens a step
keeps, never which.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..models.chunks import SequenceChunk
from ..runner.base import ModelRunner
from ..speculative.config import DRAFT_MODEL_KIND, DraftModelSizes
from ..state.kv_types import KVType
from .config import CACHE_TYPES, EngineConfig
from .kv_cache import BlockTable, KVCache
from .slots import common_prefix
from .types import is_placeholder

TOP_K = 10  # llama-server's draft sampler: top-k 10, drafting the likeliest while its probability >= p_min
PLACEHOLDER_TOKEN = 0  # an image position, which the draft model cannot see: read as token 0


@dataclass
class SlotRead:
    """The draft model's K/V for one engine slot: the tokens it holds, in order."""

    table: BlockTable
    tokens: list[int] = field(default_factory=list)
    last_used: int = 0

    def forget_from(self, n: int) -> None:
        self.table.truncate(n)
        del self.tokens[n:]


@dataclass
class _Job:
    """One sequence's draft this step."""

    drafter: "ModelDrafter"
    read: SlotRead
    tokens: list[int]  # the sequence's tokens, its last one not yet computed by either model
    limit: int
    draft: list[int] = field(default_factory=list)

    @property
    def pending(self) -> int:
        return len(self.tokens) - len(self.read.tokens)


class DraftModel:
    """The draft model, its K/V pool (as many tokens as the model's), and each slot's read."""

    def __init__(self, runner: ModelRunner, num_tokens: int, k_dtype: KVType, v_dtype: KVType,
                 sizes: DraftModelSizes, target_vocab: int, max_rows: int, block_size: int = 16):
        self.runner = runner
        self.sizes = sizes
        self.target_vocab = target_vocab
        self.max_rows = max_rows  # the most rows one forward of the draft model computes (-ub)
        self.state = runner.new_state(num_tokens, k_dtype, v_dtype)
        self.cache = KVCache(self.state.kv, block_size)
        self.reads: dict[int, SlotRead] = {}
        self._clock = 0
        runner.warm_up(self.state)

    def drafter(self, slot_id: int) -> "ModelDrafter":
        return ModelDrafter(self, slot_id)

    def prepare(self, wants: list[tuple["ModelDrafter", list[int], int]]) -> None:
        """Draft for every (drafter, the sequence's tokens, most tokens) at once; each drafter
        then holds its draft for these tokens."""
        self._clock += 1
        busy = {drafter.slot_id for drafter, _, _ in wants}
        jobs = []
        for drafter, tokens, limit in wants:
            drafter.prepared = (len(tokens), [])
            limit = min(limit, self.sizes.n_max)
            if limit > 0 and tokens:
                job = self._job(drafter, tokens, limit, busy)
                if job is not None:
                    jobs.append(job)
        drafting = self._catch_up(jobs)
        while drafting:
            drafting = self._draft_step(drafting)
        for job in jobs:
            job.read.table.truncate(len(job.read.tokens))  # the blocks reserved for drafting and not used
            draft = job.draft if len(job.draft) >= self.sizes.n_min else []
            job.drafter.prepared = (len(job.tokens), draft)

    def _job(self, drafter: "ModelDrafter", tokens: list[int], limit: int, busy: set[int]) -> _Job | None:
        """The sequence's read cut to what it shares with `tokens` (all but their last at most:
        the last is read for its logits), with room for the tokens and the draft; None: no room."""
        read = self.reads.get(drafter.slot_id)
        if read is None:
            read = self.reads[drafter.slot_id] = SlotRead(BlockTable(self.cache))
        tokens = [PLACEHOLDER_TOKEN if is_placeholder(t) else t for t in tokens]
        read.forget_from(min(common_prefix(read.tokens, tokens), len(tokens) - 1))
        read.last_used = self._clock
        end = len(tokens) + limit - 1  # the last drafted token is not read
        if not self._make_room(read, end, busy):
            return None
        read.table.reserve(end)
        return _Job(drafter, read, tokens, limit)

    def _make_room(self, read: SlotRead, end: int, busy: set[int]) -> bool:
        """Free blocks for `read` to reach `end` positions: other slots' reads give theirs back,
        least recently used first (they are read again when their slot drafts next)."""
        bs = self.cache.block_size
        need = -(-end // bs) - len(read.table.blocks)
        idle = sorted((r for slot, r in self.reads.items() if slot not in busy and r.table.blocks),
                      key=lambda r: r.last_used)
        while need > self.cache.allocator.num_free and idle:
            idle.pop(0).forget_from(0)
        return need <= self.cache.allocator.num_free

    def _catch_up(self, jobs: list[_Job]) -> list[_Job]:
        """Read every job's pending tokens (at most max_rows a forward); the jobs whose first
        drafted token was taken and that may draft more."""
        drafting = []
        while True:
            chunks, last = [], []
            budget = self.max_rows
            for job in jobs:
                if job.pending <= 0 or budget <= 0:
                    continue
                start = len(job.read.tokens)
                end = min(len(job.tokens), start + budget)
                chunks.append(SequenceChunk(job.tokens[start:end], start, job.read.table.slots(0, end),
                                            need_logits=end == len(job.tokens)))
                job.read.tokens.extend(job.tokens[start:end])
                job.read.table.num_tokens = end
                budget -= end - start
                if end == len(job.tokens):
                    last.append(job)
            if not chunks:
                return drafting
            logits = self.runner.step(chunks, self.state)
            drafting.extend(job for i, job in enumerate(last) if self._take(job, logits[i]))

    def _draft_step(self, jobs: list[_Job]) -> list[_Job]:
        """Read each job's last drafted token; the jobs that drafted one more and may go on."""
        chunks = []
        for job in jobs:
            pos = len(job.read.tokens)
            token = job.draft[-1]
            chunks.append(SequenceChunk([token], pos, job.read.table.slots(0, pos + 1)))
            job.read.tokens.append(token)
            job.read.table.num_tokens = pos + 1
        logits = self.runner.step(chunks, self.state)
        return [job for i, job in enumerate(jobs) if self._take(job, logits[i])]

    def _take(self, job: _Job, logits: np.ndarray) -> bool:
        """Draft the likeliest token of `logits` (a row) unless its probability among the TOP_K
        likeliest is under p_min or the model has no such token; whether the job may draft another."""
        token = int(logits.argmax())
        if self.sizes.p_min > 0 and _share_among_the_best(logits, token) < self.sizes.p_min:
            return False
        if token >= self.target_vocab:
            return False
        job.draft.append(token)
        return len(job.draft) < job.limit


def _share_among_the_best(logits: np.ndarray, token: int) -> float:
    """The probability of `token`, the likeliest, in the softmax of the TOP_K largest logits."""
    k = min(TOP_K, logits.shape[-1])
    best = np.partition(logits, logits.shape[-1] - k)[-k:].astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        return float(1.0 / np.exp(best - logits[token]).sum())


def new_draft_model(runner: ModelRunner, num_tokens: int, cfg: EngineConfig, target_vocab: int) -> DraftModel:
    """The draft model (-md) with a pool of `num_tokens` (the model's), its K/V stored as
    -ctkd/-ctvd say, else as its runner stores by default."""
    spec = cfg.speculative
    k_type = spec.draft_cache_type_k or runner.default_cache_type
    v_type = spec.draft_cache_type_v or runner.default_cache_type
    return DraftModel(runner, num_tokens, CACHE_TYPES[k_type], CACHE_TYPES[v_type], spec.draft, target_vocab,
                      cfg.n_ubatch, cfg.block_size)


class ModelDrafter:
    """A sequence's draft-model drafter (lamplight.speculative's Drafter interface): the engine
    prepares every sequence's draft together (DraftModel.prepare); `draft` hands it out, or
    drafts alone when none was prepared for these tokens."""

    kind = DRAFT_MODEL_KIND

    def __init__(self, model: DraftModel, slot_id: int):
        self.model = model
        self.slot_id = slot_id
        self.prepared: tuple[int, list[int]] | None = None  # (the sequence's length, the draft)

    def begin(self, tokens: list[int]) -> None:
        """Nothing to do: the first draft reads the prompt (what the slot's read does not hold)."""

    def reset(self, tokens: list[int]) -> None:
        self.prepared = None

    def draft(self, tokens: list[int], limit: int) -> list[int]:
        if self.prepared is None or self.prepared[0] != len(tokens):
            self.model.prepare([(self, tokens, limit)])
        draft = self.prepared[1][:limit]
        self.prepared = None
        return draft

    def accepted(self, n_accepted: int) -> None:
        """Nothing to do: the next draft finds where the sequence left the draft."""
