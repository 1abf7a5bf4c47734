"""The single-stream roofline of lamplight bench: bytes read per decoded token from the model
file, the host's bandwidth from the native probe taken around each request, and the share of
bandwidth / bytes that each server's decode speed reaches."""

from __future__ import annotations

import itertools
import statistics

import gguf
import pytest
from test_bench_client import FakeServer, FakeSpec, metric, run_bench
from tiny_gguf import write_tiny_arch, write_tiny_llama

from lamplight.bench import roofline
from lamplight.native import build, runtime


def _file_bytes(path) -> dict[str, int]:
    """Each tensor's stored bytes, as the gguf package (not lamplight's reader) sees them."""
    return {t.name: int(t.n_bytes) for t in gguf.GGUFReader(path).tensors}


def test_a_separate_output_head_leaves_one_embedding_row(tmp_path):
    path = write_tiny_llama(tmp_path / "own-head.gguf", output_qtype=gguf.GGMLQuantizationType.Q8_0)
    sizes = _file_bytes(path)
    n_vocab = next(t for t in gguf.GGUFReader(path).tensors if t.name == "token_embd.weight").shape[1]
    one_row = sizes["token_embd.weight"] // n_vocab
    assert roofline.decode_bytes_per_token(path) == sum(sizes.values()) - sizes["token_embd.weight"] + one_row


def test_tied_embeddings_are_read_whole_by_the_head(tmp_path):
    path = write_tiny_llama(tmp_path / "tied.gguf")
    assert roofline.decode_bytes_per_token(path) == sum(_file_bytes(path).values())


def test_experts_count_at_the_share_a_token_uses(tmp_path):
    path = write_tiny_arch(tmp_path / "moe.gguf", "qwen3moe")  # 2 of 4 experts a token
    sizes = _file_bytes(path)
    experts = sum(n for name, n in sizes.items() if "_exps." in name)
    assert experts > 0
    dense = sum(sizes.values()) - experts - sizes["token_embd.weight"]
    n_vocab = next(t for t in gguf.GGUFReader(path).tensors if t.name == "token_embd.weight").shape[1]
    assert roofline.decode_bytes_per_token(path) == dense + experts // 2 + sizes["token_embd.weight"] // n_vocab


def test_only_local_servers_with_a_readable_file_are_judged(tmp_path):
    path = write_tiny_llama(tmp_path / "m.gguf")
    assert roofline.model_bytes_or_reason("http://127.0.0.1:8080", str(path))[0] > 0
    assert roofline.model_bytes_or_reason("http://localhost:8080", str(path))[0] > 0
    for url, file, why in [("http://10.1.2.3:8080", str(path), "another host"),
                           ("http://127.0.0.1:8080", None, "model_path"),
                           ("http://127.0.0.1:8080", str(tmp_path / "gone.gguf"), "cannot be read")]:
        size, reason = roofline.model_bytes_or_reason(url, file)
        assert size is None and why in reason


@pytest.mark.skipif(build.compiler() is None, reason="no C++ compiler")
def test_the_native_probe_reads_memory_and_refuses_bad_sizes():
    lib = runtime.library()
    assert lib is not None
    assert lib.lp_read_bandwidth(8 << 20, 2) > 0.05  # GB/s: any machine reads 8 MiB faster than that
    assert lib.lp_read_bandwidth(100, 1) == -1.0
    assert lib.lp_read_bandwidth(8 << 20, 0) == -1.0
    pool = lib.lp_get_threads()
    gbps = roofline.read_bandwidth_gbps(threads=pool + 1)
    assert gbps is not None and gbps > 0.05
    assert lib.lp_get_threads() == pool  # the probe's threads are given back


def test_each_request_is_judged_by_the_bandwidth_around_it(tmp_path, monkeypatch):
    path = write_tiny_llama(tmp_path / "m.gguf", output_qtype=gguf.GGMLQuantizationType.Q8_0)
    probes = itertools.cycle([10.0, 30.0, 50.0])
    monkeypatch.setattr(roofline, "read_bandwidth_gbps", lambda: next(probes))
    with FakeServer(FakeSpec(model_path=str(path))) as a, FakeServer(FakeSpec(per_token_delay=0.016)) as b:
        code, report = run_bench(tmp_path, "--url", a.url, "--compare", b.url, "--scenarios", "decode")
    assert code == 0
    decode = report["scenarios"][0]
    per_token = roofline.decode_bytes_per_token(path)
    judged = [r for r in decode["requests"] if r["server"] == "A"]
    assert len(judged) == 2
    for request in judged:
        # Two probes a request, in order: (10, 30) then (50, 10).
        assert request["bandwidth_gbps"] in (20.0, 30.0)
        assert request["roofline_tps"] == pytest.approx(request["bandwidth_gbps"] * 1e9 / per_token)
        assert request["roofline_pct"] == pytest.approx(100 * request["decode_tps"] / request["roofline_tps"])
    assert all("roofline_pct" not in r for r in decode["requests"] if r["server"] == "B")
    share = metric(report, "decode", "decode speed, share of the memory roofline")
    assert share["values"]["A"] == pytest.approx(statistics.median(r["roofline_pct"] for r in judged))
    assert share["values"]["B"] is None and share["ratio_a_over_b"] is None
    bandwidth = metric(report, "decode", "memory read bandwidth")
    assert bandwidth["values"]["A"] == pytest.approx(statistics.median([10.0, 30.0, 50.0, 10.0]))
    assert bandwidth["ratio_a_over_b"] is None and bandwidth["better"] is None
    params = decode["params"]["roofline"]
    assert params["bytes_per_token"] == {"A": per_token, "B": None}
    assert "model_path" in params["not_judged"]["B"]
    assert params["bandwidth_gbps"]["min"] == 10.0 and params["bandwidth_gbps"]["max"] == 50.0


def test_no_probe_without_a_model_file(tmp_path, monkeypatch):
    def fail():
        raise AssertionError("the bandwidth was measured with nothing to judge")

    monkeypatch.setattr(roofline, "read_bandwidth_gbps", fail)
    with FakeServer(FakeSpec()) as server:
        code, report = run_bench(tmp_path, "--url", server.url, "--scenarios", "decode")
    assert code == 0 and report["warnings"] == []
    assert [r["metric"] for r in report["summary"] if "roofline" in r["metric"] or "bandwidth" in r["metric"]] == []
