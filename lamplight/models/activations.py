"""The gate/up combinations of the feed-forward layers, by the name an architecture gives.

Names, not functions, are what the model definition holds, so every backend (PyTorch here, the
native forward in lamplight.native) maps the same name to its own implementation.
"""

from __future__ import annotations

import functools
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

# Rows of elementwise transcendental ops are padded to a multiple of this many floats: CPU
# kernels compute whole vectors (up to 2 x 16 floats per iteration) one way and a remainder
# another (a scalar loop), and a contiguous tensor is one flat loop, so without the padding a
# value's bits would depend on how many rows came with it (where the remainder falls).
ALIGN = 64

SWIGLU_OAI_ALPHA = 1.702  # gpt-oss's clamped SwiGLU (llama.cpp: ggml_swiglu_oai, fixed values)
SWIGLU_OAI_LIMIT = 7.0


def aligned(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """fn(x) elementwise, computed on rows padded to ALIGN (see above)."""
    pad = -x.shape[-1] % ALIGN
    if not pad:
        return fn(x.contiguous())
    return fn(F.pad(x, (0, pad)))[..., : x.shape[-1]]


def silu_glu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return aligned(F.silu, gate) * up


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


def gelu_tanh_glu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """GeGLU with the tanh-approximated GELU (gemma3)."""
    return aligned(_gelu_tanh, gate) * up


GELU_IDENTITY_FROM = 10.0  # ggml's GELU is x itself from here up (and 0 at -10 and below)


@functools.lru_cache(maxsize=None)
def fp16_gelu_table(device: torch.device = torch.device("cpu")) -> torch.Tensor:
    """ggml's GELU table: for each of the 65536 fp16 bit patterns (indexed as uint16), the tanh
    GELU of that value rounded to fp16, as float32; zero at -10 and below."""
    values = torch.arange(65536, dtype=torch.int32).to(torch.uint16).view(torch.float16).float()
    table = aligned(_gelu_tanh, values).half().float()
    table[values <= -GELU_IDENTITY_FROM] = 0.0
    return table.to(device)


def gelu_tanh_fp16_table(gate: torch.Tensor, up: torch.Tensor | float) -> torch.Tensor:
    """GeGLU as ggml's CPU computes it: GELU (tanh form) looked up in a table indexed by the
    input rounded to fp16 and holding fp16 results; identity from 10 up, zero at -10 and below
    (gemma2, BERT's FFN). A real lookup: on the CPU numpy's take, 2.6x faster than computing
    the GELU again on 12M values (torch's gather is slower than that)."""
    table = fp16_gelu_table(gate.device)
    bits = gate.half().contiguous()
    if gate.device.type == "cpu" and not torch.compiler.is_compiling():
        g = torch.from_numpy(np.take(table.numpy(), bits.numpy().view(np.uint16)))
    else:
        g = table[bits.view(torch.uint16).int()]
    g = torch.where(gate >= GELU_IDENTITY_FROM, gate, g)
    return g if isinstance(up, float) and up == 1.0 else g * up


def swiglu_oai(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """gpt-oss: gate clamped above, up clamped both ways, then x * sigmoid(alpha x) * (up + 1)."""
    gate = gate.clamp(max=SWIGLU_OAI_LIMIT)
    up = up.clamp(-SWIGLU_OAI_LIMIT, SWIGLU_OAI_LIMIT)
    return gate * aligned(torch.sigmoid, SWIGLU_OAI_ALPHA * gate) * (up + 1)


ACTIVATIONS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "silu": silu_glu,
    "gelu_tanh": gelu_tanh_glu,
    "gelu_tanh_fp16": gelu_tanh_fp16_table,
    "swiglu_oai": swiglu_oai,
}
