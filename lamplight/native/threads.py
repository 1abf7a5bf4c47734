"""How many threads the native kernels run on.

PyTorch's thread count where PyTorch is loaded: the CLI's -t sets it before a model is loaded,
and the native pool follows it (lp_set_threads). Where PyTorch is not loaded nothing can have
set it, so the native pool gets what PyTorch's count would be by default, without importing
torch for it.
"""

from __future__ import annotations

import os
import re
import sys


def configured_threads() -> int:
    """PyTorch's thread count if torch is imported, else `default_threads()`."""
    torch = sys.modules.get("torch")
    return torch.get_num_threads() if torch is not None else default_threads()


def default_threads() -> int:
    """PyTorch's default thread count (its MKL build's): the physical cores this process may run
    on, or fewer where MKL_NUM_THREADS (else OMP_NUM_THREADS) asks for fewer."""
    cores = physical_cores()
    asked = _threads_asked("MKL_NUM_THREADS") or _threads_asked("OMP_NUM_THREADS")
    return min(asked, cores) if asked else cores


def physical_cores() -> int:
    """Distinct (package, core) pairs among the CPUs this process may run on (Linux's sysfs),
    else the count of those CPUs."""
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    cores = set()
    for cpu in cpus:
        topology = f"/sys/devices/system/cpu/cpu{cpu}/topology/"
        try:
            with open(topology + "physical_package_id") as package, open(topology + "core_id") as core:
                cores.add((package.read().strip(), core.read().strip()))
        except OSError:
            return max(1, len(cpus))
    return max(1, len(cores))


def _threads_asked(name: str) -> int:
    """A positive count an environment variable leads with (as C's stoi reads it), else 0."""
    match = re.match(r"\s*\+?(\d+)", os.environ.get(name, ""))
    return int(match.group(1)) if match else 0
