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

from ..engine.kv_cache import BlockTable, KVCache
from ..models.batch import SequenceChunk, build_forward_batch
from ..sampling import SamplingParams, SequenceSampler, sample_batch

CONTEXT = 128  # tokens already in each sequence's cache when decode steps are timed


def _token(n: int, model) -> int:
    """A token id from n: ids 100..1099 as before, within a small test vocabulary's range."""
    vocab = model.config.vocab_size
    return n % 1000 + 100 if vocab > 1100 else n % vocab


def _cache_dtype(model) -> torch.dtype:
    return torch.float16 if model.native is not None else torch.float32


def decode_step_ms(model, tokenizer, batch: int, steps: int, forward=None) -> float:
    forward = forward or model
    cache = KVCache(model.config.kv_layout, num_blocks=batch * (CONTEXT + steps + 16) // 16 + batch, block_size=16,
                    dtype=_cache_dtype(model))
    tables = []
    for b in range(batch):
        table = BlockTable(cache)
        table.fill_to(CONTEXT)
        ids = [_token(b * 7 + i * 13, model) for i in range(CONTEXT)]
        model(build_forward_batch([SequenceChunk(ids, 0, table.slots(), need_logits=False)]), cache)
        tables.append(table)
    params = SamplingParams(temperature=0.8, seed=1)
    samplers = [SequenceSampler(params, tokenizer=tokenizer, n_ctx=4096, choice_index=i) for i in range(batch)]
    tokens = [_token(200, model)] * batch
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        chunks = []
        for b, table in enumerate(tables):
            pos = table.num_tokens
            table.fill_to(pos + 1)
            chunks.append(SequenceChunk([tokens[b]], pos, table.slots()))
        logits = forward(build_forward_batch(chunks), cache)
        result = sample_batch(logits, samplers)
        for b, sampler in enumerate(samplers):
            sampler.accept(result.token_ids[b])
        tokens = result.token_ids
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def prefill_tokens_per_s(model, n_tokens: int, chunk: int = 512) -> float:
    cache = KVCache(model.config.kv_layout, num_blocks=n_tokens // 16 + 2, block_size=16, dtype=_cache_dtype(model))
    table = BlockTable(cache)
    ids = [_token(i * 31, model) for i in range(n_tokens)]
    start = time.perf_counter()
    for first in range(0, n_tokens, chunk):
        end = min(first + chunk, n_tokens)
        table.fill_to(end)
        model(build_forward_batch([SequenceChunk(ids[first:end], first, table.slots())]), cache)
    return n_tokens / (time.perf_counter() - start)


def compiled_forward(model):
    from ..kernels.compiled import CompiledDecode

    forward = CompiledDecode(model)
    start = time.perf_counter()
    with torch.inference_mode():
        forward.warm_up(KVCache(model.config.kv_layout, num_blocks=64, block_size=16))
    print(f"[compiled] compiled in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    return forward


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_engine_bench(model_spec: str | None, paths: list[str], batches: list[int], steps: int, json_path: str | None) -> int:
    from ..loader import load

    results: dict[str, dict] = {}
    loaded = {}
    forwards = {}
    for path in paths:
        m = load(model_spec, fast=(path != "reference"))
        if path == "native" and m.model.native is None:
            raise SystemExit(f"no native path here: {m.kernels}")
        if path != "native":
            m.model.use_torch_kernels(f"the {path} path is benchmarked")
        m.model.requires_grad_(False)
        loaded[path] = m
        forwards[path] = m.model
        if path == "compiled":
            forwards[path] = compiled_forward(m.model)
        results[path] = {"decode_ms": {}, "rss_after_load_mib": peak_rss_mib()}
    torch_threads = torch.get_num_threads()

    def threads_for(m) -> None:  # as the server runs each path (lamplight.server.launcher)
        torch.set_num_threads(1 if m.model.native is not None else torch_threads)

    with torch.inference_mode():
        for path, m in loaded.items():  # warm-up
            threads_for(m)
            decode_step_ms(m.model, m.tokenizer, 1, 3, forwards[path])
        for batch in batches:
            for path, m in loaded.items():
                threads_for(m)
                ms = decode_step_ms(m.model, m.tokenizer, batch, steps, forwards[path])
                results[path]["decode_ms"][batch] = ms
                print(f"[{path}] batch {batch:3d}: {ms:8.2f} ms/step  {1e3 * batch / ms:8.1f} tokens/s", file=sys.stderr)
        for path, m in loaded.items():
            threads_for(m)
            results[path]["prefill_tokens_per_s"] = prefill_tokens_per_s(m.model, 512)
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
    from ..sampling.bench import ALL_ON, N_VOCAB, SyntheticTokenizer, make_samplers, time_steps

    tokenizer = SyntheticTokenizer()
    out = {}
    for batch in batches:
        logits = torch.randn(batch, N_VOCAB, generator=torch.Generator().manual_seed(batch)) * 3
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
