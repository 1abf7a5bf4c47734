"""The single-stream roofline: how fast one decode stream could go if reading the weights were all
it did.

Decoding one token of one stream reads every weight once (the token embedding table only for its
one row, unless the output head shares it; a mixture of experts only the experts a token uses),
and the machine reads memory at some rate, so bandwidth / bytes read per token bounds the tokens a
second. The host's bandwidth moves from minute to minute on shared machines, so the benchmark
measures it right before and after each single-stream request it judges, never once for a run.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import statistics
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from lamplight.bench.report import MetricRow, ScenarioResult, median_or_none
from lamplight.gguf.file import GGUFError, GGUFFile

if TYPE_CHECKING:
    from lamplight.bench.context import Target

# What the probe reads: far past any last-level cache, small enough to take a fraction of a second.
PROBE_BYTES = 512 << 20
PROBE_PASSES = 3

def decode_bytes_per_token(path: str | os.PathLike) -> int:
    """Bytes of weights one decode step of one stream reads from the GGUF at `path`."""
    gguf = GGUFFile(path)
    expert_share = _expert_share(gguf)
    total = 0.0
    for name, tensor in gguf.tensors.items():
        if name == "token_embd.weight" and "output.weight" in gguf.tensors:
            total += tensor.data.shape[1]  # one row looked up; the head has its own matrix
        elif "_exps." in name:
            total += tensor.data.nbytes * expert_share
        else:
            total += tensor.data.nbytes
    return int(total)


def _expert_share(gguf: GGUFFile) -> float:
    """The share of a mixture-of-experts layer's experts one token uses (1 without experts)."""
    experts = gguf.arch_value("expert_count") or 0
    used = gguf.arch_value("expert_used_count") or 0
    return used / experts if experts and used else 1.0


def model_bytes_or_reason(url: str, path: str | None) -> tuple[int | None, str | None]:
    """Bytes per token of the model file of the server at `url`, or why they are unknown here."""
    if not _is_loopback(url):
        return None, "the server runs on another host, whose bandwidth this one cannot measure"
    if not path:
        return None, "the server does not say its model file (/props model_path)"
    try:
        return decode_bytes_per_token(path), None
    except GGUFError as exc:
        return None, f"its model file cannot be read here ({exc})"


def _is_loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def read_bandwidth_gbps(threads: int | None = None) -> float | None:
    """The host's memory read bandwidth in GB/s with `threads` threads (default: every core this
    process may run on), or None where the native kernels are not available."""
    from lamplight.native import runtime

    lib = runtime.library()
    if lib is None:
        return None
    pool = lib.lp_get_threads()
    lib.lp_set_threads(threads or len(os.sched_getaffinity(0)))
    try:
        gbps = lib.lp_read_bandwidth(PROBE_BYTES, PROBE_PASSES)
    finally:
        lib.lp_set_threads(pool)  # the pool as it was, for whatever else runs in this process
    return gbps if gbps > 0 else None


def roofline_percent(decode_tps: float | None, bytes_per_token: int | None,
                     bandwidth_gbps: float | None) -> float | None:
    """Decode speed as a percentage of bandwidth / bytes per token."""
    if not decode_tps or not bytes_per_token or not bandwidth_gbps:
        return None
    return 100.0 * decode_tps * bytes_per_token / (bandwidth_gbps * 1e9)


class Roofline:
    """The roofline figures of the single-stream scenario: each server's bytes read per token (from
    its model file, where it runs on this host), and the bandwidth measured before and after each
    of its requests (their mean judges the request)."""

    def __init__(self, targets: list[Target]):
        self.bytes: dict[str, int | None] = {}
        self.reasons: dict[str, str] = {}
        for target in targets:
            self.bytes[target.label], reason = model_bytes_or_reason(target.info.url, target.info.model_path)
            if reason:
                self.reasons[target.label] = reason
        self.samples: dict[str, list[float]] = {target.label: [] for target in targets}
        self.unavailable = False

    def judged(self, label: str) -> bool:
        return self.bytes.get(label) is not None and not self.unavailable

    async def sample(self, label: str) -> float | None:
        """The bandwidth now, where `label`'s requests are judged (the servers idle meanwhile)."""
        if not self.judged(label):
            return None
        gbps = await asyncio.to_thread(read_bandwidth_gbps)
        if gbps is None:
            self.unavailable = True
            return None
        self.samples[label].append(gbps)
        return gbps

    def judge(self, record: dict, before: float | None, after: float | None) -> None:
        """Adds the request's bandwidth, roofline and share of it to its record."""
        if before is None or after is None:
            return
        bandwidth = (before + after) / 2
        bytes_per_token = self.bytes[record["server"]]
        record["bandwidth_gbps"] = bandwidth
        record["roofline_tps"] = bandwidth * 1e9 / bytes_per_token
        record["roofline_pct"] = roofline_percent(record.get("decode_tps"), bytes_per_token, bandwidth)

    def rows(self, scenario: ScenarioResult, labels: list[str]) -> list[MetricRow]:
        if not any(self.samples.values()):
            return []
        share, bandwidth, samples = {}, {}, {}
        for label in labels:
            figures = [r["roofline_pct"] for r in scenario.records_of(label)
                       if not r["error"] and r.get("roofline_pct") is not None]
            share[label] = median_or_none(figures)
            samples[label] = len(figures)
            bandwidth[label] = median_or_none(self.samples[label])
        return [
            MetricRow(scenario.name, "decode speed, share of the memory roofline", "%", True, share, samples),
            MetricRow(scenario.name, "memory read bandwidth around the requests", "GB/s", True, bandwidth,
                      {label: len(self.samples[label]) for label in labels}, compared=False),
        ]

    def params(self) -> dict:
        """What the scenario's JSON says of the roofline: its inputs and why a server has none."""
        spread = [g for samples in self.samples.values() for g in samples]
        return {
            "bytes_per_token": self.bytes,
            "bandwidth_probe": f"best of {PROBE_PASSES} passes over {PROBE_BYTES >> 20} MiB with every core, "
                               f"each read as one stream and as 4 interleaved streams a core, "
                               f"before and after each request",
            "bandwidth_gbps": {"min": min(spread), "median": statistics.median(spread), "max": max(spread)}
            if spread else None,
            "not_judged": {**self.reasons,
                           **({label: "the native kernels that measure bandwidth are not available"
                               for label in self.samples if self.unavailable})},
        }
