"""Running a script in a fresh interpreter whose imports of torch raise: how the torch-free tests
(tests/test_torch_free_*.py) show that a path never loads torch."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import REPO_ROOT

from lamplight.native import runtime

# Prepended to each script: any import of torch or a torch submodule raises.
NO_TORCH = """
import importlib.abc, sys

class NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError(f"torch imported: {name}")
        return None

sys.meta_path.insert(0, NoTorch())
"""


def run_script(script: str, env: dict[str, str] | None = None, guarded: bool = True,
               timeout: float = 300) -> subprocess.CompletedProcess:
    """`script` in a fresh interpreter with this checkout's lamplight, unable to import torch
    unless `guarded` is False; `env`: variables to set (None values: to unset)."""
    path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
    environment = {**os.environ, **(env or {}), "PYTHONPATH": path}
    return subprocess.run([sys.executable, "-c", (NO_TORCH if guarded else "import sys\n") + script], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=timeout,
                          env={name: value for name, value in environment.items() if value is not None})


def run_without_torch(script: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`script` where torch cannot be imported."""
    return run_script(script, env)


def printed(out: subprocess.CompletedProcess) -> dict[str, str]:
    """The script's `NAME value` lines."""
    return dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)


@pytest.fixture(scope="module")
def native_library():
    """Skips a test where the native library cannot be had (the torch-free path is the native one)."""
    if runtime.library() is None:
        pytest.skip(f"no native library here: {runtime.unavailable_reason()}")
