"""The engine: one thread owns the model and the KV cache and runs continuous batching steps.

HTTP handlers call `submit()` (thread-safe) and read events from the returned handle on their
event loop; the model never runs on the event loop thread. Each step decodes one token for
every generating sequence and fills the rest of the step's token budget (`n_ubatch`) with
prompt chunks of new requests, so a long prompt never stalls running streams. Image rows
(GenerationRequest.media, encoded before submit) ride in their prompt chunks as given rows; a
chunk never splits a non-causal image (Sequence.prompt_chunk_end).

Modules around this one: scheduler (the waiting queue and fair admission), slots, handle (the
caller's side of a request), lora_sets, slot_actions (save/restore/erase), views (/slots JSON).

Failures stay with their request: whatever goes wrong while a request starts, samples or
handles its token ends that request alone with an ErrorEvent; its neighbours go on.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import itertools
import logging
import threading
import time
from typing import Callable

import numpy as np

from ..grammar import fill_masks
from ..heap import release_freed_memory
from ..models.chunks import SequenceChunk
from ..models.lora import LoraAdapter
from ..runner.base import ModelRunner
from ..sampling import SequenceSampler, sample_batch
from ..speculative import SpecRequest, SpeculatorFactory
from ..speculative.config import types_text
from . import slot_actions, views
from .checkpoints import Checkpoint, CheckpointStore
from .config import EngineConfig
from .draft_model import new_draft_model
from .draft_policy import DraftPolicy
from .handle import RequestHandle
from ..state import StateSpec
from .kv_cache import KVCache
from .kv_room import KVRoom
from .prompt_cache import PromptCache
from .lora_sets import LoraSets, one_lora_set
from .scheduler import Scheduler
from .sequence import Sequence, SeqState
from .slot_files import load_slot
from .slots import Slot, common_prefix
from .speculation import SpecStats, draft_chunks, draft_limit, verify_chunk
from .types import (
    ContextExceededError,
    ErrorEvent,
    GenerationRequest,
    InvalidRequestError,
    PromptProgress,
    is_placeholder,
)

__all__ = ["Engine", "RequestHandle", "Slot", "common_prefix"]

log = logging.getLogger("lamplight.engine")

# Seconds without work after which the engine gives the steps' freed memory back (lamplight.heap).
IDLE_RELEASE_S = 0.5



def _rows_index(rows: list[int]) -> slice | list[int]:
    """`rows` as a slice where they are consecutive (a view of the logits, not a copy: a verified
    draft's rows are, when the runner computes its chunk as decode rows)."""
    if rows[-1] - rows[0] + 1 == len(rows):
        return slice(rows[0], rows[-1] + 1)
    return rows

class Engine:
    def __init__(
        self, runner: ModelRunner, tokenizer, config: EngineConfig | None = None, loras: list[LoraAdapter] | None = None,
        draft_runner: ModelRunner | None = None,
    ):
        """`runner` computes every step (lamplight.loader.build_runner); `loras`: the adapters it
        was built with (attached here if it was not), in id order; `draft_runner`: a draft model
        for speculative decoding (-md), with the runner's vocabulary."""
        self.runner = runner
        self.lora_sets = LoraSets(runner, loras)
        self.tokenizer = tokenizer
        self.config = config or EngineConfig()
        self.config.validate()
        cfg = self.config
        self.n_parallel = cfg.n_parallel
        self.n_ctx_slot = min(cfg.n_ctx_slot, runner.config.n_ctx_train)  # the most tokens a sequence holds
        num_tokens = pool_tokens(cfg, self.n_ctx_slot)
        spec = runner.state_spec
        check_recurrent_options(spec, cfg)
        check_kv_fits(spec, num_tokens, cfg)
        k_dtype, v_dtype = cfg.cache_dtypes
        # One recurrent state slot per engine slot (models with recurrent layers): slot i's is i.
        self.state = runner.new_state(num_tokens, k_dtype, v_dtype, cfg.device, n_sequences=cfg.n_parallel)
        self.checkpoints = (CheckpointStore(cfg.n_parallel, cfg.ctx_checkpoints, cfg.checkpoint_interval)
                            if spec.recurrent else None)
        self.cache = KVCache(self.state.kv, cfg.block_size)
        runner.warm_up(self.state)
        self.slots = [Slot(i, self.cache) for i in range(cfg.n_parallel)]
        self.prompt_cache = PromptCache(cfg.cache_ram_mib) if cfg.cache_ram_mib else None
        self.room = KVRoom(self.cache, self.slots, self.checkpoints, keep_elsewhere=self._keep_in_ram)
        self.scheduler = Scheduler(self.slots, cfg.queue_size, cfg.slot_prompt_similarity)
        self.active: list[RequestHandle] = []
        self._wakeup = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._task_ids = itertools.count()
        self._control: collections.deque[tuple[Callable[[], object], concurrent.futures.Future]] = collections.deque()
        self.is_ready = False
        self.stats = {"prompt_tokens": 0, "generated_tokens": 0, "steps": 0, "requests": 0, "failed": 0}
        # Speculative decoding (--spec-type, a request's speculative.type): not for recurrent
        # layers, whose state cannot take back the tokens a draft got wrong.
        self.draft_model = None
        if draft_runner is not None and not spec.recurrent:
            self.draft_model = new_draft_model(draft_runner, num_tokens, cfg, runner.config.vocab_size)
        self.speculation = None if spec.recurrent else SpeculatorFactory(
            cfg.speculative, self.draft_model.drafter if self.draft_model is not None else None)
        self.spec_stats = SpecStats()
        self.draft_policy = DraftPolicy() if self.speculation is not None and cfg.speculative.adaptive else None
        self._step_drafts: tuple[int, bool, float] | None = None  # this step's (decoding sequences, drafted, draft model seconds)

    @property
    def loras(self) -> list[LoraAdapter]:
        return self.lora_sets.adapters

    @property
    def waiting(self) -> collections.deque[RequestHandle]:
        return self.scheduler.waiting

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="lamplight-engine", daemon=True)
        self._thread.start()
        self.is_ready = True

    def stop(self) -> None:
        self._stop = True
        self._wake()
        if self._thread is not None:
            self._thread.join(timeout=10)

    # -- API for callers -----------------------------------------------------------------------

    def submit(self, request: GenerationRequest) -> RequestHandle:
        return self.submit_group([request])[0]

    def submit_group(self, requests: list[GenerationRequest]) -> list[RequestHandle]:
        """Queue requests that belong together (the prompts of one HTTP request) as one entry of
        the waiting queue. All or nothing: a bad one raises before any is queued."""
        for request in requests:
            self._check_request(request)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None

        def make_handles() -> list[RequestHandle]:
            task_ids = [next(self._task_ids) for _ in requests]
            handles = [RequestHandle(self, r, task_id, loop, group=task_ids[0]) for r, task_id in zip(requests, task_ids)]
            for handle in handles:
                handle.lora_key = self.lora_sets.key(handle.request)
            return handles

        handles = self.scheduler.enqueue(make_handles)
        self._wake()
        return handles

    def _check_request(self, request: GenerationRequest) -> None:
        n_prompt = len(request.prompt_tokens)
        if n_prompt == 0:
            raise InvalidRequestError("the prompt is empty")
        if n_prompt >= self.n_ctx_slot:
            raise ContextExceededError(n_prompt, self.n_ctx_slot)
        vocab = self.runner.config.vocab_size
        media_positions = check_media(request, self.runner.config.n_embd)
        bad = next((t for i, t in enumerate(request.prompt_tokens) if not 0 <= t < vocab and i not in media_positions),
                   None)
        if bad is not None:
            raise InvalidRequestError(f"prompt token id {bad} is out of range [0, {vocab})")
        budget = request.reasoning_budget
        if budget is not None and any(not 0 <= t < vocab for t in (*budget.start, *budget.end, *budget.forced)):
            raise InvalidRequestError(f"a reasoning budget marker token is out of range [0, {vocab})")
        if not 1 <= request.n_choices <= self.n_parallel:
            raise InvalidRequestError(f"n must be between 1 and the number of slots ({self.n_parallel})")
        if request.id_slot >= self.n_parallel or request.id_slot < -1:
            raise InvalidRequestError(f"id_slot {request.id_slot} is out of range (the server has {self.n_parallel} slots)")
        self.lora_sets.check(request)
        spec = request.speculative
        if spec is not None and spec.kinds and self.speculation is None:
            raise InvalidRequestError("speculative.type: this model has recurrent layers, whose state cannot take back "
                                      "rejected draft tokens; it decodes without speculation")
        if self.speculation is not None:
            try:
                self.speculation.check(spec)
            except ValueError as exc:
                raise InvalidRequestError(f"speculative.type: {exc}") from None

    # -- LoRA ----------------------------------------------------------------------------------

    def lora_json(self) -> list[dict]:
        return self.lora_sets.json()

    def set_lora_scales(self, entries: list[tuple[int, float]]) -> None:
        """Server-wide scales for requests that name none (adapters not listed get 0)."""
        self.lora_sets.set_scales(entries)

    # -- views ---------------------------------------------------------------------------------

    def kv_usage(self) -> tuple[float, int]:
        """(share of KV blocks in use, tokens the slots hold, running or kept for reuse).

        Read without a lock: a metrics scrape may be one step out of date."""
        return views.kv_usage(self.cache, self.slots)

    def speculative_types(self, request: SpecRequest | None = None) -> str:
        """The kinds a request with these speculative fields drafts with, as llama-server's
        generation_settings `speculative.types` says them (\"none\" for none)."""
        return types_text(self.speculation.kinds_for(request) if self.speculation is not None else ())

    def slots_json(self) -> list[dict]:
        """GET /slots: one entry per slot, shaped like llama-server's."""
        speculative = self.speculation is not None and self.config.speculative.enabled
        return [views.slot_json(slot, self.n_ctx_slot, speculative) for slot in self.slots]

    # -- the loop ------------------------------------------------------------------------------

    def _wake(self) -> None:
        self._wakeup.set()

    def _run(self) -> None:
        worked = False  # since the freed memory was last given back
        while not self._stop:
            self._wakeup.clear()
            try:
                worked |= self._run_control()
                self._drop_cancelled()
                self._admit_waiting()
                if self._step():
                    worked = True
                elif not self._wakeup.wait(timeout=IDLE_RELEASE_S) and worked:
                    # Quiet for a moment after work: the steps' freed blocks go back to the
                    # system, not between a burst's requests.
                    release_freed_memory()
                    worked = False
            except Exception as exc:  # never let the loop die: fail the running requests instead
                log.exception("engine step failed")
                self._fail_all(f"internal error in the engine: {exc!r}")

    # -- slot files (run on the engine thread, between steps) ---------------------------------

    def call_on_engine(self, fn: Callable[[], object], timeout: float = 60.0) -> object:
        """Run `fn` on the engine thread between steps and return its result (or raise its error)."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._control.append((fn, future))
        self._wake()
        return future.result(timeout=timeout)

    def _run_control(self) -> bool:
        """Runs the calls queued for the engine thread; whether there were any."""
        ran = bool(self._control)
        while self._control:
            fn, future = self._control.popleft()
            try:
                future.set_result(fn())
            except Exception as exc:
                future.set_exception(exc)
        return ran

    @property
    def fingerprint(self) -> str:
        return repr(self.runner.config)

    def save_slot(self, slot_id: int, path: str) -> dict:
        return self.call_on_engine(
            lambda: slot_actions.save_to_file(slot_actions.idle_slot(self.slots, slot_id), self.cache, path, self.fingerprint,
                                              self.state))

    def restore_slot(self, slot_id: int, path: str) -> dict:
        data = load_slot(path, self.fingerprint, self.n_ctx_slot)
        return self.call_on_engine(
            lambda: slot_actions.restore_from(slot_actions.idle_slot(self.slots, slot_id), self.cache, data, self.state,
                                              self.checkpoints))

    def erase_slot(self, slot_id: int) -> dict:
        return self.call_on_engine(lambda: slot_actions.erase(slot_actions.idle_slot(self.slots, slot_id)))

    # -- failures ------------------------------------------------------------------------------

    def _fail(self, handle: RequestHandle, message: str) -> None:
        """End one request with an error; its slots are freed, everything else goes on."""
        self.stats["failed"] += 1
        for seq in handle.sequences:
            seq.state = SeqState.DONE
            seq.reported = True
        handle._push(ErrorEvent(0, message))
        self._release(handle)

    def _fail_all(self, message: str) -> None:
        for handle in list(self.active):
            self._fail(handle, message)

    def _drop_cancelled(self) -> None:
        self.scheduler.drop_cancelled()
        for handle in [h for h in self.active if h.cancelled]:
            self._release(handle)

    # -- admission -----------------------------------------------------------------------------

    def _admit_waiting(self) -> None:
        for handle, slots in self.scheduler.admissions():
            try:
                self._start(handle, slots)
            except Exception as exc:
                log.exception("request %d failed to start", handle.task_id)
                self._fail(handle, f"the request failed to start: {exc!r}")

    def _start(self, handle: RequestHandle, slots: list[Slot]) -> None:
        request = handle.request
        self.stats["requests"] += 1
        for choice, slot in enumerate(slots):
            sampler = SequenceSampler(
                request.sampling,
                tokenizer=self.tokenizer,
                n_ctx=self.n_ctx_slot,
                choice_index=choice,
                eog_ids=frozenset(self.tokenizer.eog_ids),
                breakers=request.dry_breakers,
            )
            seq = Sequence(
                request, choice, slot.id, slot.table, sampler, self.tokenizer, self.n_ctx_slot, self.config.context_shift
            )
            seq.handle = handle
            slot.seq = seq
            slot.id_task = handle.task_id
            slot.n_prompt_tokens = seq.n_prompt
            slot.settings = request.settings
            handle.sequences.append(seq)
            if self.speculation is not None:
                seq.speculator = self.speculation.build(request.speculative, slot.id)
                if seq.speculator is not None:
                    seq.speculator.begin(seq.tokens)
            if choice == 0:
                self._reuse_prefix(slot, seq, request)
            else:
                slot.table.release()
                slot.cached_tokens = []
                seq.state = SeqState.WAITING_PARENT
            slot.cached_lora = handle.lora_key
        self.active.append(handle)
        if request.return_progress:
            parent = handle.sequences[0]
            handle._push(PromptProgress(0, parent.n_prompt, parent.n_cached, parent.n_cached, 0.0))

    def _reuse_prefix(self, slot: Slot, seq: Sequence, request: GenerationRequest) -> None:
        if self.prompt_cache is not None and request.cache_prompt:
            self._swap_with_ram(slot, request.prompt_tokens, seq.handle.lora_key)
        same_lora = slot.cached_lora == seq.handle.lora_key
        keep = common_prefix(slot.cached_tokens, request.prompt_tokens) if request.cache_prompt and same_lora else 0
        keep = min(keep, seq.n_prompt - 1)  # always evaluate at least one prompt token for its logits
        keep = seq.reusable_prefix(keep)
        if self.checkpoints is not None:
            keep = self._resume_recurrent(slot, keep)
        slot.table.truncate(keep)
        slot.cached_tokens = slot.cached_tokens[:keep]
        seq.n_cached = keep

    def _swap_with_ram(self, slot: Slot, prompt: list[int], lora: tuple[float, ...]) -> None:
        """The RAM prompt cache: a cached prompt sharing a longer prefix with `prompt` than the
        slot's tokens is copied into the slot; tokens of the slot that would be lost (less than
        half of them kept) are copied to RAM first, as llama-server does."""
        cache = self.prompt_cache
        kept = common_prefix(slot.cached_tokens, prompt) if slot.cached_lora == lora else 0
        entry, n = cache.best(prompt, lora)
        if entry is not None and n > kept:
            self._keep_in_ram(slot)
            if self.room.make_room(-(-len(entry.tokens) // self.cache.block_size) - len(slot.table.blocks)):
                if self.checkpoints is not None:
                    self.checkpoints.clear(slot.id)  # they were of the tokens the entry replaces
                cache.load(entry, slot, self.cache, self.state)
        elif kept < len(slot.cached_tokens) / 2:
            self._keep_in_ram(slot)

    def _keep_in_ram(self, slot: Slot) -> None:
        if self.prompt_cache is not None and slot.cached_tokens:
            self.prompt_cache.save(slot, self.cache, self.state)

    def _resume_recurrent(self, slot: Slot, keep: int) -> int:
        """Where a recurrent model's slot can resume within a common prefix of `keep` tokens: its
        live state if the prefix is all the slot holds, else its last checkpoint inside the prefix
        (restored), else the start. Checkpoints past that point are of tokens being replaced."""
        live = len(slot.cached_tokens)
        if keep != live:
            checkpoint = self.checkpoints.best(slot.id, keep)
            if checkpoint is None:
                keep = 0
            else:
                self.state.restore(slot.id, checkpoint.state, checkpoint.n_tokens)
                keep = checkpoint.n_tokens
        self.checkpoints.drop_after(slot.id, keep)
        return keep

    def _keep_checkpoints(self, plan: list[tuple[Sequence, SequenceChunk]]) -> None:
        """Snapshot the recurrent state of every sequence whose chunk ended on a checkpoint position."""
        for seq, chunk in plan:
            end = chunk.start_pos + len(chunk.token_ids)
            if self.checkpoints.is_boundary(end, seq.n_prompt) and not seq.handle.failed:
                snapshot = Checkpoint(end, self.state.snapshot(seq.slot_id))
                self.checkpoints.add(seq.slot_id, snapshot, protect_until=seq.n_prompt)

    # -- one step ------------------------------------------------------------------------------

    def _step(self) -> bool:
        """Run one forward step over everything that can progress. False if there was nothing."""
        self._step_drafts = None
        plan = self._plan_step()
        if not plan:
            self._finish_done()
            return False
        started, generated = time.perf_counter(), self.stats["generated_tokens"]  # a draft model's forwards are timed apart
        decode_only = all(seq.state == SeqState.DECODE for seq, _ in plan)
        self.lora_sets.use(plan[0][0].handle.lora_key)
        plan, logits = self._forward(plan)
        self.stats["steps"] += 1
        if self.checkpoints is not None:
            self._keep_checkpoints(plan)
        sampled_seqs = []
        rows = []
        verified: dict[Sequence, list[int]] = {}  # sequences with a draft: their rows, decode token first
        row = 0
        for seq, chunk in plan:
            seq.table.num_tokens = chunk.start_pos + len(chunk.token_ids)
            if seq.state == SeqState.PREFILL:
                self.stats["prompt_tokens"] += len(chunk.token_ids)
                if seq.resume_to is None:
                    self._progress(seq)
                elif seq.n_computed == seq.resume_to:  # computed again up to where it was preempted
                    seq.resume_to, seq.state = None, SeqState.DECODE
            if seq.draft and chunk.need_logits:
                n_rows = len(chunk.token_ids) if chunk.all_logits else 1
                verified.setdefault(seq, []).extend(range(row, row + n_rows))
                row += n_rows
            elif chunk.need_logits:
                for target in self._guarded(seq.handle, self._sampling_targets, seq, default=[]):
                    sampled_seqs.append(target)
                    rows.append(row)
                row += 1
        if sampled_seqs:
            # Most steps sample every logit row once, in order: no copy of the rows then.
            every_row = len(rows) == len(logits) and rows == list(range(len(logits)))
            self._sample_and_process(logits if every_row else logits[rows], sampled_seqs)
        for seq, seq_rows in verified.items():
            self._verify(seq, logits[_rows_index(seq_rows)])
        if self.draft_policy is not None and decode_only and self._step_drafts is not None:
            n_decode, drafted, model_seconds = self._step_drafts
            self.draft_policy.observe_step(n_decode, drafted, self.stats["generated_tokens"] - generated,
                                           time.perf_counter() - started + model_seconds)
        self._finish_done()
        return True

    def _guarded(self, handle: RequestHandle, fn: Callable, *args, default=None):
        """fn(*args), but an exception fails `handle`'s request alone (and returns `default`)."""
        if handle.failed:
            return default
        try:
            return fn(*args)
        except Exception as exc:
            self._fail_for(handle, exc)
            return default

    def _fail_for(self, handle: RequestHandle, exc: Exception) -> None:
        log.error("request %d failed in the engine", handle.task_id, exc_info=exc)
        self._fail(handle, f"internal error in the engine: {exc!r}")

    def _run_model(self, chunks: list[SequenceChunk]) -> np.ndarray:
        """The step's logits as the sampler takes them: float32 numpy on the CPU."""
        return self.runner.step(chunks, self.state)

    def _forward(self, plan: list[tuple[Sequence, SequenceChunk]]) -> tuple[list, np.ndarray | None]:
        """The step's logits, one row per chunk that needs them, and the plan entries they are for.
        If the batch fails, each sequence runs alone so that only the one(s) at fault fail (their
        K/V slots are their own, so running a chunk again rewrites the same values)."""
        try:
            return plan, self._run_model([chunk for _, chunk in plan])
        except Exception as exc:
            if len(plan) == 1:
                self._fail_for(plan[0][0].handle, exc)
                return [], None
        kept, rows = [], []
        for seq, chunk in plan:
            logits = self._guarded(seq.handle, self._run_model, [chunk])
            if logits is not None:
                kept.append((seq, chunk))
                rows.append(logits)
        return kept, np.concatenate(rows) if rows else None

    def _plan_step(self) -> list[tuple[Sequence, SequenceChunk]]:
        """The step: a decode token of every generating sequence, then prompt chunks in arrival
        order up to the token budget, each only as far as the KV pool has room (kv_room: idle
        slots' caches give way first, then the newest running sequences)."""
        while True:
            running = self._sequences_of_one_lora_set()
            self._room_for_decodes(running)
            plan: list[tuple[Sequence, SequenceChunk]] = []
            budget = self.config.n_ubatch
            for seq in running:
                if seq.state == SeqState.DECODE:
                    if seq.needs_context_shift():
                        self._shift_context(seq)
                        if seq.state == SeqState.DONE:
                            continue
                    plan.append((seq, self._decode_chunk(seq)))
                    budget -= 1
            if self.speculation is not None:
                budget -= self._add_drafts(plan, budget)
            blocked = None
            for seq in running:
                if seq.state != SeqState.PREFILL or budget <= 0:
                    continue
                chunk = self._prompt_chunk(seq, budget)
                if chunk is None:
                    blocked = seq  # no room: it and the prompts after it wait (first come, first served)
                    break
                plan.append((seq, chunk))
                budget -= len(chunk.token_ids)
            if plan or blocked is None:
                return plan
            victim = self.room.victim(self._holders(), keep=blocked)
            if victim is None:
                return plan
            self.room.preempt(victim)  # nothing could run: a newer sequence gives way to the oldest prompt

    def _add_drafts(self, plan: list[tuple[Sequence, SequenceChunk]], budget: int) -> int:
        """Each decoding sequence's draft (lamplight.engine.speculation), as decode rows after the
        step's decode tokens, within `budget` rows and the pool's free blocks (a draft never takes
        room from anyone); the rows it used. A draft model drafts for all its sequences first, together."""
        used = 0
        for seq, _ in plan:
            seq.draft = []
        n_decode, model_seconds = len(plan), 0.0
        if self.draft_policy is not None and not self.draft_policy.allow(n_decode):
            self._step_drafts = (n_decode, False, 0.0)
            return 0
        if self.draft_model is not None:
            started = time.perf_counter()
            self.draft_model.prepare([(drafter, seq.tokens, seq.speculator.limit(min(draft_limit(seq), budget)))
                                      for seq, _ in plan if seq.speculator is not None
                                      and (drafter := seq.speculator.model_drafter()) is not None])
            model_seconds = time.perf_counter() - started
        for index, (seq, _) in enumerate(list(plan)):
            if seq.speculator is None or used >= budget:
                continue
            draft = seq.speculator.draft(seq.tokens, min(draft_limit(seq), budget - used))
            end = seq.n_computed + 1
            while draft and self.room.blocks_needed(seq, end + len(draft)) > self.room.free_blocks:
                draft.pop()
            if draft:
                seq.table.reserve(end + len(draft))
                seq.draft = draft
                if self.runner.chunk_rows_are_decode_rows:  # one chunk: its keys are read once
                    plan[index] = (seq, verify_chunk(seq, draft))
                else:
                    plan.extend((seq, chunk) for chunk in draft_chunks(seq, draft))
                used += len(draft)
        self._step_drafts = (n_decode, used > 0, model_seconds)
        return used

    def _verify(self, seq: Sequence, logits: np.ndarray) -> None:
        """Sample `seq`'s decode row and its draft's rows in order, as decoding would, one token
        each, until a sampled token differs from the draft (it is kept: the model's own token)
        or the sequence ends; the K/V of the rows after that is dropped."""
        draft, seq.draft = seq.draft, []
        pos = len(seq.tokens) - 1  # the decode token's position
        sampled = accepted = 0
        try:
            for i in range(logits.shape[0]):
                result = self._guarded(seq.handle, self._sample, logits[i:i + 1], [seq])
                event = self._guarded(seq.handle, seq.on_token, result[0][0], result[1][0]) if result else None
                if event is None:
                    break
                sampled += 1
                self.stats["generated_tokens"] += 1
                seq.handle._push(event)
                if i == len(draft) or event.token_id != draft[i]:
                    break
                accepted += 1
                if seq.state == SeqState.DONE:
                    break
        finally:
            seq.table.truncate(pos + max(sampled, 1))
        seq.n_draft += len(draft)
        seq.n_draft_accepted += accepted
        seq.speculator.accepted(len(draft), accepted)
        self.spec_stats.record(len(draft), accepted)

    def _room_for_decodes(self, running: list[Sequence]) -> None:
        """Every decode row a block where it needs one: the newest sequences give theirs back
        (preempted) until the others fit."""
        while True:
            decoding = [s for s in running if s.state == SeqState.DECODE]
            if self.room.make_room(sum(self.room.blocks_needed(s, s.n_computed + 1) for s in decoding)):
                return
            self.room.preempt(self.room.victim(self._holders(), keep=None))

    def _holders(self) -> list[Sequence]:
        """The sequences of running requests, oldest first (the last one gives way first)."""
        return [seq for handle in self.active for seq in handle.sequences]

    def _prompt_chunk(self, seq: Sequence, budget: int) -> SequenceChunk | None:
        """`seq`'s next prompt chunk within `budget` tokens and the pool's room (None: no room)."""
        start = seq.n_computed
        end = self._chunk_end(seq, start, start + min(seq.pending_prompt(), budget))
        if not self.room.make_room(self.room.blocks_needed(seq, end)):
            room = (len(seq.table.blocks) + self.room.free_blocks - 1) * self.cache.block_size  # one for a copy
            end = self._chunk_end(seq, start, min(end, room))
            if end <= start or not self.room.make_room(self.room.blocks_needed(seq, end)):
                return None
        seq.table.make_last_block_private()  # the cached prefix may end in a block shared with another slot
        seq.table.reserve(end)
        need_logits = end == seq.n_prompt and seq.resume_to is None
        return SequenceChunk(seq.tokens[start:end], start, seq.table.slots(0, end), need_logits=need_logits,
                             state_slot=seq.slot_id, given_rows=seq.given_rows(start, end))

    def _chunk_end(self, seq: Sequence, start: int, end: int) -> int:
        if self.checkpoints is not None:
            end = self.checkpoints.chunk_end(start, end, seq.n_prompt)
        return seq.prompt_chunk_end(start, end)

    def _shift_context(self, seq: Sequence) -> None:
        """Keep the first n_keep tokens, drop half of the rest, and slide the remainder down."""
        n_tokens = seq.n_computed
        n_keep = seq.n_prompt if seq.request.n_keep < 0 else seq.request.n_keep
        n_keep = min(n_keep + (1 if self.tokenizer.add_bos else 0), self.n_ctx_slot - 4)
        n_left = n_tokens - n_keep
        n_discard = min(max(seq.request.n_discard or n_left // 2, 0), n_left - 1)
        if n_discard <= 0:  # nothing left to drop: end as a full context does without the shift
            seq.finish_without_token("limit", truncated=True)
            return
        table = seq.table
        table.make_private_from(n_keep // table.cache.block_size)
        src = table.slots(n_keep + n_discard, n_tokens)
        dst = table.slots(n_keep, n_tokens - n_discard)
        self.runner.shift_kv(self.state, src, dst, -n_discard)
        table.truncate(n_tokens - n_discard)
        seq.apply_context_shift(n_keep, n_discard)
        if seq.speculator is not None:
            seq.speculator.reset(seq.tokens)

    def _sequences_of_one_lora_set(self) -> list[Sequence]:
        runnable = [
            seq for handle in self.active for seq in handle.sequences if seq.state in (SeqState.DECODE, SeqState.PREFILL)
        ]
        return one_lora_set(runnable, self.stats["steps"])

    def _decode_chunk(self, seq: Sequence) -> SequenceChunk:
        pos = seq.n_computed
        seq.table.make_last_block_private()
        seq.table.reserve(pos + 1)
        return SequenceChunk([seq.tokens[pos]], pos, seq.table.slots(0, pos + 1), state_slot=seq.slot_id)

    def _sampling_targets(self, seq: Sequence) -> list[Sequence]:
        """The sequences that sample from this row: a finished prompt also starts its sibling choices."""
        if seq.state == SeqState.DECODE:
            return [seq]
        handle = seq.handle
        targets = [seq]
        for sibling in handle.sequences[1:]:
            if sibling.state == SeqState.WAITING_PARENT:
                sibling.table.release()
                forked = seq.table.fork()
                sibling.table.blocks, sibling.table.num_tokens = forked.blocks, forked.num_tokens
                self.state.copy_sequence(seq.slot_id, sibling.slot_id)  # recurrent state, where there is one
                if self.checkpoints is not None:
                    self.checkpoints.share(seq.slot_id, sibling.slot_id)
                sibling.n_cached = seq.n_cached
                sibling.t_prompt_start = seq.t_prompt_start
                targets.append(sibling)
        for target in targets:
            if seq.request.n_predict == 0:
                target.finish_without_token("limit")  # evaluate the prompt only
            else:
                target.state = SeqState.DECODE
                self._accept_prompt(target)
        return targets if seq.request.n_predict != 0 else []

    def _accept_prompt(self, seq: Sequence) -> None:
        seq.sampler.accept_many(seq.text_prompt_tokens(), is_generated=False)

    def _progress(self, seq: Sequence) -> None:
        handle = seq.handle
        if handle.request.return_progress:
            elapsed = (time.perf_counter() - seq.t_prompt_start) * 1e3
            handle._push(PromptProgress(seq.choice, seq.n_prompt, seq.n_cached, seq.table.num_tokens, elapsed))

    def _sample_and_process(self, logits: np.ndarray, seqs: list[Sequence]) -> None:
        try:
            tokens, probs = self._sample(logits, seqs)
        except Exception:
            # Find the row at fault: each sequence samples alone, a failure ends its request only.
            tokens, probs = [], []
            for i, seq in enumerate(seqs):
                one = self._guarded(seq.handle, self._sample, logits[i : i + 1], [seq])
                tokens.append(one[0][0] if one else None)
                probs.append(one[1][0] if one else None)
        for seq, token, prob in zip(seqs, tokens, probs):
            if token is None or seq.handle.failed:
                continue
            event = self._guarded(seq.handle, seq.on_token, token, prob)
            if event is not None:
                self.stats["generated_tokens"] += 1
                seq.handle._push(event)

    def _sample(self, logits: np.ndarray, seqs: list[Sequence]) -> tuple[list[int], list]:
        # Grammar masks go before the whole chain, so every sampler chooses among allowed tokens.
        masks = fill_masks([s.grammar for s in seqs], logits.shape[-1])
        forced = [s.forced_token() for s in seqs]  # the reasoning budget closing a thinking block
        result = sample_batch(logits, [s.sampler for s in seqs], allowed_mask=masks,
                              forced=forced if any(t is not None for t in forced) else None)
        probs = result.probs if result.probs else [None] * len(seqs)
        return list(result.token_ids), list(probs)

    def _finish_done(self) -> None:
        for handle in list(self.active):
            finals = []
            for seq in handle.sequences:
                if seq.state == SeqState.DONE and not seq.reported:
                    seq.reported = True
                    finals.append(seq.final_event())
            # Free the slots before the caller hears of the end, so that whoever reacts to the
            # final event (a metrics scrape, the next request) already sees them idle.
            if all(s.reported for s in handle.sequences):
                self._release(handle)
            for event in finals:
                handle._push(event)

    def _release(self, handle: RequestHandle) -> None:
        if handle in self.active:
            self.active.remove(handle)
        now = time.perf_counter()
        for seq in handle.sequences:
            slot = self.slots[seq.slot_id]
            if slot.seq is seq:
                slot.seq = None
                slot.cached_tokens = seq.tokens[: seq.n_computed]
                slot.last_used = now
        self._wake()


def check_media(request: GenerationRequest, n_embd: int) -> set[int]:
    """The prompt positions the request's media spans cover (InvalidRequestError if they
    overlap, leave the prompt, have the wrong width or lack their placeholder ids there)."""
    covered: set[int] = set()
    end = 0
    for span in request.media:
        if span.start < end or span.end > len(request.prompt_tokens) or span.n_rows == 0:
            raise InvalidRequestError(f"media rows at positions [{span.start}, {span.end}) overlap others or leave "
                                      f"the prompt of {len(request.prompt_tokens)} tokens")
        if tuple(span.rows.shape[1:]) != (n_embd,):
            raise InvalidRequestError(f"media rows of shape {tuple(span.rows.shape)}: the model's width is {n_embd}")
        if any(not is_placeholder(t) for t in request.prompt_tokens[span.start:span.end]):
            raise InvalidRequestError(f"the prompt's token ids at media positions [{span.start}, {span.end}) are not "
                                      "placeholders")
        covered.update(range(span.start, span.end))
        end = span.end
    return covered


def pool_tokens(cfg: EngineConfig, n_ctx_seq: int) -> int:
    """The KV pool's tokens: -c's context (each slot's share of it without --kv-unified, the
    share cut to what one sequence may hold), plus one spare block per slot for copy-on-write of
    a shared partial block (n > 1 choices)."""
    bs = cfg.block_size
    blocks = -(-cfg.n_ctx // bs) if cfg.kv_unified else -(-n_ctx_seq // bs) * cfg.n_parallel
    return (blocks + cfg.n_parallel) * bs


def available_memory_bytes(device: str) -> int | None:
    """Free memory where the KV cache goes: the GPU's, or the system's MemAvailable (Linux)."""
    if str(device).startswith("cuda"):  # only a PyTorch runner computes there: torch is loaded already
        import torch

        return torch.cuda.mem_get_info(torch.device(device))[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_kv_fits(spec: StateSpec, num_tokens: int, cfg: EngineConfig) -> None:
    """A clear error at start-up instead of an allocator failure when the KV cache cannot fit."""
    need = spec.bytes_per_token(*cfg.cache_dtypes) * num_tokens
    free = available_memory_bytes(cfg.device)
    if free is not None and need > free:
        raise MemoryError(
            f"the KV cache for {cfg.n_parallel} slots x {cfg.n_ctx_slot} tokens needs {need / 2**30:.2f} GiB, "
            f"but only {free / 2**30:.2f} GiB is available: lower --ctx-size or --parallel"
        )
    checkpoints = recurrent_state_bytes(spec, cfg) - spec.recurrent_bytes_per_sequence() * cfg.n_parallel
    if free is not None and need + recurrent_state_bytes(spec, cfg) > free:
        raise MemoryError(
            f"the recurrent state of {cfg.n_parallel} slots with {cfg.ctx_checkpoints} checkpoints each needs "
            f"{checkpoints / 2**30:.2f} GiB for the checkpoints beside the KV cache's {need / 2**30:.2f} GiB, but only "
            f"{free / 2**30:.2f} GiB is available: lower --ctx-checkpoints or --parallel")


def recurrent_state_bytes(spec: StateSpec, cfg: EngineConfig) -> int:
    """Recurrent state of every slot plus a full set of checkpoints for each (0 without recurrent layers)."""
    return spec.recurrent_bytes_per_sequence() * cfg.n_parallel * (1 + cfg.ctx_checkpoints)


def check_recurrent_options(spec: StateSpec, cfg: EngineConfig) -> None:
    if spec.recurrent and cfg.context_shift:
        raise ValueError("--context-shift: this model has recurrent layers, whose state cannot drop tokens from its "
                         "middle; start without --context-shift (a generation then stops when its slot is full)")
