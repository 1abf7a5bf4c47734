"""Forwarding one request to a model's child and its answer back, unchanged: the method, path,
query, headers and body as the client sent them; the status, headers and body as the child sent
them, passed on chunk by chunk as they arrive (an SSE stream is never buffered). A client that
goes away closes the child's connection too, so the child stops generating.

Headers that belong to one connection (Connection, Transfer-Encoding ...) are not passed on; nor
are the child's CORS and Server headers (the router writes its own), nor its
X-Lamplight-Unload-After: a child answering a request that asks for a keep-alive (Ollama's
`keep_alive`) says so in it, and the router sets the model's idle timer from it.
"""

from __future__ import annotations

from typing import AsyncIterator, Callable

import httpx
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from .errors import RouterError
from .instance import ModelInstance

UNLOAD_AFTER_HEADER = "x-lamplight-unload-after"
_HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                         "transfer-encoding", "upgrade", "host", "content-length"})
_CHILD_ONLY = frozenset({"server", "vary", UNLOAD_AFTER_HEADER})


async def forward(request: Request, body: bytes, instance: ModelInstance, client: httpx.AsyncClient,
                  counts_as_use: bool, on_unload_after: Callable[[float], None]) -> Response:
    url = httpx.URL(instance.base_url + request.url.path, query=request.url.query.encode("latin-1"))
    headers = [(key, value) for key, value in request.headers.raw if key.decode("latin-1").lower() not in _HOP_BY_HOP]
    upstream_request = client.build_request(request.method, url, headers=headers, content=body)
    instance.begin_request(counts_as_use)
    try:
        upstream = await client.send(upstream_request, stream=True)
    except httpx.HTTPError as exc:
        instance.end_request()
        raise RouterError(502, f"model '{instance.name}' did not answer ({type(exc).__name__}: {exc}); "
                               f"GET /models shows its status") from None
    _apply_unload_after(upstream, on_unload_after)
    return StreamingResponse(_relay(upstream, instance), status_code=upstream.status_code,
                             headers=_answer_headers(upstream))


async def _relay(upstream: httpx.Response, instance: ModelInstance) -> AsyncIterator[bytes]:
    try:
        async for chunk in upstream.aiter_raw():
            yield chunk
    except httpx.HTTPError:
        pass  # the child went away mid-answer: the answer ends here (its status shows why)
    finally:
        await upstream.aclose()
        instance.end_request()


def _answer_headers(upstream: httpx.Response) -> dict[str, str]:
    skipped = _HOP_BY_HOP - {"content-length"} | _CHILD_ONLY
    return {key: value for key, value in upstream.headers.items()
            if key.lower() not in skipped and not key.lower().startswith("access-control-")}


def _apply_unload_after(upstream: httpx.Response, on_unload_after: Callable[[float], None]) -> None:
    value = upstream.headers.get(UNLOAD_AFTER_HEADER)
    if value is not None:
        try:
            on_unload_after(float(value))
        except ValueError:
            pass  # not a number: the child's bug, not the client's; the timer stays as it was
