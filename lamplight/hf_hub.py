"""Models by name from the Hugging Face Hub: `-hf user/repo[:QUANT]`, as llama-server takes them.

The GGUF for the quantization is chosen as llama.cpp chooses it (default Q4_K_M, else the first
GGUF of the repository), downloaded into huggingface_hub's cache (by lamplight.hf_download, which
resumes a download cut off in an earlier run), and its size and sha256 checked against the ones the
Hub reports for LFS files. A split GGUF (`-00001-of-00003.gguf`) is downloaded whole (GGUFFile loads
its parts). With `HF_HUB_OFFLINE=1` (or when the Hub cannot be reached) the files come from the
cache. Every failure is a ModelSourceError with a message for people, never a traceback.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from lamplight.sources import ModelSourceError

DEFAULT_QUANT = "Q4_K_M"  # llama.cpp's default tag
SPLIT_RE = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
QUANT_RE = re.compile(r"^(I?Q\d\w*|F16|F32|BF16|MXFP4\w*|TQ\d\w*)$", re.IGNORECASE)


@dataclass(frozen=True)
class HubFile:
    name: str
    size: int | None = None
    sha256: str | None = None  # for LFS files: what the Hub reports, checked after download


def parse_hf_spec(spec: str) -> tuple[str, str | None]:
    """`user/repo[:QUANT]` -> (repo, quant or None)."""
    repo, _, quant = spec.partition(":")
    if repo.count("/") != 1 or not all(repo.split("/")):
        raise ModelSourceError(f"-hf expects user/repo[:QUANT], got {spec!r}")
    return repo, quant or None


def resolve_hf(spec: str, filename: str | None = None, token: str | None = None,
               progress: Callable[[str], None] | None = None) -> Path:
    """The local path of the GGUF (its first part, if split) for `spec`, downloading what is missing."""
    say = progress or (lambda _msg: None)
    repo, quant = parse_hf_spec(spec)
    token = token or os.environ.get("HF_TOKEN") or None
    files = _repo_gguf_files(repo, token)
    chosen = [_by_name(files, filename, repo)] if filename else choose_gguf(files, quant, repo)
    parts = _with_split_parts(chosen[0], files)
    paths = [_download(repo, part, token, say) for part in parts]
    say(f"model file: {paths[0]}")
    return paths[0]


def choose_gguf(files: list[HubFile], quant: str | None, repo: str) -> list[HubFile]:
    """The file for `quant` (or the default), as llama.cpp picks it; mmproj files never count."""
    models = [f for f in files if f.name.lower().endswith(".gguf") and "mmproj" not in f.name.lower()]
    if not models:
        raise ModelSourceError(f"{repo} has no GGUF files")
    wanted = (quant or DEFAULT_QUANT).upper()
    matching = [f for f in models if wanted in _name_tokens(f.name)]
    if matching:
        return [_first_part(matching)]
    if quant is None:
        return [_first_part(models)]  # no Q4_K_M: the first GGUF, as llama.cpp does
    available = ", ".join(available_quants(models)) or "none recognised"
    raise ModelSourceError(f"{repo} has no {quant} GGUF; available: {available}")


def available_quants(files: list[HubFile]) -> list[str]:
    found = {token for f in files for token in _name_tokens(f.name) if QUANT_RE.match(token)}
    return sorted(found)


def _name_tokens(name: str) -> set[str]:
    # "Q4_K_M/Qwen2.5-0.5B-Instruct-Q4_K_M-00001-of-00002.gguf" -> {"Q4_K_M", "QWEN2", "5", ...}:
    # whole tokens only, so Q4_K never matches Q4_K_M.
    return {token.upper() for token in re.split(r"[-./]", name) if token}


def _first_part(files: list[HubFile]) -> HubFile:
    ordered = sorted(files, key=lambda f: f.name)
    unsplit = [f for f in ordered if not SPLIT_RE.search(f.name)]
    firsts = [f for f in ordered if (m := SPLIT_RE.search(f.name)) and int(m.group(1)) == 1]
    return (unsplit or firsts or ordered)[0]


def _with_split_parts(first: HubFile, files: list[HubFile]) -> list[HubFile]:
    match = SPLIT_RE.search(first.name)
    if not match:
        return [first]
    stem, count = first.name[:match.start()], int(match.group(2))
    names = [f"{stem}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]
    return [_by_name(files, name, "the split set") for name in names]


def _by_name(files: list[HubFile], name: str, where: str) -> HubFile:
    for f in files:
        if f.name == name:
            return f
    raise ModelSourceError(f"{name} is not in {where}")


def _repo_gguf_files(repo: str, token: str | None) -> list[HubFile]:
    """The repository's files from the Hub, or from the cache when offline."""
    from huggingface_hub import HfApi, constants

    if constants.is_offline_mode():
        return _cached_files(repo, "HF_HUB_OFFLINE is set")
    try:
        info = HfApi().model_info(repo, files_metadata=True, token=token)
    except Exception as exc:  # noqa: BLE001 - turned into a message below
        if _is_network_error(exc):
            return _cached_files(repo, f"the Hub cannot be reached ({_short(exc)})")
        raise ModelSourceError(_hub_error_message(exc, repo, token)) from None
    return [HubFile(s.rfilename, s.size, s.lfs.sha256 if s.lfs else None) for s in info.siblings or []]


def _cached_files(repo: str, why: str) -> list[HubFile]:
    from huggingface_hub import snapshot_download

    try:
        folder = Path(snapshot_download(repo, local_files_only=True))
    except Exception:  # noqa: BLE001 - nothing cached for this repo
        raise ModelSourceError(f"{repo} is not in the Hugging Face cache and {why}") from None
    return [HubFile(p.relative_to(folder).as_posix()) for p in sorted(folder.rglob("*.gguf"))]


def _download(repo: str, file: HubFile, token: str | None, say: Callable[[str], None]) -> Path:
    from huggingface_hub import try_to_load_from_cache

    from lamplight.hf_download import download

    cached = try_to_load_from_cache(repo, file.name)
    if isinstance(cached, str) and (file.size is None or os.path.getsize(cached) == file.size):
        return Path(cached)
    size = f" ({file.size / 2**20:.1f} MiB)" if file.size else ""
    say(f"downloading {repo}/{file.name}{size}")
    try:
        return download(repo, file.name, token, file.size, file.sha256, say)
    except ModelSourceError:
        raise
    except KeyboardInterrupt:
        raise ModelSourceError(f"download of {repo}/{file.name} interrupted; run again to resume") from None
    except Exception as exc:  # noqa: BLE001 - turned into a message below
        if _is_network_error(exc):
            kept = getattr(exc, "kept_bytes", 0)
            kept = f"{kept / 2**20:.1f} MiB kept; " if kept else ""
            raise ModelSourceError(f"cannot download {repo}/{file.name}: network error ({_short(exc)}); "
                                   f"{kept}run again to resume") from None
        raise ModelSourceError(_hub_error_message(exc, repo, token)) from None


def _is_network_error(exc: BaseException) -> bool:
    import httpx

    from huggingface_hub.errors import HfHubHTTPError

    if isinstance(exc, (HfHubHTTPError, httpx.HTTPStatusError)):
        status = exc.response.status_code if exc.response is not None else None
        return status is None or status >= 500
    network_types: tuple[type, ...] = (httpx.TransportError, ConnectionError, TimeoutError)
    try:
        import httpx2

        network_types += (httpx2.TransportError,)
    except ImportError:
        pass
    return isinstance(exc, network_types)


def _hub_error_message(exc: BaseException, repo: str, token: str | None) -> str:
    from huggingface_hub.errors import (EntryNotFoundError, GatedRepoError, RepositoryNotFoundError,
                                        RevisionNotFoundError)

    if isinstance(exc, GatedRepoError):
        hint = "your token has no access: accept the terms on the repo's page" if token else \
            "pass --hf-token or set HF_TOKEN, after accepting the terms on the repo's page"
        return f"{repo} is gated: {hint}"
    if isinstance(exc, RepositoryNotFoundError):
        return f"repository {repo} not found on the Hub (or private: pass --hf-token / set HF_TOKEN)"
    if isinstance(exc, (EntryNotFoundError, RevisionNotFoundError)):
        return f"not found in {repo}: {_short(exc)}"
    return f"Hugging Face Hub error for {repo}: {_short(exc)}"


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:300] or type(exc).__name__


def cached_hub_models() -> list[tuple[str, str, int]]:
    """(repo, file, bytes) for every GGUF in huggingface_hub's cache."""
    from huggingface_hub import scan_cache_dir

    try:
        info = scan_cache_dir()
    except Exception:  # noqa: BLE001 - no cache folder yet
        return []
    found = {}
    for repo in info.repos:
        for revision in repo.revisions:
            for f in revision.files:
                if f.file_name.lower().endswith(".gguf"):
                    name = f.file_path.relative_to(revision.snapshot_path).as_posix()
                    found[(repo.repo_id, name)] = f.size_on_disk
    return [(repo, name, size) for (repo, name), size in sorted(found.items())]
