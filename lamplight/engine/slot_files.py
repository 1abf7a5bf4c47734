"""Saving a slot's KV cache to a file and restoring it (POST /slots/{id}?action=save|restore).

Our own format, version 2: a numpy `.npz` archive (read with allow_pickle=False, so a file
cannot run code) holding
- `header`: UTF-8 JSON: format, version, the model's fingerprint, the token ids, the adapter
  scales they were computed with, the K and V types (`-ctk`/`-ctv` names) and the layer count;
- `k{i}`, `v{i}`: layer i's K and V rows as the pool stores them, head-major
  ([n_kv_heads, tokens, row] of the type's storage: float32, float16, bf16's bits as uint16, or a
  quantized type's bytes), so a restore into a pool of the same types puts back the same bits;
- `recurrent`: for a model with recurrent layers, the state those tokens leave (one flat
  float32 array: ModelState.snapshot).
Saving and restoring between pools of the same types is numpy alone: a native engine never
imports torch for it. A file restored into a pool of other types (saved under another `-ctk`)
is converted through the PyTorch codecs (the quantized types' only implementation outside the
native forward), and so are version 1 files, the `torch.save` dictionaries of float values
earlier lamplight wrote, which are still read.
"""

from __future__ import annotations

import json
import os
import re
import zipfile
from typing import Any

import numpy as np

from ..state.kv import KVPool
from ..state.kv_types import KV_TYPES, KVType
from .kv_cache import BlockTable, KVCache
from .types import InvalidRequestError

FORMAT = "lamplight-slot"
VERSION = 2
_SAFE_NAME = re.compile(r"^[A-Za-z0-9._-]{1,200}$")


def slot_file_path(directory: str, filename: str) -> str:
    """The file inside the --slot-save-path folder; names with separators or '..' are refused."""
    if not isinstance(filename, str) or not _SAFE_NAME.match(filename) or filename in (".", ".."):
        raise InvalidRequestError(f"invalid slot filename {filename!r}: use letters, digits, '.', '_' and '-'")
    return os.path.join(directory, filename)


def save_slot(path: str, cache: KVCache, table: BlockTable, tokens: list[int], lora: tuple[float, ...], fingerprint: str,
              recurrent: Any | None = None) -> int:
    """`recurrent`: the slot's state snapshot (a numpy array or a tensor), where the model has one.
    Returns the file's size in bytes."""
    pool = cache.pool
    slots = table.slots(0, len(tokens))
    header = {"format": FORMAT, "version": VERSION, "model": fingerprint, "tokens": [int(t) for t in tokens],
              "lora": [float(s) for s in lora], "k_type": pool.k_type.name, "v_type": pool.v_type.name,
              "layers": len(pool.k)}
    arrays = {"header": np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)}
    for layer in range(len(pool.k)):
        k, v = pool.read_stored(layer, slots)
        arrays[f"k{layer}"], arrays[f"v{layer}"] = _as_numpy(k), _as_numpy(v)
    if recurrent is not None:
        arrays["recurrent"] = _as_numpy(recurrent).astype(np.float32, copy=False).reshape(-1)
    with open(path, "wb") as f:  # a file object: np.savez would add ".npz" to a name
        np.savez(f, **arrays)
    return os.path.getsize(path)


def load_slot(path: str, fingerprint: str, n_ctx_slot: int) -> dict:
    """The file's contents, checked against the model and a slot's size: `tokens`, `lora`,
    `recurrent` (if saved), and the K/V in the form its version keeps them (write_slot reads both)."""
    name = os.path.basename(path)
    if not os.path.isfile(path):
        raise InvalidRequestError(f"slot file {name!r} does not exist")
    if not zipfile.is_zipfile(path):  # both versions are zip archives (torch.save's is too)
        raise InvalidRequestError(f"{name!r} is not a lamplight slot file")
    try:
        data = _read_npz(path)
        if data is None:
            data = _read_torch_file(path)
    except InvalidRequestError:
        raise
    except Exception as exc:
        raise InvalidRequestError(f"slot file {name!r} cannot be read: {exc}") from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("version") not in (1, VERSION):
        raise InvalidRequestError(f"{name!r} is not a lamplight slot file")
    if data.get("model") != fingerprint:
        raise InvalidRequestError("the slot file was saved with another model")
    if not _is_list_of(data.get("tokens"), int) or not _is_list_of(data.get("lora"), (int, float)):
        raise InvalidRequestError(f"{name!r} is not a lamplight slot file (its tokens or adapter scales are malformed)")
    if len(data["tokens"]) > n_ctx_slot:
        raise InvalidRequestError(f"the slot file holds {len(data['tokens'])} tokens, more than a slot's {n_ctx_slot}")
    return data


def write_slot(cache: KVCache, table: BlockTable, data: dict) -> None:
    """Put what load_slot read into the slot's blocks (its old ones released)."""
    pool = cache.pool
    n = len(data["tokens"])
    if data["version"] == VERSION:
        _check_rows(pool, data, n)
    table.release()
    table.fill_to(n)
    slots = table.slots()
    if data["version"] == VERSION and (data["k_type"], data["v_type"]) == (pool.k_type.name, pool.v_type.name):
        for layer in range(len(pool.k)):
            pool.write_stored(layer, slots, _as_stored(pool.k[layer], data["k"][layer], pool.k_type),
                              _as_stored(pool.v[layer], data["v"][layer], pool.v_type))
        return
    _write_floats(pool, slots, data)


def _is_list_of(value: Any, kinds) -> bool:
    return isinstance(value, list) and all(isinstance(x, kinds) and not isinstance(x, bool) for x in value)


def _check_rows(pool: KVPool, data: dict, n: int) -> None:
    """A version 2 file's K/V: one array per layer of this model, each [n_kv_heads, n, row] of its
    type's storage (what the pool's own read_stored gives), before any of it is written."""
    if data["layers"] != len(pool.k):
        raise InvalidRequestError(f"the slot file holds {data['layers']} layers of K/V, this model {len(pool.k)}")
    for layer in range(len(pool.k)):
        n_kv, dk, dv = pool.layout.shape(layer)
        for name, rows, dim in ((data["k_type"], data["k"][layer], dk), (data["v_type"], data["v"][layer], dv)):
            kind = KV_TYPES[name]
            try:
                shape = (n_kv, n, kind.row_width(dim))
            except ValueError as exc:  # a quantized type this head size cannot take
                raise InvalidRequestError(f"the slot file's K/V: {exc}") from exc
            if rows.dtype != kind.storage or rows.shape != shape:
                raise InvalidRequestError(f"the slot file's layer {layer} K/V is {rows.dtype}{list(rows.shape)}, "
                                          f"this model's {np.dtype(kind.storage)}{list(shape)}")


def _read_npz(path: str) -> dict | None:
    """A version 2 file's contents; None for a zip archive without its header (a version 1 file:
    torch.save's)."""
    with np.load(path, allow_pickle=False) as archive:
        if "header" not in archive.files:
            return None
        data = json.loads(archive["header"].tobytes().decode())
        if not isinstance(data, dict) or data.get("version") != VERSION or not isinstance(data.get("layers"), int):
            return data
        if data.get("k_type") not in KV_TYPES or data.get("v_type") not in KV_TYPES:
            raise InvalidRequestError(f"the slot file's K/V types {data.get('k_type')!r}, {data.get('v_type')!r} are unknown")
        missing = [name for i in range(data["layers"]) for name in (f"k{i}", f"v{i}") if name not in archive.files]
        if missing:
            raise InvalidRequestError(f"the slot file's header says {data['layers']} layers, its K/V lacks {missing[0]}")
        data["k"] = [archive[f"k{i}"] for i in range(data["layers"])]
        data["v"] = [archive[f"v{i}"] for i in range(data["layers"])]
        if "recurrent" in archive.files:
            data["recurrent"] = archive["recurrent"]
        return data


def _read_torch_file(path: str) -> Any:
    """A version 1 file: torch.save's dictionary of float tensors (token-major K/V)."""
    import torch

    return torch.load(path, map_location="cpu", weights_only=True)


def _as_numpy(x: Any) -> np.ndarray:
    """A pool's rows or a snapshot as a numpy array on the CPU: a numpy pool's are already; a
    PyTorch pool's tensors are copied over, bf16 as its bits."""
    if isinstance(x, np.ndarray):
        return x
    import torch

    x = x.detach().cpu()
    return x.view(torch.int16).numpy().view(np.uint16) if x.dtype == torch.bfloat16 else x.numpy()


def _as_stored(storage: Any, rows: np.ndarray, kind: KVType) -> Any:
    """Saved rows of `kind` as `storage` (one of the pool's arrays, of that type) takes them:
    themselves for a numpy pool, a tensor on its device for a PyTorch pool."""
    if isinstance(storage, np.ndarray):
        return rows
    from ..state.torch_pools import stored_tensor

    return stored_tensor(rows, kind).to(storage.device)


def _write_floats(pool: KVPool, slots: list[int], data: dict) -> None:
    """K/V as float values into a pool of any types: a version 1 file's, or a version 2 file's
    rows decoded from the types it was saved with (PyTorch's codecs)."""
    import torch

    from ..state.torch_pools import stored_values, torch_view

    view = torch_view(pool)
    index = torch.tensor(slots, dtype=torch.long, device=view.device)
    for layer in range(len(view.k)):
        if data["version"] == VERSION:
            _, dk, dv = view.layout.shape(layer)
            k = stored_values(data["k"][layer], KV_TYPES[data["k_type"]], dk)
            v = stored_values(data["v"][layer], KV_TYPES[data["v_type"]], dv)
        else:
            k, v = data["k"][layer], data["v"][layer]
        view.write(layer, index, k.to(view.device), v.to(view.device))
