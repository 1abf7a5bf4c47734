"""Native CPU kernels (C++, built with a plain compiler, loaded through ctypes).

`lamplight.native.runtime` decides at start-up whether they are used: the widest instruction-set
variant this CPU runs, built on first use in seconds and cached; without a compiler lamplight
runs on PyTorch's kernels and says so once.
"""
