"""/api/pull: a Hugging Face GGUF (`user/repo[:QUANT]`, or Ollama's `hf.co/user/repo[:QUANT]`)
downloaded into huggingface_hub's cache by the code `lamplight pull` runs (lamplight.hf_hub:
quant choice, resume, size and sha256 checks). The model is not swapped in: this server keeps
serving its model, and the last status line before "success" says so and names the file (serve
it with `lamplight serve -hf ...`). Ollama's library names (`llama3.2`) are refused: lamplight
has no such registry.

Streamed (the default), the lines are `{"status": ...}`: "pulling manifest", hf_hub's progress
messages, the note, "success"; a failure is a final `{"error": ...}` line. Not streamed, a
failure is a 400 naming the cause. A download whose client hangs up goes on to the end in its
thread (the next pull finds it cached).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import AsyncIterator

from starlette.concurrency import run_in_threadpool

from .errors import field_error, invalid_request
from .api_ollama_reply import error_line

log = logging.getLogger("lamplight.server")

_HUB_PREFIXES = ("hf.co/", "huggingface.co/", "https://huggingface.co/")


def hub_spec(name: str) -> str:
    """An Ollama pull name -> `user/repo[:QUANT]`; a 400 for names that are not on the Hub."""
    from lamplight.hf_hub import parse_hf_spec
    from lamplight.sources import ModelSourceError

    if not name:
        raise field_error("model", "is required: the Hugging Face repository to pull (user/repo[:QUANT])")
    spec = next((name[len(p):] for p in _HUB_PREFIXES if name.startswith(p)), name)
    repo, quant = spec.partition(":")[0], spec.partition(":")[2]
    if quant == "latest":  # Ollama's default tag: the default quantization
        spec = repo
    try:
        parse_hf_spec(spec)
    except ModelSourceError:
        raise invalid_request(f"lamplight pulls GGUF models from the Hugging Face Hub: give user/repo[:QUANT] or "
                              f"hf.co/user/repo[:QUANT], not {name!r} (Ollama's library is not available)") from None
    return spec


def not_swapped_note(path: Path, spec: str, served: str) -> str:
    return (f"downloaded {path} into the Hugging Face cache; not loaded: this server keeps serving {served} "
            f"(serve it with `lamplight serve -hf {spec}`)")


async def pull_once(spec: str, served: str) -> dict:
    """The whole pull (stream: false); a failure is a 400 with its cause."""
    from lamplight.hf_hub import resolve_hf
    from lamplight.sources import ModelSourceError

    try:
        path = await run_in_threadpool(resolve_hf, spec)
    except ModelSourceError as exc:
        raise invalid_request(str(exc)) from None
    return {"status": "success", "note": not_swapped_note(path, spec, served)}


async def pull_lines(spec: str, served: str) -> AsyncIterator[dict]:
    """Ollama's progress lines while hf_hub downloads in a worker thread."""
    from lamplight.hf_hub import resolve_hf
    from lamplight.sources import ModelSourceError

    loop = asyncio.get_running_loop()
    messages: asyncio.Queue[str] = asyncio.Queue()

    def say(message: str) -> None:  # called in the worker thread
        loop.call_soon_threadsafe(messages.put_nowait, message)

    download = asyncio.ensure_future(run_in_threadpool(resolve_hf, spec, progress=say))
    download.add_done_callback(_retrieved)  # a client gone mid-download: its failure is not "never retrieved"
    yield {"status": "pulling manifest"}
    async for message in _until_done(download, messages):
        yield {"status": message}
    try:
        path = download.result()
    except Exception as exc:  # noqa: BLE001 - the stream has started: the failure is its last line
        if not isinstance(exc, ModelSourceError):
            log.exception("pull of %s failed", spec)
        yield error_line(str(exc) if isinstance(exc, ModelSourceError) else f"{type(exc).__name__}: {exc}")
        return
    yield {"status": not_swapped_note(path, spec, served)}
    yield {"status": "success"}


def _retrieved(task: asyncio.Future) -> None:
    if not task.cancelled():
        task.exception()


async def _until_done(task: asyncio.Future, messages: asyncio.Queue) -> AsyncIterator[str]:
    """The queued messages until `task` has finished and every message it said is out."""
    while True:
        getter = asyncio.ensure_future(messages.get())
        await asyncio.wait({task, getter}, return_when=asyncio.FIRST_COMPLETED)
        if getter.done():
            yield getter.result()
            continue
        getter.cancel()
        await asyncio.sleep(0)  # messages said just before the task ended are delivered by now
        while not messages.empty():
            yield messages.get_nowait()
        return
