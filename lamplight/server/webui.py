"""The browser chat page at `/` (lamplight/webui/static), or a user's own folder (`--path DIR`),
as llama-server serves its web UI. Off with `--no-webui`: then `/` is a 404 as for any unknown path.

Static files are public (the API key protects the API, not the page that asks for it), are
served while the model loads (the page shows the loading state), carry an ETag (a 304 when the
browser's copy is current) and are gzipped when the browser accepts it. The route is registered
after every API route, so it only sees GET paths no API route took.
"""

from __future__ import annotations

import gzip
import hashlib
import mimetypes
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response

from .errors import not_found
from .settings import ServerSettings

BUILT_IN_ROOT = Path(__file__).resolve().parent.parent / "webui" / "static"
# Pinned, versioned files (see vendor/VERSIONS.md) may be kept a day without asking; everything
# else is revalidated on each load so a new lamplight's page is seen at once.
LONG_CACHE_PREFIX = "vendor/"
COMPRESSIBLE = ("text/", "application/javascript", "application/json", "image/svg+xml")
MIN_GZIP_BYTES = 512

router = APIRouter()


@dataclass(frozen=True)
class StaticFile:
    body: bytes
    gzipped: bytes | None
    etag: str
    media_type: str


def static_root(settings: ServerSettings) -> Path | None:
    """The folder served at `/`, or None when the web UI is off."""
    if not settings.webui:
        return None
    return Path(settings.static_path).resolve() if settings.static_path else BUILT_IN_ROOT


def static_file_path(settings: ServerSettings, url_path: str) -> Path | None:
    """The file a GET of `url_path` serves, or None. Never a file outside the root."""
    root = static_root(settings)
    if root is None:
        return None
    relative = url_path.lstrip("/") or "index.html"
    try:
        candidate = (root / relative).resolve()
        if candidate != root and root not in candidate.parents:
            return None  # `..` or a symlink out of the folder
        if candidate.is_dir():
            candidate = candidate / "index.html"
        return candidate if candidate.is_file() else None
    except (ValueError, OSError):  # a name the OS cannot look up (a NUL byte, too long, a symlink loop) names no file
        return None


def is_static_request(settings: ServerSettings, method: str, url_path: str) -> bool:
    """For the HTTP policy: a GET of a static file needs no API key and no loaded model."""
    return method in ("GET", "HEAD") and static_file_path(settings, url_path) is not None


@lru_cache(maxsize=256)
def _load(path: Path, mtime_ns: int, size: int) -> StaticFile:
    # Keyed by mtime and size, so an edited file under --path is read again.
    body = path.read_bytes()
    media_type = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    if path.suffix in (".js", ".mjs"):
        media_type = "text/javascript"  # ES modules need a JavaScript type, whatever the OS's table says
    if media_type.startswith("text/"):
        media_type += "; charset=utf-8"
    compress = media_type.startswith(COMPRESSIBLE) and len(body) >= MIN_GZIP_BYTES
    gzipped = gzip.compress(body, compresslevel=6, mtime=0) if compress else None
    etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
    return StaticFile(body, gzipped, etag, media_type)


def _cache_control(url_path: str) -> str:
    if url_path.lstrip("/").startswith(LONG_CACHE_PREFIX):
        return "public, max-age=86400"
    return "no-cache"


def _accepts_gzip(request: Request) -> bool:
    return any(part.split(";")[0].strip() == "gzip"
               for part in request.headers.get("accept-encoding", "").split(","))


def static_response(request: Request, url_path: str) -> Response:
    settings = request.app.state.lamplight.settings
    path = static_file_path(settings, url_path)
    if path is None:
        raise not_found()
    stat = path.stat()
    item = _load(path, stat.st_mtime_ns, stat.st_size)
    headers = {"ETag": item.etag, "Cache-Control": _cache_control(url_path), "Vary": "Accept-Encoding",
               "X-Content-Type-Options": "nosniff"}
    if item.etag in request.headers.get("if-none-match", ""):
        return Response(status_code=304, headers=headers)
    body = item.body
    if item.gzipped is not None and _accepts_gzip(request):
        body = item.gzipped
        headers["Content-Encoding"] = "gzip"
    return Response(body, media_type=item.media_type, headers=headers)


@router.get("/{url_path:path}", include_in_schema=False)
async def static(request: Request, url_path: str) -> Response:
    return static_response(request, url_path)
