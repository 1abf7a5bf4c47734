"""Whether a decode row's weights are prefetched ahead: chosen by timing, once per process.

Multi-row tiles always ask for their weights ahead (6 KiB on AVX-512, 2 KiB on AVX2: see
qmatmul.cpp; the hardware prefetchers stop at each 4 KiB page). For a single row, bound by
memory bandwidth, it depends on the CPU: on some the hardware prefetchers alone stream the
weights fastest, on AMD Zen 5 the software prefetch reads a 1B Q4_K_M file's decode step
1.3-1.5x faster. So the first model loaded on the native kernels runs a few one-token steps
each way, alternated, and keeps the faster (lp_set_one_row_prefetch). A prefetch changes no
result, only speed: the reproducibility rule holds whatever is chosen.
The steps are the runner's own (token 0 at position 0 on a one-token state of its default cache
type, numpy like all its steps): loading needs no torch.
"""

from __future__ import annotations

import logging
import statistics
import time

from ..models.chunks import SequenceChunk

log = logging.getLogger("lamplight")

ROUNDS = 4  # timed steps each way, after one untimed round (first-touch page faults)

_chosen: dict[int, bool] = {}  # by library handle: the setting chosen


def choose_one_row_prefetch(runner) -> bool | None:
    """Times `runner`'s one-token steps with and without the one-row prefetch, sets the faster on
    its library and returns it (the earlier choice if this library has one; None, leaving it off,
    if the step cannot run)."""
    lib = runner.lib
    if lib._handle in _chosen:
        lib.lp_set_one_row_prefetch(int(_chosen[lib._handle]))
        return _chosen[lib._handle]
    try:
        times = _step_times(runner)
    except Exception as exc:  # a model this cannot step alone: leave the default
        log.debug("one-row prefetch not timed: %r", exc)
        lib.lp_set_one_row_prefetch(0)
        return None
    on = statistics.median(times[True]) < statistics.median(times[False])
    lib.lp_set_one_row_prefetch(int(on))
    _chosen[lib._handle] = on
    log.info("decode rows prefetch their weights: %s (a one-token step %.1f ms with, %.1f ms without)",
             "yes" if on else "no", 1e3 * statistics.median(times[True]), 1e3 * statistics.median(times[False]))
    return on


def _step_times(runner) -> dict[bool, list[float]]:
    state, chunk = runner.new_state(1, runner.default_cache_type), [SequenceChunk([0], 0, range(1))]
    times: dict[bool, list[float]] = {False: [], True: []}
    for round_ in range(ROUNDS + 1):
        for on in (False, True) if round_ % 2 else (True, False):
            runner.lib.lp_set_one_row_prefetch(int(on))
            start = time.perf_counter()
            runner.step(chunk, state)
            if round_:
                times[on].append(time.perf_counter() - start)
    return times
