"""LoRA adapters of an engine: their server-wide scales, each request's set of scales (its key),
and which running sequences share one set (one set per forward step)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..models.lora import LoraAdapter
from .types import GenerationRequest, InvalidRequestError

if TYPE_CHECKING:
    from .sequence import Sequence


class LoraSets:
    def __init__(self, runner, adapters: list[LoraAdapter] | None):
        self.adapters = list(adapters or [])
        if self.adapters and runner.lora_scales is None:
            runner.attach_loras(self.adapters)
        # The runner's per-step scales (None without adapters: nothing to switch).
        self.step_scales = runner.lora_scales if self.adapters else None

    def check(self, request: GenerationRequest) -> None:
        for adapter_id, _ in request.lora or ():
            if not 0 <= adapter_id < len(self.adapters):
                raise InvalidRequestError(f"lora: no adapter with id {adapter_id} (the server has {len(self.adapters)})")

    def key(self, request: GenerationRequest) -> tuple[float, ...]:
        """Every adapter's scale for this request: as it asks (unlisted ones 0), else the server's."""
        if request.lora is None:
            return tuple(a.scale for a in self.adapters)
        scales = [0.0] * len(self.adapters)
        for adapter_id, scale in request.lora:
            scales[adapter_id] = float(scale)
        return tuple(scales)

    def use(self, key: tuple[float, ...]) -> None:
        """Set the model's scales for the next forward step."""
        if self.step_scales is not None:
            self.step_scales.scales = list(key)

    def json(self) -> list[dict]:
        return [{"id": i, "path": a.path, "scale": a.scale} for i, a in enumerate(self.adapters)]

    def set_scales(self, entries: list[tuple[int, float]]) -> None:
        """Server-wide scales for requests that name none (adapters not listed get 0)."""
        for adapter_id, _ in entries:
            if not 0 <= adapter_id < len(self.adapters):
                raise InvalidRequestError(f"no adapter with id {adapter_id} (the server has {len(self.adapters)})")
        new = dict(entries)
        for i, adapter in enumerate(self.adapters):
            adapter.scale = float(new.get(i, 0.0))


def one_lora_set(runnable: list["Sequence"], step: int) -> list["Sequence"]:
    """Running sequences that share adapter scales with each other: one set per step.

    Different sets take turns, step by step, so none waits for another to finish.
    """
    keys = list(dict.fromkeys(seq.handle.lora_key for seq in runnable))
    if len(keys) <= 1:
        return runnable
    key = keys[step % len(keys)]
    return [seq for seq in runnable if seq.handle.lora_key == key]
