"""The compiled decode step (`--compile`): same results as the eager forward, one set of graphs
for every batch size and context length, and batch invariance kept."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType as Q
from model_helpers import paged_state, runner_for
from tiny_gguf import write_tiny_gemma3, write_tiny_llama

from lamplight.engine.kv_cache import BlockTable
from lamplight.gguf.file import GGUFFile
from lamplight.models.batch import SequenceChunk, build_forward_batch


def _prefilled(model, lengths):
    state, cache = paged_state(model, num_blocks=128, block_size=8)
    tables = []
    for k, n in enumerate(lengths):
        table = BlockTable(cache)
        table.fill_to(n)
        ids = [(7 * i + 3 * k) % 200 + 10 for i in range(n)]
        model.run([SequenceChunk(ids, 0, table.slots(), need_logits=False)], state)
        tables.append(table)
    return (state, cache), tables


def _decode(runner, paged, tables, token=42):
    """One decode step for every table; the tables are rewound so the step can be repeated."""
    chunks = []
    for table in tables:
        position = table.num_tokens
        table.fill_to(position + 1)
        chunks.append(SequenceChunk([token], position, table.slots()))
    logits = runner.run_batch(build_forward_batch(chunks), paged[0])
    for table in tables:
        table.num_tokens -= 1
    return logits


@pytest.fixture(scope="module", autouse=True)
def inductor_cache(tmp_path_factory):
    """A cache of inductor's own for this module: nothing another run or process left there
    (a kernel truncated by a killed compile) can decide what these tests see, and the test that
    truncates a kernel does it in no one else's cache."""
    folder = tmp_path_factory.mktemp("inductor")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TORCHINDUCTOR_CACHE_DIR", str(folder))
        yield folder


@pytest.fixture(scope="module")
def compiled_files(tmp_path_factory, inductor_cache):
    """arch -> (path, compiled runner, the kernel files its warm-up compiled), each made once."""
    made: dict[str, tuple] = {}

    def get(arch: str):
        if arch not in made:
            before = set(inductor_cache.rglob("*.so"))
            folder = tmp_path_factory.mktemp(arch)
            path = write_tiny_llama(folder / "m.gguf", qtype=Q.Q4_1) if arch == "llama" else write_tiny_gemma3(folder / "m.gguf")
            decode = runner_for(path, "compiled")
            with torch.inference_mode():
                decode.warm_up(decode.new_state(512))
            made[arch] = path, decode, set(inductor_cache.rglob("*.so")) - before
        return made[arch]

    return get


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def compiled(request, compiled_files):
    """(the eager pytorch runner, the compiled one) of one file."""
    path, decode, _ = compiled_files(request.param)
    return runner_for(path, "pytorch"), decode


@torch.inference_mode()
def test_compiled_decode_matches_eager_and_never_recompiles(compiled):
    from torch._dynamo.utils import counters

    model, decode = compiled
    graphs_after_warm_up = counters["stats"]["unique_graphs"]
    for lengths in ([5], [100], [9, 30, 70], [3, 100], [17, 17, 17, 17, 17], [130]):
        cache, tables = _prefilled(model, lengths)
        eager = _decode(model, cache, tables)
        fast = _decode(decode, cache, tables)
        # Inductor's fused loops sum in another order than eager ops; where the sum feeds the bf16
        # head that can move a logit by one bf16 step (0.004 near 1 was seen with AVX-512 code).
        torch.testing.assert_close(fast, eager, rtol=1e-2, atol=1e-2)
    assert counters["stats"]["unique_graphs"] == graphs_after_warm_up


@torch.inference_mode()
def test_compiled_decode_rows_are_bit_identical_alone_and_batched(compiled):
    model, decode = compiled
    lengths = [9, 30, 70, 3]
    cache, tables = _prefilled(model, lengths)
    together = _decode(decode, cache, tables)
    for i, table in enumerate(tables):
        assert torch.equal(_decode(decode, cache, [table])[0], together[i])


def test_steps_with_prompt_chunks_run_eagerly(compiled):
    model, decode = compiled
    (_, cache), tables = _prefilled(model, [12])
    prompt = BlockTable(cache)
    prompt.fill_to(6)
    table = tables[0]
    table.fill_to(13)
    batch = build_forward_batch([SequenceChunk([42], 12, table.slots()), SequenceChunk([5, 6, 7, 8, 9, 10], 0, prompt.slots())])
    assert not decode.handles(batch)


def test_engine_with_compiled_decode_keeps_seeded_text_independent_of_the_batch(tmp_path):
    """A compiled engine computes decode tokens the same way whether or not a prompt chunk shares
    their step (the chunk runs in its own eager forward), so a seed gives the same text alone
    and among other requests."""
    from lamplight.engine.config import EngineConfig
    from lamplight.engine.engine import Engine
    from lamplight.engine.types import FinalEvent, GenerationRequest
    from lamplight.sampling import SamplingParams
    from lamplight.tokenizer import Tokenizer

    gguf = GGUFFile(write_tiny_llama(tmp_path / "m.gguf", qtype=Q.Q4_1, n_ctx=512))
    engine = Engine(runner_for(gguf, "compiled"), Tokenizer.from_gguf(gguf), EngineConfig(n_ctx=2048, n_parallel=4))
    engine.start()
    from torch._dynamo.utils import counters

    graphs_after_start = counters["stats"]["unique_graphs"]
    try:
        def final(handle):
            return next(e for e in handle.iter_events(timeout=120) if isinstance(e, FinalEvent))

        # cache_prompt off: a reused prefix would evaluate the last prompt token as a decode token.
        request = GenerationRequest([1, 20, 30, 40], SamplingParams(temperature=1.0, seed=99), n_predict=16,
                                    cache_prompt=False)
        alone = final(engine.submit(request))
        first = engine.submit(request)
        # Long prompts arriving while `first` decodes share its steps as prompt chunks.
        others = [engine.submit(GenerationRequest([1] + [(11 * i + k) % 200 + 5 for i in range(150)],
                                                  SamplingParams(temperature=1.0, seed=k), n_predict=4))
                  for k in range(3)]
        busy = final(first)
        for handle in others:
            final(handle)
        assert busy.token_ids == alone.token_ids
        # The start-up warm-up compiled every graph the engine thread needs (same autograd mode).
        assert counters["stats"]["unique_graphs"] == graphs_after_start
    finally:
        engine.stop()


@torch.inference_mode()
def test_decode_rows_beside_a_prompt_chunk_equal_a_decode_only_step(compiled):
    model, decode = compiled
    (state, cache), tables = _prefilled(model, [9, 40])
    decode_chunks = []
    for table in tables:
        table.fill_to(table.num_tokens + 1)
        decode_chunks.append(SequenceChunk([42], table.num_tokens - 1, table.slots()))
    prompt = BlockTable(cache)
    prompt.fill_to(20)
    mixed = decode.run(decode_chunks + [SequenceChunk(list(range(5, 25)), 0, prompt.slots())], state)
    alone = decode.run(decode_chunks, state)
    assert mixed.shape[0] == len(decode_chunks) + 1
    assert torch.equal(mixed[: len(decode_chunks)], alone)


NEXT_START = """
import json, os, sys, torch
sys.path.insert(0, sys.argv[2])
from lamplight.models.batch import SequenceChunk
from model_helpers import runner_for
decode = runner_for(sys.argv[1], "compiled")
with torch.inference_mode():
    decode.warm_up(decode.new_state(512))
    logits = decode.run([SequenceChunk([42], 5, range(6))], decode.new_state(8))[0, :8].tolist()
cache = os.environ["TORCHINDUCTOR_CACHE_DIR"]
mapped = sorted({line.split()[-1] for line in open("/proc/self/maps") if line.rstrip().endswith(".so")
                 and line.split()[-1].startswith(cache)})
print(json.dumps({"logits": logits, "kernels": mapped}))
"""


def _next_start(path, inductor_cache) -> tuple[dict, str]:
    """A new process starting on `path` with the module's inductor cache: (what it printed, its stderr)."""
    out = subprocess.run([sys.executable, "-c", NEXT_START, str(path), str(Path(__file__).parent)], capture_output=True,
                         text=True, timeout=600, env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(inductor_cache)})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def test_a_truncated_kernel_in_the_cache_is_compiled_again(compiled_files, inductor_cache):
    """A compile killed midway (Ctrl-C in the minutes of a first start) leaves a truncated kernel
    in inductor's cache, which inductor loads as it is at the next start ("file too short"):
    that start's warm-up removes it, compiles it again and serves the same logits."""
    path, _, _ = compiled_files("llama")
    first, _ = _next_start(path, inductor_cache)  # a start that loads its kernels from the cache
    assert first["kernels"], "the start loaded no kernel from the cache"
    victim = Path(max(first["kernels"], key=lambda k: Path(k).stat().st_size))
    truncated = victim.with_suffix(".truncated")  # a new file in its place (this process may map the old one)
    truncated.write_bytes(victim.read_bytes()[:64])
    truncated.replace(victim)
    again, stderr = _next_start(path, inductor_cache)
    assert f"truncated kernel ({victim.resolve()})" in stderr, stderr[-3000:]
    assert victim.stat().st_size > 64  # built again
    assert again["logits"] == first["logits"]
