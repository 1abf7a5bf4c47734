"""How a decode row reads its weights: chosen by timing, once per process.

A decode row (one row through the one-row tiles) is bound by memory bandwidth, and how fast one
core streams memory depends on the CPU's prefetchers, so two things are chosen by timing:

- **How far ahead the tiles prefetch** (lp_set_one_row_prefetch; 0: not at all). Multi-row tiles
  always ask for their weights ahead (6 KiB on AVX-512, 2 KiB on AVX2: see qmatmul.cpp; the
  hardware prefetchers stop at each 4 KiB page). One-token steps of the random 1B Q4_K_M file: on
  AMD Zen 5 a prefetch 6 KiB ahead ran 1.3-1.5x faster than none; on an Intel Xeon (family 6
  model 167) 2 KiB ahead ran 1.2x faster than none (26.7-27.1 ms against 32.7; 1 and 1.5 KiB the
  same, 3 KiB 28.2 ms) and 6 KiB 1.2x slower (38.7 ms); the 3B file there: 69.5 ms at 2 KiB,
  85.8 without, 105.4 at 6 KiB.
- **How many streams of memory a thread reads side by side** (lp_set_one_row_streams: 1, or 4
  where the build has the side-by-side tiles): a column range read as 4 runs of groups of 16
  columns at once keeps more streams in flight. On that Xeon a plain read of 512 MiB with 2
  threads ran at 27 GB/s as one stream a thread and 31 GB/s as 4 interleaved streams of 18.5 KiB
  (a 1B group's length), and one-token steps ran 1B 25.4 -> 23.4 ms, 3B 68.3 -> 60.6 ms,
  SmolLM2 Q4_1 4.33 -> 3.87 ms (each with its best distance), with the 4 groups next to each
  other; read as 4 long runs of a thread's groups (qmatmul.cpp), the 1B file 22.7 ms. Gemma 3
  270M ran no faster.

So the first model loaded on the native kernels runs a few one-token steps with each of CHOICES
the library has, alternated, and keeps the fastest. Neither setting changes a result, only speed:
the reproducibility rule holds whatever is chosen.
The steps are the runner's own (token 0 at position 0 on a one-token state of its default cache
type, numpy like all its steps): loading needs no torch.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from typing import NamedTuple

from ..models.chunks import SequenceChunk

log = logging.getLogger("lamplight")


class OneRowReads(NamedTuple):
    """How a decode row reads its weights."""

    streams: int  # runs of column groups a thread reads side by side
    distance: int  # bytes ahead the tiles prefetch (0: no prefetch)


# The distances timed (bytes ahead; 0: no prefetch): none, the Intel Xeon's best, Zen 5's.
DISTANCES = (0, 2048, 6144)
STREAMS = (1, 4)  # one group at a time, or 4 side by side
# Every combination; the first of a tie wins, so one stream and no prefetch before any other.
CHOICES = tuple(OneRowReads(streams, distance) for streams in STREAMS for distance in DISTANCES)
PLAIN = CHOICES[0]
ROUNDS = 4  # timed samples of each choice, after one untimed round (first-touch page faults)
# A sample's steps take at least this long: one step of a small model (4 ms for SmolLM2) is
# within the noise of its neighbours, and a median of 4 such picked a choice 10% slower than the
# best when another process was loading beside it.
SAMPLE_SECONDS = 0.025

_chosen: dict[int, OneRowReads] = {}  # by library handle: the choice made


def apply(lib, reads: OneRowReads) -> None:
    """Sets `reads` on the library."""
    lib.lp_set_one_row_streams(reads.streams)
    lib.lp_set_one_row_prefetch(reads.distance)


def current(lib) -> OneRowReads:
    """The library's settings now (read by setting them again)."""
    streams = lib.lp_set_one_row_streams(1)
    lib.lp_set_one_row_streams(streams)
    distance = lib.lp_set_one_row_prefetch(0)
    lib.lp_set_one_row_prefetch(distance)
    return OneRowReads(streams, distance)


def choices_of(lib) -> tuple[OneRowReads, ...]:
    """The CHOICES the library can make: side by side only where its build has those tiles (the
    setter keeps 1 otherwise)."""
    was = lib.lp_set_one_row_streams(max(STREAMS))
    most = lib.lp_set_one_row_streams(was)
    return tuple(choice for choice in CHOICES if choice.streams <= most)


def choose_one_row_reads(runner) -> OneRowReads | None:
    """Times `runner`'s one-token steps with each choice, sets the fastest on its library and
    returns it (the earlier choice if this library has one; None, leaving the plain reads, if the
    step cannot run)."""
    lib = runner.lib
    if lib._handle in _chosen:
        apply(lib, _chosen[lib._handle])
        return _chosen[lib._handle]
    choices = choices_of(lib)
    try:
        times = _step_times(runner, choices)
    except Exception as exc:  # a model this cannot step alone: leave the default
        log.debug("one-row reads not timed: %r", exc)
        apply(lib, PLAIN)
        return None
    medians = {choice: statistics.median(times[choice]) for choice in choices}
    chosen = min(choices, key=medians.__getitem__)  # ties: the first, so the plain reads before any
    apply(lib, chosen)
    _chosen[lib._handle] = chosen
    log.info("decode rows %s (a one-token step: %s)", describe(chosen),
             ", ".join(f"{1e3 * medians[c]:.1f} ms {describe(c)}" for c in choices))
    return chosen


def describe(reads: OneRowReads) -> str:
    """How a choice reads in the log and the kernels line: 'read 4 column groups at once, prefetch
    2 KiB ahead', 'prefetch not at all'."""
    ahead = f"prefetch {reads.distance / 1024:g} KiB ahead" if reads.distance else "prefetch not at all"
    return f"read {reads.streams} column groups at once, {ahead}" if reads.streams > 1 else ahead


def _step_times(runner, choices) -> dict[OneRowReads, list[float]]:
    """Seconds a step takes with each choice: ROUNDS samples, each the mean of enough steps to
    fill SAMPLE_SECONDS at the untimed round's fastest step."""
    state, chunk = runner.new_state(1, runner.default_cache_type), [SequenceChunk([0], 0, range(1))]
    times: dict[OneRowReads, list[float]] = {choice: [] for choice in choices}
    steps = 1
    for round_ in range(ROUNDS + 1):
        for choice in choices[::-1] if round_ % 2 else choices:
            apply(runner.lib, choice)
            start = time.perf_counter()
            for _ in range(steps):
                runner.step(chunk, state)
            seconds = (time.perf_counter() - start) / steps
            if round_:
                times[choice].append(seconds)
            else:
                steps = max(steps, math.ceil(SAMPLE_SECONDS / max(seconds, 1e-6)))
    return times
