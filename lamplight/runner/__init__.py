"""The model-runner layer: one interface (`ModelRunner`), one implementation per backend.

`lamplight.loader.build_runner` chooses and builds the backend; the engine holds the runner and
calls nothing else to compute a step. Backends: `torch_runner.TorchRunner` (reference, pytorch),
`compiled.CompiledRunner` (compiled), `lamplight.native.runner.NativeRunner` (native).
"""

from .base import ModelRunner

__all__ = ["ModelRunner", "greedy", "score"]


def __getattr__(name: str):
    # The scoring helpers run PyTorch steps: imported on first use, so the interface needs no torch.
    if name in ("greedy", "score"):
        from . import scoring

        return getattr(scoring, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
