"""Benchmark of the native low-bit matmul against PyTorch's CPU kernels, one thread.

On SmolLM2-135M's weights: all 30 layers' linears (fused qkv 576->960, out 576->576, fused
gate_up 576->3072, down 1536->576, Q4_1) and the output head (576->49152, Q8_0), at several
row counts. The native kernels' times include quantizing the activations. Methods are timed in
interleaved repetitions (each repetition runs every method once) and the median is reported.

    python -m lamplight.native.kernels_bench [--rows 1 4 16 32 512] [--reps 5] [--variants avx2 ...]
        [--lib NAME=PATH ...]

--lib adds another build of the kernels (a shared library, e.g. an older source's, built with
`c++ <build.COMMON_FLAGS and a variant's flags> qmatmul.cpp qacts.cpp -o PATH`) as a column, for
side-by-side timings in the same interleaved run.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from ..gguf.file import GGUFFile
from ..gguf.quant import dequantize
from ..kernels.linear import Int4CpuKernel, Int8CpuKernel
from ..kernels.unpack import unpack_int4
from . import build
from .kernels import QKernels
from .pack import PackedWeight, pack, pack_rows

LAYER_GROUPS = (("attn_q", "attn_k", "attn_v"), ("attn_output",), ("ffn_gate", "ffn_up"), ("ffn_down",))


def _fused(gguf: GGUFFile, layer: int, names: tuple[str, ...]):
    return [gguf.tensors[f"blk.{layer}.{name}.weight"] for name in names]


class Native:
    """Every linear as quantize + lp_qmatmul into preallocated buffers."""

    def __init__(self, kernels: QKernels, weights: list[PackedWeight]):
        self.kernels, self.weights = kernels, weights
        self.qweights = [kernels.qweight(p) for p in weights]

    def run(self, inputs: dict[int, torch.Tensor]) -> None:
        lib = self.kernels.lib
        for p, qw in zip(self.weights, self.qweights):
            x = inputs[p.k]
            acts, out = self._buffers(x.shape[0], p)
            lib.lp_quantize_rows(x.data_ptr(), x.stride(0), p.k, x.shape[0], acts.data_ptr())
            lib.lp_qmatmul(qw, acts.data_ptr(), x.shape[0], out.data_ptr(), out.stride(0), 0, p.n)

    def _buffers(self, rows: int, p: PackedWeight):
        key = (rows, p.k, p.n)
        cache = self.__dict__.setdefault("_cache", {})
        if key not in cache:
            cache[key] = (torch.empty(rows, self.kernels.row_bytes(p.k), dtype=torch.uint8),
                          torch.empty(rows, p.n, dtype=torch.float32))
        return cache[key]


class Torch:
    """Every linear as a PyTorch callable (int4pack kernels or float32 F.linear)."""

    def __init__(self, fns: list[tuple[int, object]]):
        self.fns = fns  # (k, fn)

    def run(self, inputs: dict[int, torch.Tensor]) -> None:
        for k, fn in self.fns:
            fn(inputs[k])


def build_methods(gguf: GGUFFile, variants: list[str], n_layers: int, libs: dict[str, str] | None = None):
    layers, heads = {}, {}
    packed = [pack_rows(_fused(gguf, i, names)) for i in range(n_layers) for names in LAYER_GROUPS]
    head_info = gguf.tensors.get("output.weight") or gguf.tensors["token_embd.weight"]
    head_packed = pack(head_info)
    for variant in variants:
        kernels = QKernels.load(variant)
        layers[f"native {variant}"] = Native(kernels, packed)
        heads[f"native {variant}"] = Native(kernels, [head_packed])
    for name, path in (libs or {}).items():
        kernels = QKernels(path)
        layers[name] = Native(kernels, packed)
        heads[name] = Native(kernels, [head_packed])
    int4, dense = [], []
    for i in range(n_layers):
        for names in LAYER_GROUPS:
            infos = _fused(gguf, i, names)
            parts = [unpack_int4(info) for info in infos]
            q, scale, zero = (torch.cat([p[j] for p in parts]) for j in range(3))
            int4.append((q.shape[1], Int4CpuKernel(q, scale, zero)._int4))
            weight = torch.cat([torch.from_numpy(dequantize(info)) for info in infos])
            dense.append((weight.shape[1], lambda x, w=weight: F.linear(x, w)))
    layers["int4pack (bf16)"] = Torch(int4)
    layers["F.linear f32"] = Torch(dense)
    head_w = torch.from_numpy(dequantize(head_info))
    heads["int8pack (bf16)"] = Torch([(head_w.shape[1], Int8CpuKernel(head_w))])
    heads["F.linear f32"] = Torch([(head_w.shape[1], lambda x: F.linear(x, head_w))])
    return layers, heads


def time_methods(methods: dict, rows: int, reps: int, slow_limit_s: float) -> dict[str, float]:
    """Median milliseconds per method; a method slower than slow_limit_s runs once."""
    gen = torch.Generator().manual_seed(0)
    inputs = {k: torch.randn(rows, k, generator=gen) for k in (576, 1536)}
    times: dict[str, list[float]] = {name: [] for name in methods}
    for name, method in methods.items():  # warm-up, and the slow ones' single run
        start = time.perf_counter()
        method.run(inputs)
        if time.perf_counter() - start > slow_limit_s:
            times[name].append(time.perf_counter() - start)
    for _ in range(reps):
        for name, method in methods.items():
            if len(times[name]) == 1 and times[name][0] > slow_limit_s:
                continue
            start = time.perf_counter()
            method.run(inputs)
            times[name].append(time.perf_counter() - start)
    return {name: 1000 * statistics.median(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16, 32, 512])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--variants", nargs="+", default=[v for v in build.runnable_variants() if v != "generic"])
    parser.add_argument("--lib", action="append", default=[], metavar="NAME=PATH",
                        help="another build of the kernels to time alongside (repeatable)")
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--slow-limit", type=float, default=2.0, help="seconds above which a method runs once")
    args = parser.parse_args()
    torch.set_num_threads(1)
    from ..sources import resolve_model

    gguf = GGUFFile(resolve_model("smollm2-135m-instruct"))
    libs = dict(spec.split("=", 1) for spec in args.lib)
    layers, heads = build_methods(gguf, args.variants, args.layers, libs)
    for title, methods in ((f"{args.layers} layers' linears", layers), ("head 576->49152 Q8_0", heads)):
        names = list(methods)
        print(f"\n{title}, ms (median of {args.reps}, one thread)")
        print(f"{'rows':>5} " + " ".join(f"{n:>18}" for n in names))
        for rows in args.rows:
            ms = time_methods(methods, rows, args.reps, args.slow_limit)
            print(f"{rows:>5} " + " ".join(f"{ms[n]:>18.2f}" for n in names), flush=True)


if __name__ == "__main__":
    main()
