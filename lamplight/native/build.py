"""Building the native kernels: one shared library per instruction-set variant, cached on disk.

The C++ sources in `src/` need no torch headers and no build system: a plain `c++` call builds a
variant in seconds. Each variant is the same source compiled for another instruction set
(`#ifdef __AVX512VNNI__` / `__AVX2__` inside choose the code paths); `best_variant()` picks the
widest one this CPU runs. Libraries are cached under a key of the sources, the flags, the
compiler's version and torch's version, so a changed source or compiler never loads a stale one.

Why not torch.utils.cpp_extension: its build compiles against torch's headers, which took 40-50 s
and 1.6 GB per build on the project's 2-core machines; this takes about two seconds.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

SOURCE_DIR = Path(__file__).resolve().parent / "src"

COMMON_FLAGS = ("-O3", "-std=c++17", "-fPIC", "-shared", "-pthread", "-ffp-contract=off", "-fno-math-errno")

# Variant name -> (extra compiler flags, CPU flags from /proc/cpuinfo it needs). Order: preferred first.
# AMX is never enabled: its instructions fault in the VMs this project runs on.
VARIANTS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "avx512vnni": (
        ("-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512vnni"),
        ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"),
    ),
    "avx2": (("-mavx2", "-mfma", "-mf16c"), ("avx2", "fma", "f16c")),
    "generic": ((), ()),
}


class BuildError(RuntimeError):
    pass


def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def runnable_variants(flags: set[str] | None = None) -> list[str]:
    """Variants this CPU can run, preferred first (`generic` always; x86 ones by CPU flag)."""
    flags = cpu_flags() if flags is None else flags
    is_x86 = platform.machine().lower() in ("x86_64", "amd64")
    return [name for name, (_, needs) in VARIANTS.items() if not needs or (is_x86 and set(needs) <= flags)]


def best_variant() -> str:
    return runnable_variants()[0]


def compiler() -> str | None:
    """The C++ compiler to use: $CXX, else c++ or g++ on the PATH; None if there is none."""
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def cache_dir() -> Path:
    root = os.environ.get("LAMPLIGHT_NATIVE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "lamplight", "native")
    return Path(root)


def _compiler_version(cxx: str) -> str:
    out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30)
    return out.stdout.splitlines()[0] if out.stdout else cxx


def _torch_version() -> str:
    """torch's version as torch.__version__ gives it (what the key has always held, so the cached
    libraries keep their names), read from the installed package without importing torch."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return ""


def _build_key(cxx: str, flags: tuple[str, ...]) -> str:
    digest = hashlib.sha256()
    for path in sorted(SOURCE_DIR.iterdir()):
        if path.suffix in (".cpp", ".h"):
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    for part in (*flags, _compiler_version(cxx), _torch_version(), platform.machine()):
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()[:16]


def _target(variant: str) -> tuple[str, tuple[str, ...], Path]:
    cxx = compiler()
    if cxx is None:
        raise BuildError("no C++ compiler found (set CXX, or install g++)")
    flags = COMMON_FLAGS + VARIANTS[variant][0]
    return cxx, flags, cache_dir() / f"liblamplight-{variant}-{_build_key(cxx, flags)}.so"


def is_built(variant: str) -> bool:
    """Whether `variant` is in the cache already (False without a compiler)."""
    try:
        return _target(variant)[2].is_file()
    except BuildError:
        return False


def library_path(variant: str) -> Path:
    """Build `variant` if it is not cached yet; return the path of its shared library."""
    cxx, flags, target = _target(variant)
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    sources = sorted(str(p) for p in SOURCE_DIR.glob("*.cpp"))
    # Build into a temporary name and rename: concurrent first starts never load a half-written file.
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        result = subprocess.run([cxx, *flags, *sources, "-o", tmp], capture_output=True, text=True, timeout=600)
        if result.returncode != 0:
            raise BuildError(f"{cxx} failed building the {variant} kernels:\n{result.stderr[-4000:]}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target
