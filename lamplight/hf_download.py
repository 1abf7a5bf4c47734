"""Hub downloads that outlive the process.

huggingface_hub 2.x writes each attempt to a fresh uuid-named `.incomplete` file, so a download cut
off by Ctrl-C, a dropped connection or a kill starts from zero in the next process. Here the file
comes down with httpx into a partial file with a stable name in huggingface_hub's cache,
`blobs/<etag>.incomplete` (the name huggingface_hub used before 1.0), and the next run goes on
from its end with `Range: bytes=N-`. The finished file is checked (the size and the sha256 the
Hub reports) before it becomes the blob; huggingface_hub itself then links the blob into the
snapshot and writes the ref, so `hf_hub_download(..., local_files_only=True)`, HF_HUB_OFFLINE=1
and other HF tools find it as they find their own downloads.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Callable

import httpx

from lamplight.sources import ModelSourceError

RETRIES = 3  # attempts in a row that bring no new bytes before a run gives up (the next run resumes)
RETRY_PAUSE_S = 1.0


def download(repo: str, filename: str, token: str | None, size: int | None, sha256: str | None,
             say: Callable[[str], None]) -> Path:
    """The snapshot path of `filename` in huggingface_hub's cache, downloading (or resuming) it first."""
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_download, hf_hub_url
    from huggingface_hub.file_download import repo_folder_name
    from huggingface_hub.utils import WeakFileLock, build_hf_headers

    meta = get_hf_file_metadata(hf_hub_url(repo, filename), token=token)
    if not meta.etag or not meta.commit_hash:
        raise ModelSourceError(f"{repo}/{filename}: the server sent no ETag or commit (is HF_ENDPOINT a Hub?)")
    folder = repo_folder_name(repo_id=repo, repo_type="model")
    blob = Path(constants.HF_HUB_CACHE, folder, "blobs", meta.etag)
    if not blob.exists():
        lock = Path(constants.HF_HUB_CACHE, ".locks", folder, f"{meta.etag}.lock")  # huggingface_hub's lock too
        for parent in (blob.parent, lock.parent):
            parent.mkdir(parents=True, exist_ok=True)
        with WeakFileLock(lock):
            if not blob.exists():
                url = hf_hub_url(repo, filename, revision=meta.commit_hash)
                _download_blob(url, blob, build_hf_headers(token=token), size or meta.size, sha256, filename, say)
    # The blob exists now: huggingface_hub links it into the snapshot and records the ref (one HEAD request).
    return Path(hf_hub_download(repo, filename, token=token))


def _download_blob(url: str, blob: Path, headers: dict, size: int | None, sha256: str | None, name: str,
                   say: Callable[[str], None]) -> None:
    partial = blob.with_name(blob.name + ".incomplete")
    while True:
        resumed_from = _fetch(url, partial, headers, size, name, say)
        problem = _check(partial, size, sha256, name)
        if problem is None:
            os.replace(partial, blob)
            return
        partial.unlink()
        if not resumed_from:
            raise ModelSourceError(f"{problem} (removed; run again to download it anew)")
        say(f"{problem}: the partial download it resumed was bad, downloading {name} anew")


def _fetch(url: str, partial: Path, headers: dict, size: int | None, name: str,
           say: Callable[[str], None]) -> int:
    """Bring `partial` to the end of the file, from where an earlier run left it; returns that offset.
    A dropped connection is resumed in this run too, until RETRIES attempts in a row bring nothing."""
    from huggingface_hub import constants
    from huggingface_hub.utils import tqdm

    start = _size(partial)
    if size is not None and start > size:  # not a prefix of this file
        partial.unlink()
        start = 0
    if start:
        total = f" of {size / 2**20:.1f}" if size else ""
        say(f"resuming {name} at {start / 2**20:.1f}{total} MiB")
    timeout = httpx.Timeout(constants.HF_HUB_DOWNLOAD_TIMEOUT)
    label = name if len(name) <= 40 else f"(…){name[-40:]}"
    # The bar huggingface_hub shows for its own downloads (on a terminal, unless HF_HUB_DISABLE_PROGRESS_BARS).
    with tqdm(total=size, initial=start, unit="B", unit_scale=True, desc=label, disable=None,
              name="huggingface_hub.http_get") as bar:
        misses = 0
        while True:
            before = _size(partial)
            try:
                _get(url, partial, headers, size, timeout, bar)
                return start
            except httpx.TransportError as exc:
                misses = 0 if _size(partial) > before else misses + 1
                if misses >= RETRIES:
                    exc.kept_bytes = _size(partial)  # for the message: what the next run resumes from
                    raise
                time.sleep(RETRY_PAUSE_S)


def _get(url: str, partial: Path, headers: dict, size: int | None, timeout: httpx.Timeout, bar) -> None:
    have = _size(partial)
    if size is not None and have == size:
        return  # all there: the checks decide
    request = {**headers, "Accept-Encoding": "identity"}
    if have:
        request["Range"] = f"bytes={have}-"
    with httpx.stream("GET", url, headers=request, timeout=timeout, follow_redirects=True) as response:
        if response.status_code == 416 and have:  # the partial is longer than the file: start over
            partial.unlink()
            bar.reset()
            return _get(url, partial, headers, size, timeout, bar)
        response.raise_for_status()
        if have and response.status_code != 206:  # the server ignored the Range: the whole file again
            have = 0
            bar.reset()
        with open(partial, "ab" if have else "wb") as f:
            for chunk in response.iter_bytes():  # as it arrives, so a cut keeps every byte received
                f.write(chunk)
                bar.update(len(chunk))


def _check(path: Path, size: int | None, sha256: str | None, name: str) -> str | None:
    """What is wrong with the downloaded file, or None."""
    if size is not None and path.stat().st_size != size:
        return f"{name}: size {path.stat().st_size} is not the {size} the Hub reports"
    if sha256:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        if digest.hexdigest() != sha256:
            return f"{name} is corrupt: sha256 {digest.hexdigest()} is not the {sha256} the Hub reports"
    return None


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0
