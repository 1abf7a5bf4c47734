"""Saving a slot's KV cache to a file and restoring it (POST /slots/{id}?action=save|restore).

Our own format: a `torch.save` dictionary with the token ids, the adapter scales they were
computed with, the model's fingerprint, the K/V of every layer for those positions (as float
values: the pool's float dtype, a quantized type's values dequantized) and, for a model with
recurrent layers, the state they leave (one flat tensor: ModelState.snapshot). Reading and
writing the format needs torch, so these functions import it when called: a native engine that
never saves or restores a slot never loads it. A numpy pool is read and written through tensors
sharing its memory (lamplight.state.torch_pools.torch_view).
"""

from __future__ import annotations

import os
import re
from typing import Any

from .kv_cache import BlockTable, KVCache
from .types import InvalidRequestError

FORMAT = "lamplight-slot"
VERSION = 1
_SAFE_NAME = re.compile(r"^[A-Za-z0-9._-]{1,200}$")


def slot_file_path(directory: str, filename: str) -> str:
    """The file inside the --slot-save-path folder; names with separators or '..' are refused."""
    if not isinstance(filename, str) or not _SAFE_NAME.match(filename) or filename in (".", ".."):
        raise InvalidRequestError(f"invalid slot filename {filename!r}: use letters, digits, '.', '_' and '-'")
    return os.path.join(directory, filename)


def save_slot(path: str, cache: KVCache, table: BlockTable, tokens: list[int], lora: tuple[float, ...], fingerprint: str,
              recurrent: Any | None = None) -> int:
    """`recurrent`: the slot's state snapshot (a numpy array or a tensor), where the model has one."""
    import torch

    from ..state.torch_pools import torch_view

    pool = torch_view(cache.pool)
    slots = torch.tensor(table.slots(0, len(tokens)), dtype=torch.long, device=pool.device)
    layers = [pool.read(layer, slots) for layer in range(len(pool.k))]
    data = {
        "format": FORMAT,
        "version": VERSION,
        "model": fingerprint,
        "tokens": list(tokens),
        "lora": list(lora),
        "k": [k.cpu() for k, _ in layers],
        "v": [v.cpu() for _, v in layers],
    }
    if recurrent is not None:
        data["recurrent"] = torch.as_tensor(recurrent).cpu()
    torch.save(data, path)
    return os.path.getsize(path)


def load_slot(path: str, fingerprint: str, n_ctx_slot: int) -> dict:
    import torch

    if not os.path.isfile(path):
        raise InvalidRequestError(f"slot file {os.path.basename(path)!r} does not exist")
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise InvalidRequestError(f"slot file {os.path.basename(path)!r} cannot be read: {exc}") from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("version") != VERSION:
        raise InvalidRequestError(f"{os.path.basename(path)!r} is not a lamplight slot file")
    if data.get("model") != fingerprint:
        raise InvalidRequestError("the slot file was saved with another model")
    if len(data["tokens"]) > n_ctx_slot:
        raise InvalidRequestError(f"the slot file holds {len(data['tokens'])} tokens, more than a slot's {n_ctx_slot}")
    return data


def write_slot(cache: KVCache, table: BlockTable, data: dict) -> None:
    import torch

    from ..state.torch_pools import torch_view

    n = len(data["tokens"])
    table.release()
    table.fill_to(n)
    pool = torch_view(cache.pool)
    slots = torch.tensor(table.slots(), dtype=torch.long, device=pool.device)
    for layer in range(len(pool.k)):
        pool.write(layer, slots, data["k"][layer].to(pool.device), data["v"][layer].to(pool.device))
