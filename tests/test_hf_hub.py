"""`-hf USER/REPO[:QUANT]`, `lamplight pull USER/REPO[:QUANT]` and `lamplight models` against a
local stand-in for the Hugging Face Hub (tests/fake_hub.py, via HF_ENDPOINT) serving tiny GGUFs:
quant choice, split files, resume (within a run and across runs), hash check, offline use of the
cache, and a plain message with a non-zero exit for each failure."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest
from fake_hub import FakeHub, FakeRepo
from tiny_gguf import write_tiny_llama

from lamplight.hf_download import RETRIES
from lamplight.hf_hub import HubFile, available_quants, choose_gguf, parse_hf_spec
from lamplight.sources import ModelSourceError

REPO = "tester/Tiny-GGUF"
VISION_REPO = "tester/Vision-GGUF"  # a model with projector files (--mmproj-auto)
BIG, BIG_FILE = "tester/Big-GGUF", "big-Q4_K_M.gguf"


@pytest.fixture(scope="module")
def tiny_bytes(tmp_path_factory) -> bytes:
    return write_tiny_llama(tmp_path_factory.mktemp("hub") / "tiny.gguf").read_bytes()


@pytest.fixture
def hub(tiny_bytes):
    third = len(tiny_bytes) // 3
    parts = [tiny_bytes[:third], tiny_bytes[third:2 * third], tiny_bytes[2 * third:]]
    repos = {
        REPO: FakeRepo({"tiny-Q8_0.gguf": tiny_bytes, "tiny-Q4_K_M.gguf": tiny_bytes, "README.md": b"# tiny"}),
        VISION_REPO: FakeRepo({"tiny-Q8_0.gguf": tiny_bytes, "mmproj-tiny-F16.gguf": b"not a model",
                               "mmproj-tiny-Q8_0.gguf": b"not a model either"}),
        "tester/Split-GGUF": FakeRepo({f"Q8_0/tiny-Q8_0-{i:05d}-of-00003.gguf": part for i, part in enumerate(parts, 1)}),
        "tester/Gated-GGUF": FakeRepo({"tiny-Q4_K_M.gguf": tiny_bytes}, gated_token="hf_secret"),
        "tester/Corrupt-GGUF": FakeRepo({"tiny-Q4_K_M.gguf": tiny_bytes}, corrupt={"tiny-Q4_K_M.gguf"}),
    }
    with FakeHub(repos) as hub:
        yield hub


def lamplight(args: list[str], hub_url: str, home, offline: bool = False, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lamplight.cli", *args], env=_env(hub_url, home, offline),
                          capture_output=True, text=True, timeout=120, **kwargs)


def _env(hub_url: str, home, offline: bool = False) -> dict[str, str]:
    env = {**os.environ, "HF_ENDPOINT": hub_url, "HF_HOME": str(home), "HF_HUB_DISABLE_TELEMETRY": "1",
           "HF_HUB_DISABLE_XET": "1", "LAMPLIGHT_CACHE": str(home / "lamplight")}
    env.pop("HF_TOKEN", None)
    env.pop("HF_HUB_OFFLINE", None)
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    return env


def test_quant_choice_follows_llama_cpp():
    files = [HubFile(n) for n in ("a-Q4_K.gguf", "a-Q4_K_M.gguf", "a-Q8_0.gguf", "mmproj-a-F16.gguf", "README.md")]
    assert choose_gguf(files, None, "r")[0].name == "a-Q4_K_M.gguf"  # the default
    assert choose_gguf(files, "q4_k", "r")[0].name == "a-Q4_K.gguf"  # whole tokens, any case
    assert choose_gguf(files[2:], None, "r")[0].name == "a-Q8_0.gguf"  # no Q4_K_M: the first GGUF
    with pytest.raises(ModelSourceError, match="no Q2_K GGUF; available: Q4_K, Q4_K_M, Q8_0"):
        choose_gguf(files, "Q2_K", "r")
    split = [HubFile(f"b-Q8_0-0000{i}-of-00002.gguf") for i in (2, 1)]
    assert choose_gguf(split, "Q8_0", "r")[0].name == "b-Q8_0-00001-of-00002.gguf"
    assert available_quants(files) == ["F16", "Q4_K", "Q4_K_M", "Q8_0"]
    assert parse_hf_spec("u/r:Q8_0") == ("u/r", "Q8_0") and parse_hf_spec("u/r") == ("u/r", None)
    with pytest.raises(ModelSourceError):
        parse_hf_spec("just-a-name")


def test_pull_caches_lists_and_works_offline(hub, tmp_path, tiny_bytes):
    pulled = lamplight(["pull", f"{REPO}:Q8_0"], hub.url, tmp_path)
    assert pulled.returncode == 0, pulled.stderr
    path = pulled.stdout.strip()
    assert path.endswith("tiny-Q8_0.gguf") and open(path, "rb").read() == tiny_bytes
    assert "hub" in path  # huggingface_hub's cache, under HF_HOME
    default = lamplight(["pull", REPO], hub.url, tmp_path)
    assert default.returncode == 0 and default.stdout.strip().endswith("tiny-Q4_K_M.gguf")

    offline = lamplight(["pull", f"{REPO}:Q8_0"], "http://127.0.0.1:9", tmp_path, offline=True)
    assert offline.returncode == 0 and offline.stdout.strip() == path
    missing = lamplight(["pull", "tester/Split-GGUF"], hub.url, tmp_path, offline=True)
    assert missing.returncode == 1 and "not in the Hugging Face cache" in missing.stderr
    assert "Traceback" not in missing.stderr

    listed = lamplight(["models"], hub.url, tmp_path)
    assert listed.returncode == 0
    assert f"{REPO}" in listed.stdout and "tiny-Q8_0.gguf" in listed.stdout and "tiny-Q4_K_M.gguf" in listed.stdout


def test_split_gguf_is_downloaded_whole(hub, tmp_path, tiny_bytes):
    pulled = lamplight(["pull", "tester/Split-GGUF:Q8_0"], hub.url, tmp_path)
    assert pulled.returncode == 0, pulled.stderr
    first = pulled.stdout.strip()
    assert first.endswith("tiny-Q8_0-00001-of-00003.gguf")
    folder = os.path.dirname(first)
    joined = b"".join(open(os.path.join(folder, f"tiny-Q8_0-0000{i}-of-00003.gguf"), "rb").read() for i in (1, 2, 3))
    assert joined == tiny_bytes


def test_an_interrupted_download_resumes_where_it_stopped(tmp_path):
    # A dropped connection is resumed within the run, with a Range request for the rest: every byte
    # received before the drop is kept.
    big = os.urandom(3 * 2**20)
    cut = 2**20 + 12345
    with FakeHub({BIG: FakeRepo({BIG_FILE: big}, cut_after={BIG_FILE: [cut]})}) as hub:
        pulled = lamplight(["pull", BIG], hub.url, tmp_path)
    assert pulled.returncode == 0, pulled.stderr
    assert open(pulled.stdout.strip(), "rb").read() == big
    assert _gets(hub) == [None, f"bytes={cut}-"]  # the second request asked only for the rest


def test_a_download_cut_off_in_one_run_resumes_in_the_next(tmp_path):
    from huggingface_hub import hf_hub_download

    big = os.urandom(3 * 2**20)
    cut = 2**20 + 4321
    # The connection drops after `cut` bytes and this run's retries get nothing more: the run gives up.
    repo = FakeRepo({BIG_FILE: big}, cut_after={BIG_FILE: [cut] + [0] * RETRIES})
    with FakeHub({BIG: repo}) as hub:
        first = lamplight(["pull", BIG], hub.url, tmp_path)
        assert first.returncode == 1 and "Traceback" not in first.stderr, first.stderr
        assert f"cannot download {BIG}/{BIG_FILE}: network error" in first.stderr
        assert "1.0 MiB kept; run again to resume" in first.stderr
        partial = _partial(tmp_path, big)
        kept = partial.stat().st_size
        assert kept == cut and partial.read_bytes() == big[:kept]
        hub.requests.clear()
        second = lamplight(["pull", BIG], hub.url, tmp_path)
    assert second.returncode == 0, second.stderr
    assert f"resuming {BIG_FILE} at 1.0 of 3.0 MiB" in second.stderr
    assert _gets(hub) == [f"bytes={kept}-"]  # only the rest, in one request
    path = second.stdout.strip()
    assert hashlib.sha256(open(path, "rb").read()).hexdigest() == hashlib.sha256(big).hexdigest()
    assert not partial.exists()
    # laid out as huggingface_hub lays out its own downloads: it finds the file without the network
    assert hf_hub_download(BIG, BIG_FILE, cache_dir=tmp_path / "hub", local_files_only=True) == path
    assert os.path.islink(path) and os.path.realpath(path) == str(partial.with_suffix("").resolve())


# `lamplight ARGS...` with Python's KeyboardInterrupt handler on SIGINT, whatever the parent ignores.
_WITH_CTRL_C = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
                "from lamplight.cli import main; sys.exit(main(sys.argv[1:]))")


def test_ctrl_c_keeps_the_partial_download_for_the_next_run(tmp_path):
    big = os.urandom(3 * 2**20)
    # The transfer stalls at `hold` until the test releases it, after the Ctrl-C, however slow the
    # machine. The margin past 1 MiB is for the bytes the client's file buffer holds until it closes.
    hold = 2**20 + 2**18
    with FakeHub({BIG: FakeRepo({BIG_FILE: big}, hold_after={BIG_FILE: hold})}) as hub:
        # No read timeout during the stall either: a retry would not be the Ctrl-C this test is about.
        env = {**_env(hub.url, tmp_path), "HF_HUB_DOWNLOAD_TIMEOUT": "3600"}
        # Python keeps SIGINT ignored when it starts with it ignored (as a shell's background job
        # does), and then Ctrl-C would never reach the pull: the child takes the default handler.
        process = subprocess.Popen([sys.executable, "-c", _WITH_CTRL_C, "pull", BIG], env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        partial = _partial(tmp_path, big)
        deadline = time.monotonic() + 120
        while not (hub.holding.is_set() and partial.exists() and partial.stat().st_size >= 2**20):
            assert process.poll() is None and time.monotonic() < deadline, process.communicate()
            time.sleep(0.05)
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=120)
        hub.release.set()  # the next run gets the rest
        assert process.returncode == 1 and "Traceback" not in stderr, stderr
        assert f"download of {BIG}/{BIG_FILE} interrupted; run again to resume" in stderr
        kept = partial.stat().st_size
        assert 2**20 <= kept <= hold and partial.read_bytes() == big[:kept]
        assert _gets(hub) == [None]  # one GET, stalled until the Ctrl-C
        hub.requests.clear()
        second = lamplight(["pull", BIG], hub.url, tmp_path)
    assert second.returncode == 0, second.stderr
    assert _gets(hub) == [f"bytes={kept}-"]
    assert open(second.stdout.strip(), "rb").read() == big


def test_a_bad_partial_download_is_caught_by_the_hash_check_and_replaced(tmp_path):
    big = os.urandom(2 * 2**20)
    partial = _partial(tmp_path, big)
    partial.parent.mkdir(parents=True)
    partial.write_bytes(os.urandom(2**20))  # no prefix of the file: resuming from it gives a corrupt whole
    with FakeHub({BIG: FakeRepo({BIG_FILE: big})}) as hub:
        pulled = lamplight(["pull", BIG], hub.url, tmp_path)
    assert pulled.returncode == 0 and "Traceback" not in pulled.stderr, pulled.stderr
    assert f"{BIG_FILE} is corrupt: sha256" in pulled.stderr
    assert f"the partial download it resumed was bad, downloading {BIG_FILE} anew" in pulled.stderr
    assert _gets(hub) == [f"bytes={2**20}-", None]  # resumed, found bad, then once more from the start
    assert open(pulled.stdout.strip(), "rb").read() == big and not partial.exists()


def test_a_server_that_ignores_range_still_gives_the_right_file(tmp_path):
    big = os.urandom(2 * 2**20)
    partial = _partial(tmp_path, big)
    partial.parent.mkdir(parents=True)
    partial.write_bytes(big[:300_000])
    with FakeHub({BIG: FakeRepo({BIG_FILE: big}, ignore_range=True)}) as hub:
        pulled = lamplight(["pull", BIG], hub.url, tmp_path)
    assert pulled.returncode == 0, pulled.stderr
    assert _gets(hub) == ["bytes=300000-"]  # answered with 200 and the whole file, written from the start
    assert open(pulled.stdout.strip(), "rb").read() == big and not partial.exists()


def _partial(home, data: bytes):
    """Where a download of `data` in tester/Big-GGUF waits between runs: huggingface_hub's blob name."""
    return home / "hub" / "models--tester--Big-GGUF" / "blobs" / f"{hashlib.sha256(data).hexdigest()}.incomplete"


def _gets(hub: FakeHub) -> list[str | None]:
    """The Range header of each GET of a GGUF, in order."""
    return [r for method, path, r in hub.requests if method == "GET" and path.endswith(".gguf")]


@pytest.mark.parametrize("args, message", [
    (["pull", "tester/No-Such-GGUF"], "repository tester/No-Such-GGUF not found"),
    (["pull", f"{REPO}:Q2_K"], "has no Q2_K GGUF; available: Q4_K_M, Q8_0"),
    (["pull", "tester/Gated-GGUF"], "tester/Gated-GGUF is gated: pass --hf-token or set HF_TOKEN"),
    (["pull", "tester/Corrupt-GGUF"], "is corrupt: sha256"),
    (["pull", REPO, "--hf-file", "nope.gguf"], "nope.gguf is not in tester/Tiny-GGUF"),
])
def test_failures_are_plain_messages(hub, tmp_path, args, message):
    result = lamplight(args, hub.url, tmp_path)
    assert result.returncode == 1 and message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_network_failure_is_a_plain_message(tmp_path):
    result = lamplight(["pull", REPO], "http://127.0.0.1:9", tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "not in the Hugging Face cache and the Hub cannot be reached" in result.stderr


def test_gated_repo_with_a_token(hub, tmp_path):
    result = lamplight(["pull", "tester/Gated-GGUF", "--hf-token", "hf_secret"], hub.url, tmp_path)
    assert result.returncode == 0, result.stderr


def test_serve_a_model_by_name(hub, tmp_path):
    port = _free_port()
    env_args = ["serve", "-hf", f"{REPO}:Q8_0", "--port", str(port), "-np", "1", "--no-webui"]
    env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path), "HF_HUB_DISABLE_XET": "1"}
    process = subprocess.Popen([sys.executable, "-m", "lamplight.cli", *env_args], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert process.poll() is None, process.stderr.read()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models").json()
        assert models["data"][0]["id"].startswith("tiny-Q8_0")
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_serve_exits_with_a_message_for_a_missing_repo(hub, tmp_path):
    result = lamplight(["serve", "-hf", "tester/Nothing-GGUF"], hub.url, tmp_path)
    assert result.returncode == 1 and "not found" in result.stderr and "Traceback" not in result.stderr


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# -- --mmproj-auto: the repository's projector comes with the model ----------------------------------

def test_mmproj_choice_follows_the_models_quantization():
    from lamplight.server.media_hub import cached_repo_of, choose_mmproj

    names = ["a-Q4_K_M.gguf", "mmproj-a-F16.gguf", "mmproj-a-Q8_0.gguf", "mmproj-a-BF16.gguf"]
    assert choose_mmproj(names, "a-Q8_0.gguf") == "mmproj-a-Q8_0.gguf"  # the model's own quantization
    assert choose_mmproj(names, "a-Q4_K_M.gguf") == "mmproj-a-F16.gguf"  # else F16 first
    assert choose_mmproj(names[:1], "a-Q4_K_M.gguf") is None
    assert cached_repo_of("/h/hub/models--tester--Vision-GGUF/snapshots/0123/tiny-Q8_0.gguf") == VISION_REPO
    assert cached_repo_of("/models/tiny-Q8_0.gguf") is None


def test_serve_fetches_the_repositorys_projector(hub, tmp_path):
    """-hf with a repository that has mmproj files: the matching one is downloaded and loaded
    beside the model (here it is not a GGUF: a plain message naming it, exit status 1)."""
    result = lamplight(["serve", "-hf", f"{VISION_REPO}:Q8_0", "--port", str(_free_port()), "--no-webui"], hub.url,
                       tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert "mmproj-tiny-Q8_0.gguf" in result.stderr and "--mmproj" in result.stderr
    assert any(path.endswith("/mmproj-tiny-Q8_0.gguf") and method == "GET" for method, path, _ in hub.requests)
    assert not any(path.endswith("/mmproj-tiny-F16.gguf") for _, path, _ in hub.requests)


@pytest.mark.parametrize("flag", ["--no-mmproj-auto", "--no-mmproj"])
def test_serve_without_the_repositorys_projector(hub, tmp_path, flag):
    port = _free_port()
    process = subprocess.Popen([sys.executable, "-m", "lamplight.cli", "serve", "-hf", f"{VISION_REPO}:Q8_0", flag,
                                "--port", str(port), "-np", "1", "--no-webui"], env=_env(hub.url, tmp_path),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert process.poll() is None, process.stderr.read()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        assert httpx.get(f"http://127.0.0.1:{port}/props").json()["modalities"]["vision"] is False
        assert not any("mmproj" in path for _, path, _ in hub.requests)
    finally:
        process.terminate()
        process.wait(timeout=30)
