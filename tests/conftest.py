"""Shared test fixtures: where the reference data and the real models are."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


def reference_dir() -> Path:
    env = os.environ.get("LAMPLIGHT_REFERENCE")
    return Path(env) if env else REPO_ROOT.parent / "shared" / "reference"


def load_jsonl(name: str) -> list[dict]:
    path = reference_dir() / name
    if not path.is_file():
        pytest.skip(f"reference data {path} is not present")
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    from lamplight.sources import resolve_model

    return resolve_model("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    from lamplight.sources import resolve_model

    return resolve_model("gemma-3-270m")
