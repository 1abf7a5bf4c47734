"""Fast weight kernels: GGUF blocks repacked for PyTorch's low-bit matmuls, or bf16 weights.

`lamplight.kernels.fast_path.use_fast_path(model)` switches a loaded model from the float32
reference path to these kernels; the model code itself does not change.
"""
