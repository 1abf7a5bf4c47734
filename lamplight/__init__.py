"""lamplight: a local LLM inference server for GGUF models, OpenAI- and llama.cpp-compatible."""

__version__ = "0.1.0"


def load(*args, **kwargs):
    """Load a model, its tokenizer and chat template: see `lamplight.loader.load`."""
    from .loader import load as _load

    return _load(*args, **kwargs)


__all__ = ["load", "__version__"]
