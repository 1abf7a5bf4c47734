"""The CPU threads the process is asked to compute on (`lamplight serve -t N`), held without
importing torch.

A server on the native kernels never imports torch, so -t cannot live in PyTorch's thread count:
it is held here (`requested_threads`), and a native runner sizes the kernels' pool from it when it
is built (lamplight.native.threads.configured_threads). PyTorch's count is set here
too (`set_torch_threads`): at once where torch is imported, else the moment it is (a PyTorch
backend, the vision encoder, an embedding encoder), before anything runs on it, so a feature that
brings torch in later computes on the same threads as if -t had set them first.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import threading
from types import ModuleType

_requested: int | None = None  # -t, where it was given
_torch_threads: int | None = None  # PyTorch's count, for when torch is imported
_lock = threading.Lock()


def request_threads(count: int) -> None:
    """-t: the native pool's threads and PyTorch's."""
    global _requested
    _requested = count
    set_torch_threads(count)


def requested_threads() -> int | None:
    """The count -t asked for, or None (each pool's default)."""
    return _requested


def is_lamplights_torch_count(count: int) -> bool:
    """Whether PyTorch's count `count` is the one lamplight set (-t, or the native server's one
    thread for torch's own ops) rather than one its user gave it since."""
    return _torch_threads is not None and count == _torch_threads


def set_torch_threads(count: int) -> None:
    """PyTorch's thread count: set now where torch is imported, else as soon as it is."""
    global _torch_threads
    with _lock:
        _torch_threads = count
        torch = sys.modules.get("torch")
        if torch is None and not any(isinstance(finder, _TorchImportHook) for finder in sys.meta_path):
            sys.meta_path.insert(0, _TorchImportHook())
    # A torch still being imported has no set_num_threads yet: the hook sets the count at its end.
    if torch is not None and hasattr(torch, "set_num_threads"):
        torch.set_num_threads(count)


def _apply_to_torch(torch: ModuleType) -> None:
    with _lock:
        count = _torch_threads
    torch.set_num_threads(count)


class _TorchImportHook(importlib.abc.MetaPathFinder):
    """Finds `torch` as the other finders do, with a loader that sets its thread count once the
    package has run (torch.set_num_threads exists from then on), and leaves sys.meta_path."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)  # one import: later finds of torch go straight to the others
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _ThenSetThreads(spec.loader)
        return spec


class _ThenSetThreads(importlib.abc.Loader):
    """torch's own loader, then its thread count; the module keeps its own loader afterwards."""

    def __init__(self, loader: importlib.abc.Loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        _apply_to_torch(module)
