"""--mmproj-auto: a model from the Hugging Face Hub (-hf) brings its repository's projector
(`mmproj-*.gguf`), downloaded beside the model as llama-server does. Files and downloads go
through lamplight.hf_hub (cache, resume, hash check, offline use)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

# The projector's precision preferred when none matches the model's quantization (llama.cpp's
# repositories ship F16 first; Q8_0 projectors are the smaller alternative).
PREFERRED_PRECISIONS = ("F16", "BF16", "F32", "Q8_0")


def cached_repo_of(model_path: str | os.PathLike) -> str | None:
    """`owner/name` of a file in huggingface_hub's cache (`.../models--owner--name/snapshots/...`),
    else None (a local file: no repository to ask)."""
    parts = Path(model_path).parts
    for i, part in enumerate(parts[:-2]):
        if part.startswith("models--") and parts[i + 1] == "snapshots":
            owner, sep, name = part[len("models--"):].partition("--")
            return f"{owner}/{name}" if sep and owner and name else None
    return None


def choose_mmproj(names: list[str], model_name: str) -> str | None:
    """The repository's projector for `model_name`: one with the model's quantization in its name,
    else by PREFERRED_PRECISIONS, else the first; None if it has none."""
    from lamplight.hf_hub import QUANT_RE, _name_tokens

    candidates = sorted(n for n in names if n.lower().endswith(".gguf") and "mmproj" in Path(n).name.lower())
    if not candidates:
        return None
    quants = {t for t in _name_tokens(Path(model_name).name) if QUANT_RE.match(t)}
    for wanted in (*sorted(quants), *PREFERRED_PRECISIONS):
        matching = [n for n in candidates if wanted in _name_tokens(Path(n).name)]
        if matching:
            return matching[0]
    return candidates[0]


def resolve_hf_mmproj(repo: str, model_name: str, token: str | None = None,
                      progress: Callable[[str], None] | None = None) -> Path | None:
    """The local path of `repo`'s projector (downloaded if needed), or None if it has none."""
    from lamplight.hf_hub import _download, _repo_gguf_files

    say = progress or (lambda _msg: None)
    token = token or os.environ.get("HF_TOKEN") or None
    files = _repo_gguf_files(repo, token)
    chosen = choose_mmproj([f.name for f in files], model_name)
    if chosen is None:
        return None
    path = _download(repo, next(f for f in files if f.name == chosen), token, say)
    say(f"projector file (--mmproj-auto): {path}")
    return path
