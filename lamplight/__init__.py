"""lamplight: a local LLM inference server for GGUF models."""

__version__ = "0.1.0"
