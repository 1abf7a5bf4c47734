"""The pools on PyTorch storage: what the PyTorch runners (lamplight.runner.torch_runner) compute
on, on any device. `TorchKVPool` and `TorchRecurrentPool` keep the numpy pools' layout and
bookkeeping (lamplight.state.kv, lamplight.state.recurrent) with tensors, and add the reads and
writes of float values the PyTorch model makes (quantized types through
lamplight.state.kv_quant_torch). `torch_view` shows a numpy KV pool as a TorchKVPool sharing its
memory (slot files read and write through it).
"""

from __future__ import annotations

import numpy as np
import torch

from .kv import Indices, KVPool
from .kv_quant import KVQuant
from .kv_quant_torch import dequantize, quantize
from .kv_types import KVType
from .layout import KVLayout, RecurrentLayout, StateSpec
from .model_state import ModelState
from .recurrent import RecurrentPool

# A float KV type's PyTorch dtype, and a quantized type's row bytes'.
_DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def torch_dtype(kind: KVType) -> torch.dtype:
    """The dtype a PyTorch pool stores a KV type's rows in."""
    return torch.uint8 if isinstance(kind, KVQuant) else _DTYPES[kind.name]


class TorchKVPool(KVPool):
    """A KVPool of tensors on `device`: `k[layer]`, `v[layer]` [n_kv_heads, num_tokens, head_dim]
    of a float dtype, or of a quantized type [n_kv_heads, num_tokens, row bytes] uint8.
    write/read/gather take and give float values either way."""

    def __init__(self, layout: KVLayout, num_tokens: int, dtype=None, device: torch.device | str = "cpu",
                 v_dtype=None):
        self._device = torch.device(device)  # also for a model without attention layers
        super().__init__(layout, num_tokens, dtype, v_dtype=v_dtype)

    def _zeros(self, shape: tuple[int, ...], kind: KVType) -> torch.Tensor:
        """On the CPU, the numpy pool's calloc'd zeros (pages resident only once written; torch.zeros
        writes every byte) seen as the type's dtype; elsewhere the device's zeros."""
        if self._device.type != "cpu":
            return torch.zeros(shape, dtype=torch_dtype(kind), device=self._device)
        return torch.from_numpy(super()._zeros(shape, kind)).view(torch_dtype(kind))

    def _index(self, slots: Indices) -> torch.Tensor:
        return torch.as_tensor(slots, dtype=torch.long, device=self.device)

    @property
    def device(self) -> torch.device:
        return self.k[0].device if self.k else self._device

    def floats(self, n: int) -> torch.Tensor:
        return torch.zeros(n, device=self.device)

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store K/V of tokens ([T, n_kv_heads, head_dim]) at pool indices `slots` ([T])."""
        self.k[layer].index_copy_(1, slots, _encode(k.transpose(0, 1), self.k_type))
        self.v[layer].index_copy_(1, slots, _encode(v.transpose(0, 1), self.v_type))

    def read(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K/V at pool indices `slots`, token-major: [T, n_kv_heads, head_dim] (a quantized
        type's values dequantized to float32)."""
        _, dk, dv = self.layout.shape(layer)
        return _token_major(self.k[layer][:, slots], self.k_type, dk), _token_major(self.v[layer][:, slots], self.v_type, dv)

    def gather(self, layer: int, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K/V at pool indices `index` ([B, C]), head-major: [n_kv_heads, B, C, head_dim]."""
        flat = index.reshape(-1)
        _, dk, dv = self.layout.shape(layer)
        k = _decode(self.k[layer].index_select(1, flat), self.k_type, dk)
        v = _decode(self.v[layer].index_select(1, flat), self.v_type, dv)
        return k.view(k.shape[0], *index.shape, k.shape[-1]), v.view(v.shape[0], *index.shape, v.shape[-1])

    @classmethod
    def view_of(cls, pool: KVPool) -> "TorchKVPool":
        """A numpy pool's storage seen as tensors (shared memory): writes through it land in `pool`."""
        view = cls.__new__(cls)
        view.layout, view.num_tokens, view.k_type, view.v_type = pool.layout, pool.num_tokens, pool.k_type, pool.v_type
        view._device = torch.device("cpu")
        view.k = [stored_tensor(t, pool.k_type) for t in pool.k]
        view.v = [stored_tensor(t, pool.v_type) for t in pool.v]
        return view


def torch_view(pool: KVPool) -> TorchKVPool:
    """`pool` as a TorchKVPool: itself, or a numpy pool's storage seen as tensors."""
    return pool if isinstance(pool, TorchKVPool) else TorchKVPool.view_of(pool)


def stored_tensor(rows: np.ndarray, kind: KVType) -> torch.Tensor:
    """Rows as a numpy pool stores a type (lamplight.state.kv_types' storage) as the tensor a
    PyTorch pool stores them in, on the CPU: the same memory where `rows` is contiguous."""
    return torch.from_numpy(np.ascontiguousarray(rows)).view(torch_dtype(kind))


def stored_values(rows: np.ndarray, kind: KVType, dim: int) -> torch.Tensor:
    """Stored rows of a type, head-major ([n_kv_heads, T, row], as read_stored gives them), as the
    float values TorchKVPool.read gives and write takes: token-major [T, n_kv_heads, dim]."""
    return _token_major(stored_tensor(rows, kind), kind, dim)


def _token_major(stored: torch.Tensor, kind: KVType, dim: int) -> torch.Tensor:
    return _decode(stored, kind, dim).transpose(0, 1)


def _encode(x: torch.Tensor, kind: KVType) -> torch.Tensor:
    return quantize(kind, x) if isinstance(kind, KVQuant) else x.to(torch_dtype(kind))


def _decode(stored: torch.Tensor, kind: KVType, dim: int) -> torch.Tensor:
    return dequantize(kind, stored, dim) if isinstance(kind, KVQuant) else stored


class TorchRecurrentPool(RecurrentPool):
    """A RecurrentPool of float32 tensors on `device`, with the PyTorch model's reads and writes."""

    def __init__(self, layouts: tuple[RecurrentLayout, ...], n_sequences: int, device: torch.device | str = "cpu"):
        self._device = torch.device(device)
        super().__init__(layouts, n_sequences)

    def _zeros(self, shape: tuple[int, ...]) -> torch.Tensor:
        return torch.zeros(shape, device=self._device)

    def _flat(self, parts: list) -> torch.Tensor:
        return torch.cat(parts) if parts else torch.zeros(0, device=self._device)

    def _as_storage(self, snapshot) -> torch.Tensor:
        return torch.as_tensor(snapshot, dtype=torch.float32, device=self._device)

    def read(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Copies of layer `layer`'s history and matrix at `slots` ([B])."""
        matrix = self.matrix[layer]
        return self.history[layer].index_select(0, slots), None if matrix is None else matrix.index_select(0, slots)

    def write(self, layer: int, slots: torch.Tensor, history: torch.Tensor, matrix: torch.Tensor | None) -> None:
        self.history[layer].index_copy_(0, slots, history)
        if matrix is not None:
            self.matrix[layer].index_copy_(0, slots, matrix)


def torch_state(spec: StateSpec, num_tokens: int, k_dtype=None, v_dtype=None, device: torch.device | str = "cpu",
                n_sequences: int = 1) -> ModelState:
    """A ModelState of PyTorch pools on `device`: `num_tokens` K/V entries (K as `k_dtype`, None:
    f32; V as `v_dtype`, None: as K), `n_sequences` recurrent slots where the model has recurrent layers."""
    recurrent = TorchRecurrentPool(spec.recurrent, n_sequences, device) if spec.recurrent else None
    return ModelState(TorchKVPool(spec.kv, num_tokens, k_dtype, device, v_dtype), recurrent)
