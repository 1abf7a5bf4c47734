"""One choice of one request while it runs in a slot: its tokens, text, stop checks and timings."""

from __future__ import annotations

import enum
import time
from typing import TYPE_CHECKING

from .kv_cache import BlockTable
from .stopping import StopMatcher
from ..models.chunks import GivenRows
from ..sampling import ReasoningBudget, TokenProbs
from .types import FinalEvent, GenerationRequest, Timings, TokenEvent, is_placeholder

if TYPE_CHECKING:
    from ..sampling import SequenceSampler
    from ..tokenizer import Tokenizer


class SeqState(enum.Enum):
    WAITING_PARENT = "waiting_parent"  # an extra choice waiting for the shared prompt's KV
    PREFILL = "prefill"
    DECODE = "decode"
    DONE = "done"


class Sequence:
    def __init__(
        self,
        request: GenerationRequest,
        choice: int,
        slot_id: int,
        table: BlockTable,
        sampler: "SequenceSampler",
        tokenizer: "Tokenizer",
        n_ctx_slot: int,
        context_shift: bool = False,
    ):
        self.request = request
        self.choice = choice
        self.slot_id = slot_id
        self.table = table
        self.sampler = sampler
        self.tokenizer = tokenizer
        self.n_ctx_slot = n_ctx_slot
        self.context_shift = context_shift
        self.indent_from = -1  # start of the first line whose indentation is not yet checked (n_indent)
        self.tokens: list[int] = list(request.prompt_tokens)
        self.n_prompt = len(self.tokens)
        self.n_cached = 0
        self.state = SeqState.PREFILL
        # Preempted while decoding (lamplight.engine.kv_room): its K/V is computed again up to
        # here, in prompt chunks, before it decodes on from where it was.
        self.resume_to: int | None = None
        self.generated: list[int] = []
        self.probs: list[TokenProbs] = []
        self.decoder = tokenizer.new_decoder()
        self.stops = StopMatcher(request.stop)
        self.text = ""
        self.sent = 0  # characters of `text` already handed out in events
        self.stop_type = "none"
        self.stopping_word = ""
        self.truncated = False
        self.t_prompt_start = time.perf_counter()
        self.t_prompt_end: float | None = None
        self.t_last: float | None = None
        self.grammar = request.grammar.new_matcher() if request.grammar is not None else None
        self.budget = (ReasoningBudget(request.reasoning_budget, getattr(tokenizer, "token_bytes", None))
                       if request.reasoning_budget is not None else None)
        self.handle = None  # the RequestHandle this choice reports to (set by the engine)
        # Speculative decoding (lamplight.engine.speculation): its drafter (None: it does not
        # speculate), this step's draft, and the totals its timings report.
        self.speculator = None
        self.draft: list[int] = []
        self.n_draft = 0
        self.n_draft_accepted = 0
        self.reported = False  # its FinalEvent was sent

    # -- KV bookkeeping ------------------------------------------------------------------------

    @property
    def n_computed(self) -> int:
        return self.table.num_tokens

    @property
    def prefill_end(self) -> int:
        """Where its prompt chunks end: the prompt's end, or, preempted, where it had got to."""
        return self.n_prompt if self.resume_to is None else self.resume_to

    def pending_prompt(self) -> int:
        return self.prefill_end - self.n_computed

    # -- media rows (images) in the prompt -----------------------------------------------------

    def given_rows(self, start: int, end: int) -> tuple[GivenRows, ...]:
        """The media rows at prompt positions [start, end), counted from `start`."""
        rows = []
        for span in self.request.media:
            lo, hi = max(span.start, start), min(span.end, end)
            if lo < hi:
                rows.append(GivenRows(lo - start, span.rows[lo - span.start:hi - span.start], span.non_causal))
        return tuple(rows)

    def prompt_chunk_end(self, start: int, end: int) -> int:
        """`end` for a prompt chunk from `start`, moved so that the chunk never splits a
        non-causal span (its rows see each other, so they are computed together): back to the
        span's start, or, for a chunk that starts with the span, on to its end (past the step's
        token budget if need be, as llama.cpp decodes such an image in one batch)."""
        for span in self.request.media:
            if span.non_causal and span.start < end < span.end:
                return span.start if span.start > start else span.end
        return end

    def reusable_prefix(self, keep: int) -> int:
        """The longest prefix of at most `keep` cached positions a chunk can resume after: never
        inside a non-causal span (its rows are recomputed together)."""
        for span in self.request.media:
            if span.non_causal and span.start < keep < span.end:
                return span.start
        return keep

    def text_prompt_tokens(self) -> list[int]:
        """The prompt's token ids without media placeholders: what the samplers' histories hold
        (llama.cpp accepts no token for an image position)."""
        return [t for t in self.tokens[: self.n_prompt] if not is_placeholder(t)]

    # -- token processing ----------------------------------------------------------------------

    def on_token(self, token_id: int, prob: TokenProbs | None) -> TokenEvent:
        """Record a sampled token, decide whether generation ends, and say what text is safe to show."""
        now = time.perf_counter()
        if self.t_prompt_end is None:
            self.t_prompt_end = now
        self.t_last = now
        self.generated.append(token_id)
        self.tokens.append(token_id)
        self.sampler.accept(token_id, is_generated=True)
        if self.budget is not None:
            self.budget.accept(token_id)
        if prob is not None:
            self.probs.append(prob)

        is_eog = token_id in self.tokenizer.eog_ids and not self.request.sampling.ignore_eos
        if self.grammar is not None and not is_eog:
            self.grammar.accept(token_id)
        if is_eog:
            self.stop_type = "eos"
        else:
            piece = self.decoder.feed(token_id)
            self.text += piece
            self._check_stop_string()
            if self.stop_type == "none" and self.request.n_indent > 0:
                self._check_indent()
            if self.stop_type == "none" and "\n" in piece:
                self._check_time_limit(now)
        if self.stop_type == "none" and self.grammar is not None and self.grammar.is_stopped():
            self.stop_type = "eos"  # the grammar is complete and allows nothing more
        if self.stop_type == "none":
            self._check_limits()
        if self.stop_type != "none":
            return self._finish_token_event(token_id, prob)
        hold = max(self.stops.held_back(self.text), self._undecided_indent())
        return self._emit(token_id, prob, len(self.text) - hold)

    def forced_token(self) -> int | None:
        """The token the reasoning budget makes this step produce, if any."""
        return self.budget.forced_token() if self.budget is not None else None

    def _check_stop_string(self) -> None:
        match = self.stops.find(self.text, self.sent)
        if match is not None:
            at, word = match
            self.text = self.text[:at]
            self.stop_type = "word"
            self.stopping_word = word

    def _check_limits(self) -> None:
        req = self.request
        if 0 <= req.n_predict <= len(self.generated):
            self.stop_type = "limit"
        elif len(self.tokens) >= self.n_ctx_slot and not self.context_shift:
            self.stop_type = "limit"
            self.truncated = True

    def _check_indent(self) -> None:
        """n_indent: after the first newline, a line indented less than n_indent ends generation.

        The offending line is dropped (from its first character, indentation included).
        """
        if self.indent_from < 0:
            first_nl = self.text.find("\n")
            if first_nl < 0:
                return
            self.indent_from = first_nl + 1
        while True:
            start = self.indent_from
            end = self.text.find("\n", start)
            line = self.text[start:] if end < 0 else self.text[start:end]
            body = line.lstrip(" \t")
            if body:
                if len(line) - len(body) < self.request.n_indent:
                    self.text = self.text[:start]
                    self.stop_type = "limit"
                    return
            if end < 0:
                return
            self.indent_from = end + 1

    def _undecided_indent(self) -> int:
        """Characters of a trailing whitespace-only line held back until its indentation is known."""
        if self.request.n_indent <= 0 or self.indent_from < 0:
            return 0
        tail = self.text[self.indent_from :]
        return len(tail) if tail.strip(" \t") == "" else 0

    def _check_time_limit(self, now: float) -> None:
        """t_max_predict_ms: once the budget is spent, stop at the next newline."""
        limit = self.request.t_max_predict_ms
        if limit > 0 and self.t_prompt_end is not None and (now - self.t_prompt_end) * 1e3 > limit:
            self.stop_type = "limit"

    def needs_context_shift(self) -> bool:
        return self.context_shift and self.n_computed + 1 >= self.n_ctx_slot

    def apply_context_shift(self, n_keep: int, n_discard: int) -> None:
        """Forget tokens [n_keep, n_keep + n_discard) (their KV was moved by the engine)."""
        del self.tokens[n_keep : n_keep + n_discard]
        self.truncated = True

    def _finish_token_event(self, token_id: int, prob: TokenProbs | None) -> TokenEvent:
        if self.stop_type != "word":
            self.text += self.decoder.flush()
        self.state = SeqState.DONE
        return self._emit(token_id, prob, len(self.text))

    def _emit(self, token_id: int, prob: TokenProbs | None, upto: int) -> TokenEvent:
        upto = max(upto, self.sent)
        piece = self.text[self.sent : upto]
        self.sent = upto
        return TokenEvent(self.choice, token_id, piece, len(self.generated), prob, self.timings())

    def finish_without_token(self, stop_type: str, truncated: bool = False) -> None:
        """End before any (further) token: n_predict 0, or the context is full before a decode."""
        self.stop_type = stop_type
        self.truncated = self.truncated or truncated
        self.state = SeqState.DONE

    # -- results -------------------------------------------------------------------------------

    def timings(self) -> Timings:
        end_prompt = self.t_prompt_end or time.perf_counter()
        end = self.t_last or end_prompt
        return Timings(
            cache_n=self.n_cached,
            prompt_n=self.n_prompt - self.n_cached,
            prompt_ms=(end_prompt - self.t_prompt_start) * 1e3,
            predicted_n=len(self.generated),
            predicted_ms=(end - end_prompt) * 1e3,
            draft_n=self.n_draft,
            draft_n_accepted=self.n_draft_accepted,
        )

    def final_event(self) -> FinalEvent:
        timings = self.timings()
        probs = tuple(self.probs)
        if self.stop_type == "word" and probs:
            # llama.cpp drops the probs of the tokens that spelled the stop word.
            n_stop = len(self.tokenizer.encode(self.stopping_word, add_special=False, parse_special=False))
            probs = probs[: max(0, len(probs) - n_stop)]
        return FinalEvent(
            choice=self.choice,
            content=self.text,
            token_ids=tuple(self.generated),
            stop_type=self.stop_type,
            stopping_word=self.stopping_word,
            truncated=self.truncated,
            n_prompt=self.n_prompt,
            n_cached=self.n_cached,
            n_decoded=len(self.generated),
            tokens_cached=self.n_computed,
            id_slot=self.slot_id,
            timings=timings,
            has_new_line="\n" in self.text,
            probs=probs,
        )
