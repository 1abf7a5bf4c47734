"""The engine: one thread owns the model and the KV cache and runs continuous batching steps.

HTTP handlers call `submit()` (thread-safe) and read events from the returned handle on their
event loop; the model never runs on the event loop thread. Each step decodes one token for
every generating sequence and fills the rest of the step's token budget (`n_ubatch`) with
prompt chunks of new requests, so a long prompt never stalls running streams.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import itertools
import threading
import time
from typing import AsyncIterator, Callable

import torch

from ..grammar import fill_masks
from ..models.base import CausalLM
from ..models.batch import SequenceChunk, build_forward_batch
from ..models.lora import LoraAdapter, attach_loras
from ..sampling import SequenceSampler, sample_batch
from .config import EngineConfig
from .kv_cache import BlockTable, KVCache
from .sequence import Sequence, SeqState
from .slot_files import load_slot, save_slot, write_slot
from .types import (
    ContextExceededError,
    ErrorEvent,
    Event,
    FinalEvent,
    GenerationRequest,
    InvalidRequestError,
    PromptProgress,
    QueueFullError,
)


class Slot:
    """A KV sequence of at most n_ctx_slot tokens, keeping its tokens after a request for reuse."""

    def __init__(self, slot_id: int, cache: KVCache):
        self.id = slot_id
        self.table = BlockTable(cache)
        self.cached_tokens: list[int] = []  # tokens whose K/V the table holds
        self.cached_lora: tuple[float, ...] = ()  # the adapter scales those K/V were computed with
        self.seq: Sequence | None = None
        self.last_used = 0.0
        self.n_prompt_tokens = 0
        self.id_task = -1
        self.settings: dict | None = None  # the last request's generation_settings (for /slots)

    @property
    def is_idle(self) -> bool:
        return self.seq is None


class RequestHandle:
    """What `submit` returns: the request's events, readable from an asyncio loop."""

    def __init__(self, engine: "Engine", request: GenerationRequest, task_id: int, loop: asyncio.AbstractEventLoop | None):
        self.engine = engine
        self.request = request
        self.task_id = task_id
        self._loop = loop
        self._queue: asyncio.Queue[Event] | None = asyncio.Queue() if loop else None
        self._sync_events: collections.deque[Event] = collections.deque()
        self._sync_ready = threading.Condition()
        self.cancelled = False
        self.lora_key: tuple[float, ...] = ()
        self.sequences: list[Sequence] = []

    def _push(self, event: Event) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, event)
        else:
            with self._sync_ready:
                self._sync_events.append(event)
                self._sync_ready.notify()

    async def events(self) -> AsyncIterator[Event]:
        """Events of all choices; ends after every choice's FinalEvent, or an ErrorEvent."""
        assert self._queue is not None, "submit() was called outside an event loop: use iter_events()"
        left = self.request.n_choices
        while left:
            event = await self._queue.get()
            yield event
            if isinstance(event, ErrorEvent):
                return
            if isinstance(event, FinalEvent):
                left -= 1

    def iter_events(self, timeout: float | None = None):
        """Blocking variant of `events()` for callers without an event loop (tests, scripts)."""
        left = self.request.n_choices
        while left:
            with self._sync_ready:
                if not self._sync_events and not self._sync_ready.wait_for(lambda: self._sync_events, timeout):
                    raise TimeoutError("no event from the engine")
                event = self._sync_events.popleft()
            yield event
            if isinstance(event, ErrorEvent):
                return
            if isinstance(event, FinalEvent):
                left -= 1

    def cancel(self) -> None:
        self.cancelled = True
        self.engine._wake()


class Engine:
    def __init__(
        self, model: CausalLM, tokenizer, config: EngineConfig | None = None, loras: list[LoraAdapter] | None = None
    ):
        self.model = model
        self.loras = list(loras or [])
        self.lora_scales = attach_loras(model, self.loras) if self.loras else None
        self.tokenizer = tokenizer
        self.config = config or EngineConfig()
        self.config.validate()
        cfg = self.config
        self.n_parallel = cfg.n_parallel
        self.n_ctx_slot = min(cfg.n_ctx_slot, model.config.n_ctx_train)
        blocks_per_slot = -(-self.n_ctx_slot // cfg.block_size)
        # One spare block per slot for copy-on-write of a shared partial block (n > 1 choices).
        num_blocks = blocks_per_slot * cfg.n_parallel + cfg.n_parallel
        check_kv_fits(model.config.kv_layout, num_blocks * cfg.block_size, cfg)
        k_dtype, v_dtype = cfg.cache_dtypes
        self.cache = KVCache(model.config.kv_layout, num_blocks, cfg.block_size, k_dtype, cfg.device, v_dtype)
        self.compiled = None
        if cfg.compile:
            from ..kernels.compiled import CompiledDecode

            self.compiled = CompiledDecode(model)
            self.compiled.warm_up(self.cache)
        self.slots = [Slot(i, self.cache) for i in range(cfg.n_parallel)]
        self.waiting: collections.deque[RequestHandle] = collections.deque()
        self.active: list[RequestHandle] = []
        self._lock = threading.Lock()
        self._wakeup = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._task_ids = itertools.count()
        self._control: collections.deque[tuple[Callable[[], object], concurrent.futures.Future]] = collections.deque()
        self.is_ready = False
        self.stats = {"prompt_tokens": 0, "generated_tokens": 0, "steps": 0, "requests": 0}

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
        self._check_request(request)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        with self._lock:
            if len(self.waiting) >= self.config.queue_size + self._idle_slot_count():
                raise QueueFullError("the server is busy: the request queue is full, try again later")
            handle = RequestHandle(self, request, next(self._task_ids), loop)
            handle.lora_key = self._lora_key(request)
            self.waiting.append(handle)
        self._wake()
        return handle

    def _idle_slot_count(self) -> int:
        return sum(1 for s in self.slots if s.is_idle)

    def _check_request(self, request: GenerationRequest) -> None:
        n_prompt = len(request.prompt_tokens)
        if n_prompt == 0:
            raise InvalidRequestError("the prompt is empty")
        if n_prompt >= self.n_ctx_slot:
            raise ContextExceededError(n_prompt, self.n_ctx_slot)
        vocab = self.model.config.vocab_size
        bad = next((t for t in request.prompt_tokens if not 0 <= t < vocab), None)
        if bad is not None:
            raise InvalidRequestError(f"prompt token id {bad} is out of range [0, {vocab})")
        if not 1 <= request.n_choices <= self.n_parallel:
            raise InvalidRequestError(f"n must be between 1 and the number of slots ({self.n_parallel})")
        if request.id_slot >= self.n_parallel or request.id_slot < -1:
            raise InvalidRequestError(f"id_slot {request.id_slot} is out of range (the server has {self.n_parallel} slots)")
        for adapter_id, scale in request.lora or ():
            if not 0 <= adapter_id < len(self.loras):
                raise InvalidRequestError(f"lora: no adapter with id {adapter_id} (the server has {len(self.loras)})")

    # -- LoRA ----------------------------------------------------------------------------------

    def _lora_key(self, request: GenerationRequest) -> tuple[float, ...]:
        if request.lora is None:
            return tuple(a.scale for a in self.loras)
        scales = [0.0] * len(self.loras)
        for adapter_id, scale in request.lora:
            scales[adapter_id] = float(scale)
        return tuple(scales)

    def lora_json(self) -> list[dict]:
        return [{"id": i, "path": a.path, "scale": a.scale} for i, a in enumerate(self.loras)]

    def set_lora_scales(self, entries: list[tuple[int, float]]) -> None:
        """Server-wide scales for requests that name none (adapters not listed get 0)."""
        for adapter_id, _ in entries:
            if not 0 <= adapter_id < len(self.loras):
                raise InvalidRequestError(f"no adapter with id {adapter_id} (the server has {len(self.loras)})")
        new = dict(entries)
        for i, adapter in enumerate(self.loras):
            adapter.scale = float(new.get(i, 0.0))

    def kv_usage(self) -> tuple[float, int]:
        """(share of KV blocks in use, tokens the slots hold, running or kept for reuse).

        Read without a lock: a metrics scrape may be one step out of date."""
        used = 1.0 - self.cache.allocator.num_free / self.cache.num_blocks
        tokens = sum(slot.seq.n_computed if slot.seq is not None else len(slot.cached_tokens) for slot in self.slots)
        return used, tokens

    def slots_json(self) -> list[dict]:
        """GET /slots: one entry per slot, shaped like llama-server's."""
        return [self._slot_json(slot) for slot in self.slots]

    # Keys of generation_settings that llama-server leaves out of /slots params.
    _SLOT_PARAMS_OMIT = ("grammar", "grammar_lazy", "grammar_triggers", "preserved_tokens", "stop", "logit_bias", "dry_sequence_breakers")

    def _slot_json(self, slot: Slot) -> dict:
        seq = slot.seq
        entry = {
            "id": slot.id,
            "n_ctx": self.n_ctx_slot,
            "speculative": False,
            "is_processing": seq is not None,
            "id_task": slot.id_task,
            "n_prompt_tokens": slot.n_prompt_tokens,
            "n_prompt_tokens_processed": seq.n_computed - seq.n_cached if seq else 0,
            "n_prompt_tokens_cache": seq.n_cached if seq else 0,
        }
        settings = slot.settings
        if settings is not None:
            entry["params"] = {k: v for k, v in settings.items() if k not in self._SLOT_PARAMS_OMIT}
        if seq is not None or settings is not None:
            entry["next_token"] = [
                {
                    "has_next_token": seq is not None and seq.state != SeqState.DONE,
                    "has_new_line": seq is not None and "\n" in seq.text,
                    "n_remain": seq.request.n_predict - len(seq.generated) if seq and seq.request.n_predict >= 0 else -1,
                    "n_decoded": len(seq.generated) if seq else 0,
                }
            ]
        return entry

    # -- the loop ------------------------------------------------------------------------------

    def _wake(self) -> None:
        self._wakeup.set()

    def _run(self) -> None:
        torch.set_grad_enabled(False)
        while not self._stop:
            self._wakeup.clear()
            try:
                self._run_control()
                self._drop_cancelled()
                self._admit_waiting()
                if not self._step():
                    self._wakeup.wait(timeout=0.5)
            except Exception as exc:  # never let the loop die: fail the running requests instead
                self._fail_all(f"internal error in the engine: {exc!r}")

    # -- slot files (run on the engine thread, between steps) ---------------------------------

    def call_on_engine(self, fn: Callable[[], object], timeout: float = 60.0) -> object:
        """Run `fn` on the engine thread between steps and return its result (or raise its error)."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._control.append((fn, future))
        self._wake()
        return future.result(timeout=timeout)

    def _run_control(self) -> None:
        while self._control:
            fn, future = self._control.popleft()
            try:
                future.set_result(fn())
            except Exception as exc:
                future.set_exception(exc)

    @property
    def fingerprint(self) -> str:
        return repr(self.model.config)

    def _idle_slot(self, slot_id: int) -> Slot:
        if not 0 <= slot_id < self.n_parallel:
            raise InvalidRequestError(f"slot {slot_id} does not exist (the server has {self.n_parallel} slots)")
        slot = self.slots[slot_id]
        if not slot.is_idle:
            raise InvalidRequestError(f"slot {slot_id} is busy processing a request")
        return slot

    def save_slot(self, slot_id: int, path: str) -> dict:
        def save() -> dict:
            slot = self._idle_slot(slot_id)
            start = time.perf_counter()
            n_bytes = save_slot(path, self.cache, slot.table, slot.cached_tokens, slot.cached_lora, self.fingerprint)
            return {"n_saved": len(slot.cached_tokens), "n_written": n_bytes, "ms": (time.perf_counter() - start) * 1e3}

        return self.call_on_engine(save)

    def restore_slot(self, slot_id: int, path: str) -> dict:
        data = load_slot(path, self.fingerprint, self.n_ctx_slot)

        def restore() -> dict:
            slot = self._idle_slot(slot_id)
            start = time.perf_counter()
            write_slot(self.cache, slot.table, data)
            slot.cached_tokens = list(data["tokens"])
            slot.cached_lora = tuple(data["lora"])
            return {"n_restored": len(slot.cached_tokens), "ms": (time.perf_counter() - start) * 1e3}

        return self.call_on_engine(restore)

    def erase_slot(self, slot_id: int) -> dict:
        def erase() -> dict:
            slot = self._idle_slot(slot_id)
            n = len(slot.cached_tokens)
            slot.table.release()
            slot.cached_tokens = []
            return {"n_erased": n}

        return self.call_on_engine(erase)

    def _fail_all(self, message: str) -> None:
        for handle in list(self.active):
            handle._push(ErrorEvent(0, message))
            self._release(handle)

    def _drop_cancelled(self) -> None:
        with self._lock:
            for handle in [h for h in self.waiting if h.cancelled]:
                self.waiting.remove(handle)
        for handle in [h for h in self.active if h.cancelled]:
            self._release(handle)

    # -- admission and slot choice -------------------------------------------------------------

    def _admit_waiting(self) -> None:
        with self._lock:
            pending = list(self.waiting)
        for handle in pending:
            slots = self._choose_slots(handle.request, handle.lora_key)
            if slots is None:
                continue  # this one waits (its forced slot is busy, or too few idle slots)
            with self._lock:
                self.waiting.remove(handle)
            self._start(handle, slots)

    def _choose_slots(self, request: GenerationRequest, lora_key: tuple[float, ...]) -> list[Slot] | None:
        idle = [s for s in self.slots if s.is_idle]
        if request.id_slot >= 0:
            first = self.slots[request.id_slot]
            if not first.is_idle:
                return None
        else:
            if not idle:
                return None
            first = self._best_slot(idle, request.prompt_tokens, lora_key)
        others = sorted((s for s in idle if s is not first), key=lambda s: s.last_used)
        if len(others) < request.n_choices - 1:
            return None
        return [first] + others[: request.n_choices - 1]

    def _best_slot(self, idle: list[Slot], prompt: list[int], lora_key: tuple[float, ...]) -> Slot:
        threshold = self.config.slot_prompt_similarity
        best, best_ratio = None, 0.0
        for slot in idle:
            if slot.cached_lora != lora_key:
                continue
            ratio = common_prefix(slot.cached_tokens, prompt) / len(prompt)
            if ratio > threshold and ratio > best_ratio:
                best, best_ratio = slot, ratio
        return best or min(idle, key=lambda s: s.last_used)

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
        same_lora = slot.cached_lora == seq.handle.lora_key
        keep = common_prefix(slot.cached_tokens, request.prompt_tokens) if request.cache_prompt and same_lora else 0
        keep = min(keep, seq.n_prompt - 1)  # always evaluate at least one prompt token for its logits
        slot.table.truncate(keep)
        slot.cached_tokens = slot.cached_tokens[:keep]
        seq.n_cached = keep

    # -- one step ------------------------------------------------------------------------------

    def _step(self) -> bool:
        """Run one forward step over everything that can progress. False if there was nothing."""
        plan = self._plan_step()
        if not plan:
            self._finish_done()
            return False
        chunks = [chunk for _, chunk in plan]
        if self.lora_scales is not None:
            self.lora_scales.scales = list(plan[0][0].handle.lora_key)
        if self.compiled is not None:
            logits = self.compiled.run(chunks, self.cache)
        else:
            logits = self.model(build_forward_batch(chunks, device=self.config.device), self.cache)
        self.stats["steps"] += 1
        sampled_seqs = []
        rows = []
        row = 0
        for seq, chunk in plan:
            seq.table.num_tokens = chunk.start_pos + len(chunk.token_ids)
            if seq.state == SeqState.PREFILL:
                self.stats["prompt_tokens"] += len(chunk.token_ids)
                self._progress(seq)
            if chunk.need_logits:
                for target in self._sampling_targets(seq):
                    sampled_seqs.append(target)
                    rows.append(row)
                row += 1
        if sampled_seqs:
            self._sample_and_process(logits[rows], sampled_seqs)
        self._finish_done()
        return True

    def _plan_step(self) -> list[tuple[Sequence, SequenceChunk]]:
        budget = self.config.n_ubatch
        plan: list[tuple[Sequence, SequenceChunk]] = []
        running = self._sequences_of_one_lora_set()
        for seq in running:
            if seq.state == SeqState.DECODE:
                if seq.needs_context_shift():
                    self._shift_context(seq)
                    if seq.state == SeqState.DONE:
                        continue
                plan.append((seq, self._decode_chunk(seq)))
                budget -= 1
        for seq in running:
            if seq.state != SeqState.PREFILL or budget <= 0:
                continue
            start = seq.n_computed
            take = min(seq.pending_prompt(), budget)
            end = start + take
            seq.table.make_last_block_private()  # the cached prefix may end in a block shared with another slot
            seq.table.reserve(end)
            chunk = SequenceChunk(seq.tokens[start:end], start, seq.table.slots(0, end), need_logits=end == seq.n_prompt)
            plan.append((seq, chunk))
            budget -= take
        return plan

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
        device = self.config.device
        src = torch.tensor(table.slots(n_keep + n_discard, n_tokens), dtype=torch.long, device=device)
        dst = torch.tensor(table.slots(n_keep, n_tokens - n_discard), dtype=torch.long, device=device)
        self.model.shift_kv(self.cache, src, dst, -n_discard)
        table.truncate(n_tokens - n_discard)
        seq.apply_context_shift(n_keep, n_discard)

    def _sequences_of_one_lora_set(self) -> list[Sequence]:
        """Running sequences that share adapter scales with each other: one set per step.

        Different sets take turns, step by step, so none waits for another to finish.
        """
        runnable = [
            seq for handle in self.active for seq in handle.sequences if seq.state in (SeqState.DECODE, SeqState.PREFILL)
        ]
        keys = list(dict.fromkeys(seq.handle.lora_key for seq in runnable))
        if len(keys) <= 1:
            return runnable
        key = keys[self.stats["steps"] % len(keys)]
        return [seq for seq in runnable if seq.handle.lora_key == key]

    def _decode_chunk(self, seq: Sequence) -> SequenceChunk:
        pos = seq.n_computed
        seq.table.make_last_block_private()
        seq.table.reserve(pos + 1)
        return SequenceChunk([seq.tokens[pos]], pos, seq.table.slots(0, pos + 1))

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
        seq.sampler.accept_many(seq.tokens[: seq.n_prompt], is_generated=False)

    def _progress(self, seq: Sequence) -> None:
        handle = seq.handle
        if handle.request.return_progress:
            elapsed = (time.perf_counter() - seq.t_prompt_start) * 1e3
            handle._push(PromptProgress(seq.choice, seq.n_prompt, seq.n_cached, seq.table.num_tokens, elapsed))

    def _sample_and_process(self, logits: torch.Tensor, seqs: list[Sequence]) -> None:
        # Grammar masks go before the whole chain, so every sampler chooses among allowed tokens.
        masks = fill_masks([s.grammar for s in seqs], logits.shape[-1])
        if masks is not None:
            masks = masks.to(logits.device)
        result = sample_batch(logits, [s.sampler for s in seqs], allowed_mask=masks)
        for i, seq in enumerate(seqs):
            prob = result.probs[i] if result.probs else None
            event = seq.on_token(result.token_ids[i], prob)
            self.stats["generated_tokens"] += 1
            seq.handle._push(event)

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


def available_memory_bytes(device: str) -> int | None:
    """Free memory where the KV cache goes: the GPU's, or the system's MemAvailable (Linux)."""
    if torch.device(device).type == "cuda":
        return torch.cuda.mem_get_info(torch.device(device))[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_kv_fits(layout, num_tokens: int, cfg: EngineConfig) -> None:
    """A clear error at start-up instead of an allocator failure when the KV cache cannot fit."""
    need = KVCache.bytes_needed(layout, num_tokens, *cfg.cache_dtypes)
    free = available_memory_bytes(cfg.device)
    if free is not None and need > free:
        raise MemoryError(
            f"the KV cache for {cfg.n_parallel} slots x {cfg.n_ctx_slot} tokens needs {need / 2**30:.2f} GiB, "
            f"but only {free / 2**30:.2f} GiB is available: lower --ctx-size or --parallel"
        )


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
