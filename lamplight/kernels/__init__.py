"""Weight kernels for PyTorch: GGUF blocks repacked for PyTorch's low-bit matmuls, bf16 or
float32 dense weights, each batch-invariant. The models compute with them (reference: float32);
lamplight.runner.fast_path assigns the fast ones. This package imports no model code.
"""
