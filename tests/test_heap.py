"""lamplight.heap: freed memory given back to the system (malloc_trim) by the engine once it has
been idle a moment, never between the steps of a burst; and what a trim gives back, measured in a
fresh process."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest
from model_helpers import runner_for
from tiny_gguf import write_tiny_llama

from lamplight.engine import engine as engine_module
from lamplight.engine.config import EngineConfig
from lamplight.engine.engine import Engine
from lamplight.engine.types import GenerationRequest
from lamplight.gguf.file import GGUFFile
from lamplight.heap import release_freed_memory
from lamplight.sampling import SamplingParams
from lamplight.tokenizer import Tokenizer


def test_a_trim_gives_back_the_free_pages_inside_the_heap():
    """64 KiB blocks (under glibc's mmap threshold: in the heap), all freed but the last, which
    pins the heap's top: glibc keeps the 128 MiB below it resident until a trim."""
    script = textwrap.dedent("""
        import ctypes
        from lamplight.heap import release_freed_memory
        libc = ctypes.CDLL(None)
        libc.malloc.restype = ctypes.c_void_p
        libc.free.argtypes = [ctypes.c_void_p]
        def rss():
            return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS")) // 1024
        blocks = [libc.malloc(64 << 10) for _ in range(2048)]
        for b in blocks:
            ctypes.memset(b, 1, 64 << 10)
        for b in blocks[:-1]:
            libc.free(b)
        before = rss()
        assert release_freed_memory()
        print(before, rss())
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    before, after = map(int, out.stdout.split())
    assert before - after >= 100, (before, after)  # MiB


@pytest.fixture
def counted_trims(monkeypatch):
    trims = []
    monkeypatch.setattr(engine_module, "release_freed_memory", lambda: trims.append(time.monotonic()) or True)
    monkeypatch.setattr(engine_module, "IDLE_RELEASE_S", 0.05)
    return trims


def test_the_engine_gives_memory_back_once_idle_not_between_steps(tmp_path, counted_trims):
    path = write_tiny_llama(tmp_path / "tiny.gguf", n_ctx=256)
    gguf = GGUFFile(path)
    engine = Engine(runner_for(gguf, "reference"), Tokenizer.from_gguf(gguf), EngineConfig(n_ctx=512, n_parallel=2))
    engine.start()
    try:
        time.sleep(0.3)
        assert counted_trims == []  # nothing done yet: nothing to give back
        request = GenerationRequest(prompt_tokens=[1, 5, 9], n_predict=24, sampling=SamplingParams(temperature=0.0))
        started = time.monotonic()
        events = list(engine.submit(request).iter_events(timeout=60))
        finished = time.monotonic()
        assert events and all(t >= finished - 0.01 or t <= started for t in counted_trims)  # none while it ran
        _wait_for(lambda: len(counted_trims) == 1)
        time.sleep(0.3)
        assert len(counted_trims) == 1  # once, after the work, however long it stays idle
        list(engine.submit(request).iter_events(timeout=60))
        _wait_for(lambda: len(counted_trims) == 2)
    finally:
        engine.stop()


def _wait_for(condition, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_the_c_library_has_malloc_trim_here():
    assert release_freed_memory() is True
