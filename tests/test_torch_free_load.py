"""Loading a model for the native forward imports no torch: lamplight.load(..., backend="native"
or "fast") reads the file, builds the native runner (packed weights, numpy norms and RoPE
tables, LoRA adapters), times the one-row prefetch and returns the LoadedModel with torch
never imported; the native pool's threads without torch, and the build cache's key. Each
script runs in a fresh interpreter whose imports of torch raise."""

from __future__ import annotations

import importlib.metadata

import pytest
from no_torch import native_library, printed, run_without_torch  # noqa: F401 (native_library: a fixture)
from tiny_gguf import write_tiny_llama, write_tiny_lora

from lamplight.native import build, runtime
from lamplight.native.prefetch import CHOICES
from lamplight.native.threads import default_threads


def test_the_guard_stops_an_import_of_torch():
    """The harness has teeth: a module that imports torch fails under it."""
    out = run_without_torch("import lamplight.models.decoder\n")
    assert out.returncode != 0 and "ImportError: torch imported: torch" in out.stderr, out.stderr


@pytest.mark.parametrize("backend", ["native", "fast"])
def test_a_native_load_imports_no_torch(native_library, backend, tmp_path):
    path = write_tiny_llama(tmp_path / "tiny.gguf")
    targets = {"blk.0.attn_q.weight": (64, 64), "blk.1.ffn_down.weight": (64, 128)}
    adapter = write_tiny_lora(tmp_path / "adapter.gguf", targets, rank=4, alpha=8.0)
    script = f"""
import lamplight
m = lamplight.load({str(path)!r}, backend={backend!r}, loras=[({str(adapter)!r}, 0.5)])
assert "torch" not in sys.modules
print("BACKEND", m.runner.backend)
print("READS", tuple(m.runner.one_row_reads))
print("THREADS", m.runner.threads)
print("ADAPTERS", len(m.adapters), m.runner.lora_scales.scales)  # scales set by the runner's attach_loras
print("TOKENS", len(m.tokenizer.encode("hello")))
"""
    out = run_without_torch(script)
    assert out.returncode == 0, out.stderr
    lines = printed(out)
    assert lines["BACKEND"] == "native"
    assert lines["READS"] in {str(tuple(c)) for c in CHOICES}  # the one-row reads were timed and chosen
    assert int(lines["THREADS"]) == default_threads()  # torch's default, as if it were loaded
    assert lines["ADAPTERS"] == "1 [0.0]"
    assert int(lines["TOKENS"]) > 0


@pytest.mark.parametrize("omp, mkl", [(None, None), ("1", None), ("64", None), ("2", "1")])
def test_default_threads_are_torchs(omp, mkl):
    """Without torch the native pool gets the count torch would have by default (its MKL build's):
    the cores, fewer where OMP_NUM_THREADS or MKL_NUM_THREADS (which wins) asks for fewer."""
    script = ("from lamplight.native.threads import default_threads\n"
              "print('OURS', default_threads())\n"
              "sys.meta_path.pop(0)  # the guard off: now torch's own count\n"
              "import torch\n"
              "print('TORCHS', torch.get_num_threads())\n")
    out = run_without_torch(script, {"OMP_NUM_THREADS": omp, "MKL_NUM_THREADS": mkl})
    assert out.returncode == 0, out.stderr
    lines = printed(out)
    assert lines["OURS"] == lines["TORCHS"]


def test_the_build_key_holds_torchs_version_string():
    """The native libraries' cache key still holds torch.__version__ (read from the installed
    package now): the libraries built before keep their names, nothing is rebuilt."""
    import torch

    assert build._torch_version() == torch.__version__ == importlib.metadata.version("torch")


def test_the_native_pool_follows_torchs_count_where_torch_is_loaded(native_library, tmp_path, monkeypatch):
    """A library user's torch.set_num_threads before loading: a runner built then takes it (in a
    process where lamplight set no count: an in-process server of an earlier test may have)."""
    import torch

    import lamplight.threads

    monkeypatch.setattr(lamplight.threads, "_requested", None)
    monkeypatch.setattr(lamplight.threads, "_torch_threads", None)

    from lamplight.gguf.file import GGUFFile
    from lamplight.models import define_model
    from lamplight.native.runner import NativeRunner

    spec = define_model(GGUFFile(write_tiny_llama(tmp_path / "tiny.gguf")))
    before = torch.get_num_threads()
    try:
        for threads in (1, 3):
            torch.set_num_threads(threads)
            assert NativeRunner(spec, runtime.library()).threads == threads
    finally:
        torch.set_num_threads(before)
        runtime.library().lp_set_threads(before)


def test_minus_t_sizes_the_pool_and_lamplights_own_torch_count_does_not(native_library, tmp_path, monkeypatch):
    """-t (lamplight.threads.request_threads) sizes a runner's pool when it is built, whatever
    torch's count; without -t, the one thread the native server gives PyTorch's own ops
    (set_torch_threads(1): an --embedding encoder built after it) is not the pool's count: the
    default is. The conftest fixture puts the process-wide counts back afterwards."""
    import torch

    from lamplight.gguf.file import GGUFFile
    from lamplight.models import define_model
    from lamplight.native.runner import NativeRunner
    from lamplight.native.threads import default_threads
    from lamplight.threads import request_threads, set_torch_threads

    import lamplight.threads

    monkeypatch.setattr(lamplight.threads, "_requested", None)
    spec = define_model(GGUFFile(write_tiny_llama(tmp_path / "tiny.gguf")))
    before = torch.get_num_threads()
    try:
        set_torch_threads(1)  # the server's dedicate_threads_to_native, no -t
        assert NativeRunner(spec, runtime.library()).threads == default_threads()  # not torch's 1 (2 cores here)
        torch.set_num_threads(3)  # its user's count since: followed
        assert NativeRunner(spec, runtime.library()).threads == 3
        request_threads(default_threads() + 1)
        torch.set_num_threads(1)
        assert NativeRunner(spec, runtime.library()).threads == default_threads() + 1
    finally:
        torch.set_num_threads(before)
        runtime.library().lp_set_threads(before)


# A step on two threads, then the pool grown to three (as `lamplight serve -t` does after a load
# that ran the one-row prefetch timing), then the same step: the attention's per-thread scratch
# must grow with the pool (it once compared its two buffers a thread with the thread count, and
# threads past the old count wrote past the end: a crash of the server one start in three).
GROWN_POOL = """
import numpy as np
from lamplight.gguf.file import GGUFFile
from lamplight.models import define_model
from lamplight.models.chunks import SequenceChunk
from lamplight.native import runtime
from lamplight.native.runner import NativeRunner

lib = runtime.library()
lib.lp_set_threads(2)
runner = NativeRunner(define_model(GGUFFile({model!r})), lib)
prompt = [SequenceChunk(list(range(1, 257)), 0, range(256))]
first = runner.step(prompt, runner.new_state(512)).copy()
lib.lp_set_threads(3)
print("THREADS", lib.lp_get_threads())
print("SAME", all(np.array_equal(runner.step(prompt, runner.new_state(512)), first) for _ in range(20)))
"""


def test_a_step_after_the_pool_grows(native_library, tmp_path):
    model = write_tiny_llama(tmp_path / "tiny.gguf", n_ctx=512)
    out = run_without_torch(GROWN_POOL.format(model=str(model)))
    assert out.returncode == 0, out.stderr[-3000:]
    assert printed(out) == {"THREADS": "3", "SAME": "True"}, out.stdout
