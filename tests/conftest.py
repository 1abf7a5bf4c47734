"""Shared test fixtures: where the reference data and the real models are."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


def reference_dir() -> Path:
    env = os.environ.get("LAMPLIGHT_REFERENCE")
    return Path(env) if env else REPO_ROOT.parent / "shared" / "reference"


def missing_reference(path: Path) -> str:
    """The skip reason for absent reference data: the whole folder when that is what is missing
    (one reason for every test that needs it), else the one file."""
    base = reference_dir()
    if not base.is_dir():
        return f"no reference data at {base} (set LAMPLIGHT_REFERENCE to the shared/reference folder)"
    return f"reference data {path} is not present"


def reference_path(name: str) -> Path:
    """A file or folder under the reference data. Where it is absent this skips: the test when
    called from one, the whole module when called at import (collection never fails)."""
    __tracebackhide__ = True  # the skip is reported at the line of the test file that needed the data
    path = reference_dir() / name
    if not path.exists():
        pytest.skip(missing_reference(path), allow_module_level=True)
    return path


def reference_text(name: str) -> str:
    __tracebackhide__ = True
    return reference_path(name).read_text(encoding="utf-8")


def load_jsonl(name: str) -> list[dict]:
    __tracebackhide__ = True
    with open(reference_path(name), encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def reference_params(name: str, values=lambda rows: rows) -> list:
    """Parametrize values read from the reference file `name` (`values` picks them from its rows).
    Where it is absent: one skipped parameter naming it, so that only the tests parametrized by it
    skip and the rest of the module still runs."""
    path = reference_dir() / name
    if not path.is_file():
        return [pytest.param(None, id="no-reference-data", marks=pytest.mark.skip(reason=missing_reference(path)))]
    return values(load_jsonl(name))


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    from lamplight.sources import resolve_model

    return resolve_model("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    from lamplight.sources import resolve_model

    return resolve_model("gemma-3-270m")


@pytest.fixture(scope="session")
def smolvlm_text_model(smollm2_path, tmp_path_factory) -> Path:
    """SmolLM2 with SmolVLM's image tokens, the text model of the idefics3 goldens, made once per
    session by the reference folder's script (vision/README.md 1.1)."""
    script = reference_path("vision/make_smolvlm_text_model.py")
    path = tmp_path_factory.mktemp("smolvlm") / "SmolLM2-135M-Instruct-smolvlm-tokens.Q4_1.gguf"
    subprocess.run([sys.executable, str(script), str(smollm2_path), str(path)], check=True, capture_output=True)
    return path


@pytest.fixture(autouse=True)
def _process_thread_counts():
    """`-t` is process-wide (lamplight.threads): a test that runs the CLI in-process with -t must
    not size the native pool, or PyTorch's, of the tests after it."""
    import lamplight.threads as threads

    requested, torch_threads = threads._requested, threads._torch_threads
    torch = sys.modules.get("torch")
    torch_count = torch.get_num_threads() if torch is not None else None
    yield
    threads._requested, threads._torch_threads = requested, torch_threads
    torch = sys.modules.get("torch")
    if torch is not None and torch_count is not None and torch.get_num_threads() != torch_count:
        torch.set_num_threads(torch_count)
