"""How far ahead a decode row's weights are prefetched, if at all: chosen by timing, once per process.

Multi-row tiles always ask for their weights ahead (6 KiB on AVX-512, 2 KiB on AVX2: see
qmatmul.cpp; the hardware prefetchers stop at each 4 KiB page). For a single row, bound by
memory bandwidth, it depends on the CPU, and so does the distance. One-token steps of the random
1B Q4_K_M file: on AMD Zen 5 a prefetch 6 KiB ahead ran 1.3-1.5x faster than none; on an Intel
Xeon (family 6 model 167) 2 KiB ahead ran 1.2x faster than none (26.7-27.1 ms against 32.7; 1
and 1.5 KiB the same, 3 KiB 28.2 ms) and 6 KiB 1.2x slower (38.7 ms); the 3B file there: 69.5 ms
at 2 KiB, 85.8 without, 105.4 at 6 KiB. So the first model loaded on the native kernels runs a
few one-token steps at each of DISTANCES, alternated, and keeps the fastest
(lp_set_one_row_prefetch). A prefetch changes no result, only speed: the reproducibility rule
holds whatever is chosen.
The steps are the runner's own (token 0 at position 0 on a one-token state of its default cache
type, numpy like all its steps): loading needs no torch.
"""

from __future__ import annotations

import logging
import statistics
import time

from ..models.chunks import SequenceChunk

log = logging.getLogger("lamplight")

# The distances timed (bytes ahead; 0: no prefetch): none, the Intel Xeon's best, Zen 5's.
DISTANCES = (0, 2048, 6144)
ROUNDS = 4  # timed steps at each distance, after one untimed round (first-touch page faults)

_chosen: dict[int, int] = {}  # by library handle: the distance chosen


def choose_one_row_prefetch(runner) -> int | None:
    """Times `runner`'s one-token steps at each of DISTANCES, sets the fastest on its library and
    returns it (the earlier choice if this library has one; None, leaving the prefetch off, if
    the step cannot run)."""
    lib = runner.lib
    if lib._handle in _chosen:
        lib.lp_set_one_row_prefetch(_chosen[lib._handle])
        return _chosen[lib._handle]
    try:
        times = _step_times(runner)
    except Exception as exc:  # a model this cannot step alone: leave the default
        log.debug("one-row prefetch not timed: %r", exc)
        lib.lp_set_one_row_prefetch(0)
        return None
    medians = {distance: statistics.median(times[distance]) for distance in DISTANCES}
    chosen = min(DISTANCES, key=medians.__getitem__)  # ties: the first, so no prefetch before any
    lib.lp_set_one_row_prefetch(chosen)
    _chosen[lib._handle] = chosen
    log.info("decode rows prefetch their weights: %s (a one-token step: %s)", describe(chosen),
             ", ".join(f"{1e3 * medians[d]:.1f} ms {describe(d)}" for d in DISTANCES))
    return chosen


def describe(distance: int | None) -> str:
    """How a distance reads in the log and the kernels line: 'not at all' or '2 KiB ahead'."""
    return f"{distance / 1024:g} KiB ahead" if distance else "not at all"


def _step_times(runner) -> dict[int, list[float]]:
    state, chunk = runner.new_state(1, runner.default_cache_type), [SequenceChunk([0], 0, range(1))]
    times: dict[int, list[float]] = {distance: [] for distance in DISTANCES}
    for round_ in range(ROUNDS + 1):
        for distance in DISTANCES[::-1] if round_ % 2 else DISTANCES:
            runner.lib.lp_set_one_row_prefetch(distance)
            start = time.perf_counter()
            runner.step(chunk, state)
            if round_:
                times[distance].append(time.perf_counter() - start)
    return times
