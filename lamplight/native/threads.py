"""How many threads the native kernels run on.

`-t` where it was given (lamplight.threads, which holds it without importing torch). Otherwise
PyTorch's thread count where PyTorch is loaded and its count is the user's (a library user's
torch.set_num_threads; not one lamplight set, such as the native server's one thread for torch's
own ops), else what PyTorch's count would be by default, without importing torch for it.
"""

from __future__ import annotations

import os
import re
import sys


def configured_threads() -> int:
    """-t's count, else PyTorch's if torch is imported with a count of its user's (not the one
    lamplight set), else `default_threads()`."""
    from ..threads import is_lamplights_torch_count, requested_threads

    requested = requested_threads()
    if requested is not None:
        return requested
    torch = sys.modules.get("torch")
    torch_count = torch.get_num_threads() if torch is not None else None
    if torch_count is not None and not is_lamplights_torch_count(torch_count):
        return torch_count
    return default_threads()


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
