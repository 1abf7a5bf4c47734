"""An on-disk cache for arrays derived from a vocabulary (Gemma's merge table takes ~0.7 s to
derive and ~10 ms to load). Any failure to read or write just means computing again."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np

_FORMAT_VERSION = b"lamplight-spm-merges-1"


def cache_dir() -> Path:
    from lamplight.sources import cache_dir as models_dir

    return models_dir().parent / "tokenizers"


def vocab_key(tokens: list[str], scores: np.ndarray | None) -> str:
    digest = hashlib.blake2b(_FORMAT_VERSION, digest_size=20)
    digest.update("\0".join(tokens).encode("utf-8", "surrogateescape"))
    if scores is not None:
        digest.update(np.ascontiguousarray(scores, dtype=np.float32).tobytes())
    return digest.hexdigest()


def cached_array(key: str, compute: Callable[[], np.ndarray]) -> np.ndarray:
    path = cache_dir() / f"{key}.npy"
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError):
        pass
    array = compute()
    _store(path, array)
    return array


def _store(path: Path, array: np.ndarray) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            np.save(f, array, allow_pickle=False)
        os.replace(tmp, path)  # atomic: concurrent readers never see a partial file
    except OSError:
        pass
