"""The served model as Ollama describes models: /api/tags, /api/show, /api/ps entries.

lamplight serves one GGUF; its Ollama name is the served model name (the alias, else the file
name). `digest` is the file's sha256 where the path says it (huggingface_hub's blobs are named by
it), else a digest of the file's path, size and time (hashing gigabytes per listing would stall
the server): it names the file, it does not check it.
"""

from __future__ import annotations

import hashlib
import os
import re
from datetime import datetime, timezone
from typing import Any

from gguf import LlamaFileType

from .model_info import n_params
from .state import ServerState

NEVER_EXPIRES = "9999-12-31T23:59:59Z"  # /api/ps: lamplight never unloads its model
_SHA256 = re.compile(r"[0-9a-f]{64}")


def _files(state: ServerState) -> list[str]:
    return [part.path for part in state.model.gguf.parts]


def model_size(state: ServerState) -> int:
    return sum(os.path.getsize(path) for path in _files(state))


def modified_at(state: ServerState) -> str:
    mtime = os.path.getmtime(state.model.path)
    return datetime.fromtimestamp(mtime, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def digest(state: ServerState) -> str:
    resolved = os.path.realpath(state.model.path)
    name = os.path.basename(resolved)
    if _SHA256.fullmatch(name):
        return name
    stat = os.stat(resolved)
    return hashlib.sha256(f"{resolved}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()


def human_number(n: int) -> str:
    """Ollama's parameter_size: "135M", "134.52M", "7.6B", "8B"."""
    for unit, scale, digits in (("B", 1e9, 1), ("M", 1e6, 2)):
        if n >= scale:
            value = n / scale
            return f"{value:.0f}{unit}" if value.is_integer() else f"{value:.{digits}f}{unit}"
    return f"{n / 1e3:.0f}K" if n >= 1e3 else str(n)


def quantization_level(metadata: dict) -> str:
    """The file type as Ollama names it ("Q4_K_M", "Q8_0", "F16"), from general.file_type."""
    try:
        name = LlamaFileType(int(metadata["general.file_type"])).name
    except (KeyError, TypeError, ValueError):
        return "unknown"
    return "F32" if name == "ALL_F32" else name.removeprefix("MOSTLY_")


def details(state: ServerState) -> dict:
    gguf = state.model.gguf
    return {"parent_model": "", "format": "gguf", "family": gguf.architecture, "families": [gguf.architecture],
            "parameter_size": human_number(n_params(gguf)), "quantization_level": quantization_level(gguf.metadata)}


def tags_entry(state: ServerState) -> dict:
    name = state.model_name
    return {"name": name, "model": name, "modified_at": modified_at(state), "size": model_size(state),
            "digest": digest(state), "details": details(state)}


def ps_entry(state: ServerState) -> dict:
    return {**tags_entry(state), "expires_at": NEVER_EXPIRES, "size_vram": 0,
            "context_length": state.engine.n_ctx_slot}


def capabilities(state: ServerState) -> list[str]:
    template, tokenizer = state.model.chat_template, state.model.tokenizer
    found = ["completion"]
    if getattr(template, "supports_tools", False):
        found.append("tools")
    if getattr(template, "supports_thinking", False):
        found.append("thinking")
    if None not in (tokenizer.fim_prefix_id, tokenizer.fim_suffix_id, tokenizer.fim_middle_id):
        found.append("insert")
    return found


def model_info(state: ServerState) -> dict:
    """The GGUF's metadata (architecture keys and all), as Ollama's show lists it: without the
    tokenizer's vocabulary arrays and the chat template (that is `template`)."""
    gguf = state.model.gguf
    info = {key: _plain(value) for key, value in gguf.metadata.items() if not _left_out(key, value)}
    info.setdefault("general.parameter_count", n_params(gguf))
    return info


def _left_out(key: str, value: Any) -> bool:
    return key == "tokenizer.chat_template" or (key.startswith("tokenizer.") and hasattr(value, "__len__")
                                                 and not isinstance(value, str))


def _plain(value: Any) -> Any:
    return value.tolist() if hasattr(value, "tolist") else value


def parameters(state: ServerState) -> str:
    """The defaults a request starts from that the serve flags set, as Modelfile PARAMETER lines."""
    values = {"num_ctx": state.engine.n_ctx_slot, **state.settings.sampling_defaults}
    if state.settings.n_predict != -1:
        values["num_predict"] = state.settings.n_predict
    return "\n".join(f"{name:<20} {value}" for name, value in values.items())


def show(state: ServerState) -> dict:
    modelfile = (f"# lamplight serves this GGUF with the Jinja chat template it carries (see `template`)\n"
                 f"FROM {state.model.path}\n"
                 + "".join(f"PARAMETER {line}\n" for line in parameters(state).splitlines()))
    return {"modelfile": modelfile, "parameters": parameters(state), "template": state.model.chat_template.source,
            "details": details(state), "model_info": model_info(state), "capabilities": capabilities(state),
            "modified_at": modified_at(state)}
