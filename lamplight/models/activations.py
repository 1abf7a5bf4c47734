"""The gate/up combinations of the feed-forward layers, by the name an architecture gives.

Names, not functions, are what the model definition holds, so every backend (PyTorch here, the
native forward in lamplight.native) maps the same name to its own implementation.
"""

from __future__ import annotations

from typing import Callable

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


def gelu_tanh_fp16_table(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """GeGLU as ggml's CPU computes it: GELU (tanh form) looked up in a table indexed by the
    input rounded to fp16 and holding fp16 results; identity above 10, zero below -10 (gemma2)."""
    g = aligned(_gelu_tanh, gate.half().float()).half().float()
    g = torch.where(gate >= 10.0, gate, torch.where(gate <= -10.0, torch.zeros_like(gate), g))
    return g * up


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
