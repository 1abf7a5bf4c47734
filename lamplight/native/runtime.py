"""Whether the native kernels are used, and which build: decided once per process.

`library()` returns the loaded library of the widest variant this CPU runs (building it on
first use, in seconds, then cached on disk), or None when it cannot be had (no C++ compiler, a
failed build, a library whose structs do not match abi.py's declarations, or LAMPLIGHT_NATIVE=0);
then lamplight runs on PyTorch's kernels and says so once.

LAMPLIGHT_NATIVE: unset or `auto` picks the best variant; `0`/`off` disables the native kernels;
a variant name (`avx512vnni`, `avx2`, `generic`) forces that build.
"""

from __future__ import annotations

import ctypes
import logging
import os
import subprocess
import threading
import time
from typing import Callable

from . import abi, build

log = logging.getLogger("lamplight.native")

_lock = threading.Lock()
_loaded: dict[str, ctypes.CDLL] = {}
_state: dict[str, object] = {"decided": False, "variant": None, "reason": None}


def load_variant(variant: str, progress: Callable[[str], None] | None = None) -> ctypes.CDLL:
    """The library of one variant (built if needed), its layout checked against abi.py's ctypes
    declarations; raises build.BuildError or abi.LayoutMismatch."""
    with _lock:
        lib = _loaded.get(variant)
        if lib is None:
            if progress is not None and not build.is_built(variant):
                progress(f"building the native {variant} kernels for this CPU (first start only, a few seconds)")
            started = time.perf_counter()
            path = build.library_path(variant)
            lib = abi.declare(ctypes.CDLL(str(path)))
            abi.check_layout(lib)
            _loaded[variant] = lib
            took = time.perf_counter() - started
            if took > 1.0:
                log.info("built the native %s kernels in %.1f s (cached in %s)", variant, took, path.parent)
        return lib


def _choice() -> str | None:
    setting = os.environ.get("LAMPLIGHT_NATIVE", "auto").strip().lower()
    if setting in ("0", "off", "no", "false", "torch"):
        _state["reason"] = "disabled by LAMPLIGHT_NATIVE"
        return None
    if setting in ("", "auto", "1", "on"):
        return build.best_variant()
    if setting not in build.VARIANTS:
        raise ValueError(f"LAMPLIGHT_NATIVE={setting!r}: use auto, off or one of {', '.join(build.VARIANTS)}")
    return setting


def library(progress: Callable[[str], None] | None = None) -> ctypes.CDLL | None:
    """The native library to use in this process, or None (PyTorch's kernels)."""
    if not _state["decided"]:
        _state["decided"] = True
        variant = _choice()
        if variant is not None:
            try:
                load_variant(variant, progress)
                _state["variant"] = variant
            except (build.BuildError, abi.LayoutMismatch, OSError, AttributeError, subprocess.SubprocessError) as exc:
                _state["reason"] = str(exc).splitlines()[0]
        if _state["variant"] is None:
            log.warning("native kernels unavailable (%s): running on PyTorch's kernels, which are slower",
                        _state["reason"])
    variant = _state["variant"]
    return _loaded[variant] if variant else None


def variant_of(lib: ctypes.CDLL) -> str:
    return lib.lp_isa().decode()


def unavailable_reason() -> str | None:
    """Why `library()` is None (e.g. 'no C++ compiler found ...'), or None if it is not."""
    return None if library() is not None else str(_state["reason"])


def reset_for_tests() -> None:
    _state.update(decided=False, variant=None, reason=None)
