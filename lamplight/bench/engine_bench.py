"""In-process engine figures: ms per decode step by batch size, prefill tokens/s, peak memory.

`lamplight bench --engine [--model ALIAS|PATH] [--paths reference,fast,compiled,native]` runs the
model directly (no HTTP), so the numbers isolate the forward pass, the sampler chain and the batch
assembly. `reference` is dequantized float32, `fast` PyTorch's packed kernels, `compiled` the fast
path with decode steps through torch.compile (`--compile`), `native` the C++ forward
(lamplight.native, the default where a compiler is available). Each path's KV cache has the
server's default type for it (f16 on the native path, f32 on PyTorch's).
Several paths are measured interleaved in one run, so machine drift affects them alike.
"""

from __future__ import annotations

import json
import resource
import statistics
import sys
import time

import torch

from ..models.batch import SequenceChunk
from ..sampling import SamplingParams, SequenceSampler, sample_batch

CONTEXT = 128  # tokens already in each sequence's cache when decode steps are timed

# --paths names -> the backend each measures (lamplight.loader.BACKENDS).
PATH_BACKENDS = {"reference": "reference", "fast": "pytorch", "compiled": "compiled", "native": "native"}


def _token(n: int, runner) -> int:
    """A token id from n: ids 100..1099 as before, within a small test vocabulary's range."""
    vocab = runner.config.vocab_size
    return n % 1000 + 100 if vocab > 1100 else n % vocab


def _state(runner, num_tokens: int, n_sequences: int = 1):
    """State with the server's default cache type for this backend."""
    dtype = torch.float16 if runner.default_cache_type == "f16" else torch.float32
    return runner.new_state(num_tokens, dtype, n_sequences=n_sequences)  # a recurrent slot per sequence


def decode_step_ms(runner, tokenizer, batch: int, steps: int) -> float:
    span = CONTEXT + steps  # each sequence's own range of state indices
    state = _state(runner, batch * span, batch)
    for b in range(batch):
        ids = [_token(b * 7 + i * 13, runner) for i in range(CONTEXT)]
        runner.run([SequenceChunk(ids, 0, range(b * span, b * span + CONTEXT), need_logits=False, state_slot=b)], state)
    params = SamplingParams(temperature=0.8, seed=1)
    samplers = [SequenceSampler(params, tokenizer=tokenizer, n_ctx=4096, choice_index=i) for i in range(batch)]
    tokens = [_token(200, runner)] * batch
    times = []
    for step in range(steps):
        start = time.perf_counter()
        pos = CONTEXT + step
        chunks = [SequenceChunk([tokens[b]], pos, range(b * span, b * span + pos + 1), state_slot=b)
                  for b in range(batch)]
        result = sample_batch(runner.run(chunks, state), samplers)
        for b, sampler in enumerate(samplers):
            sampler.accept(result.token_ids[b])
        tokens = result.token_ids
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def prefill_tokens_per_s(runner, n_tokens: int, chunk: int = 512) -> float:
    state = _state(runner, n_tokens)
    ids = [_token(i * 31, runner) for i in range(n_tokens)]
    start = time.perf_counter()
    for first in range(0, n_tokens, chunk):
        end = min(first + chunk, n_tokens)
        runner.run([SequenceChunk(ids[first:end], first, range(end))], state)
    return n_tokens / (time.perf_counter() - start)


def compiled_warm_up(runner) -> None:
    start = time.perf_counter()
    with torch.inference_mode():  # the mode the timed steps run in: compiled graphs are guarded on it
        runner.warm_up(_state(runner, 1024))
    print(f"[compiled] compiled in {time.perf_counter() - start:.0f} s", file=sys.stderr)


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_engine_bench(model_spec: str | None, paths: list[str], batches: list[int], steps: int, json_path: str | None) -> int:
    from ..loader import load

    results: dict[str, dict] = {}
    loaded = {}
    for path in paths:
        if path not in PATH_BACKENDS:
            raise SystemExit(f"unknown path {path!r} (use {', '.join(PATH_BACKENDS)})")
        try:
            m = load(model_spec, backend=PATH_BACKENDS[path])
        except RuntimeError as exc:  # the native backend where this machine has none
            raise SystemExit(str(exc)) from None
        loaded[path] = m
        if path == "compiled":
            compiled_warm_up(m.runner)
        results[path] = {"decode_ms": {}, "rss_after_load_mib": peak_rss_mib()}
    torch_threads = torch.get_num_threads()

    def threads_for(m) -> None:  # as the server runs each path (lamplight.server.launcher)
        torch.set_num_threads(1 if m.runner.owns_threads else torch_threads)

    with torch.inference_mode():
        for path, m in loaded.items():  # warm-up
            threads_for(m)
            decode_step_ms(m.runner, m.tokenizer, 1, 3)
        for batch in batches:
            for path, m in loaded.items():
                threads_for(m)
                ms = decode_step_ms(m.runner, m.tokenizer, batch, steps)
                results[path]["decode_ms"][batch] = ms
                print(f"[{path}] batch {batch:3d}: {ms:8.2f} ms/step  {1e3 * batch / ms:8.1f} tokens/s", file=sys.stderr)
        for path, m in loaded.items():
            threads_for(m)
            results[path]["prefill_tokens_per_s"] = prefill_tokens_per_s(m.runner, 512)
    torch.set_num_threads(torch_threads)
    print(format_engine_table(results, batches))
    sampler_ms = sampler_chain_ms(batches)
    print(format_sampler_share(results, sampler_ms))
    print(f"peak resident memory: {peak_rss_mib():.0f} MiB (all paths loaded together)")
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"results": results, "sampler_all_on_ms": sampler_ms, "peak_rss_mib": peak_rss_mib(),
                       "threads": torch.get_num_threads()}, f, indent=2)
    return 0


def sampler_chain_ms(batches: list[int]) -> dict[int, float]:
    """ms per step of the sampler chain with every sampler on (synthetic 49152-token vocabulary)."""
    from ..sampling.bench import ALL_ON, SyntheticTokenizer, make_samplers, random_logits, time_steps

    tokenizer = SyntheticTokenizer()
    out = {}
    for batch in batches:
        logits = random_logits(batch, seed=batch)
        out[batch] = time_steps(make_samplers(ALL_ON, batch, tokenizer), logits, 3)
    return out


def format_sampler_share(results: dict[str, dict], sampler_ms: dict[int, float]) -> str:
    lines = ["sampler chain with every sampler on, as a share of a decode step:"]
    for batch, ms in sampler_ms.items():
        shares = ", ".join(f"{100 * ms / r['decode_ms'][batch]:.0f}% of a {p} step" for p, r in results.items())
        lines.append(f"  batch {batch:3d}: {ms:7.2f} ms = {shares}")
    return "\n".join(lines)


def format_engine_table(results: dict[str, dict], batches: list[int]) -> str:
    """ms per step by path; with several paths, how many times faster each is than the first."""
    paths = list(results)
    first, others = paths[0], paths[1:]
    header = "batch | " + " | ".join(f"{p} ms/step" for p in paths)
    header += "".join(f" | {first}/{p}" for p in others)
    lines = [header, "-" * len(header)]
    for batch in batches:
        values = [results[p]["decode_ms"][batch] for p in paths]
        row = f"{batch:5d} | " + " | ".join(f"{v:13.2f}" for v in values)
        row += "".join(f" | {values[0] / v:8.2f}x" for v in values[1:])
        lines.append(row)
    lines.append("prefill tokens/s (512-token prompt): " + ", ".join(f"{p} {results[p]['prefill_tokens_per_s']:.0f}" for p in paths))
    return "\n".join(lines)
