"""The model-runner layer: one interface (`ModelRunner`), one implementation per backend.

`lamplight.loader.build_runner` chooses and builds the backend; the engine holds the runner and
calls nothing else to compute a step. Backends: `torch_runner.TorchRunner` (reference, pytorch),
`compiled.CompiledRunner` (compiled), `lamplight.native.runner.NativeRunner` (native).
"""

from .base import ModelRunner
from .scoring import greedy, score

__all__ = ["ModelRunner", "greedy", "score"]
