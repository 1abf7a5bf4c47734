"""What a KV pool stores K or V as (`-ctk/-ctv`): a float type or a block-quantized one
(lamplight.state.kv_quant), described without PyTorch.

Each type says its llama.cpp name, its bits per value, the id the native forward knows it by
(src/kv_rows.cpp's LP_KV_*), the numpy type a row is stored as and how wide a row of `dim` values
is in that type. bf16 has no numpy type: its values are stored as their 16 bits (uint16), as the
native forward reads them; a PyTorch pool stores them as torch.bfloat16
(lamplight.state.torch_pools).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .kv_quant import QUANT_TYPES, KVQuant


@dataclass(frozen=True)
class KVFloat:
    """A float KV type: each value stored on its own, in `storage` (numpy)."""

    name: str
    bits: int
    storage: type
    native_id: int

    def row_width(self, dim: int) -> int:
        """Elements of `storage` in a row of `dim` values."""
        return dim


F32 = KVFloat("f32", 32, np.float32, 0)
F16 = KVFloat("f16", 16, np.float16, 1)
BF16 = KVFloat("bf16", 16, np.uint16, 2)

KVType = KVFloat | KVQuant

# Every `-ctk/-ctv` type by its llama.cpp name.
KV_TYPES: dict[str, KVType] = {"f32": F32, "f16": F16, "bf16": BF16, **QUANT_TYPES}

# The float types by their dtype names (torch.float16 is named 'torch.float16').
_BY_DTYPE_NAME = {"float32": F32, "float16": F16, "bfloat16": BF16}


def kv_type(kind) -> KVType:
    """A KV type from what callers pass: a KV type, its name ('f16', 'q8_0'), a torch or numpy
    float dtype (read by name, so torch is not imported), or None for f32."""
    if kind is None:
        return F32
    if isinstance(kind, (KVFloat, KVQuant)):
        return kind
    if isinstance(kind, str) and kind in KV_TYPES:
        return KV_TYPES[kind]
    found = _BY_DTYPE_NAME.get(str(kind).removeprefix("torch."))
    if found is None:
        raise ValueError(f"{kind!r} is not a KV cache type (one of {', '.join(KV_TYPES)}, or a float dtype)")
    return found
