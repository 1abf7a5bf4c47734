"""Reading a GGUF file: its metadata as plain Python values and its tensors as raw blocks.

We parse the header ourselves instead of using `gguf.GGUFReader`: the reader builds numpy views
for every element of every array, which took 18 s for Gemma 3's 262k-token vocabulary; this
parser takes well under a second. Constants (types, block sizes) still come from `gguf`.
"""

from __future__ import annotations

import mmap
import os
import re
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

GGUF_MAGIC = b"GGUF"
SPLIT_NAME = re.compile(r"(.+)-00001-of-(\d{5})\.gguf")
DEFAULT_ALIGNMENT = 32

# GGUF value type id -> (struct format, numpy dtype) for scalar types.
_SCALARS = {
    0: ("<B", np.uint8),
    1: ("<b", np.int8),
    2: ("<H", np.uint16),
    3: ("<h", np.int16),
    4: ("<I", np.uint32),
    5: ("<i", np.int32),
    6: ("<f", np.float32),
    7: ("<?", np.bool_),
    10: ("<Q", np.uint64),
    11: ("<q", np.int64),
    12: ("<d", np.float64),
}
_STRING, _ARRAY = 8, 9


class GGUFError(ValueError):
    """A GGUF file that cannot be used: missing, corrupt, or of a kind we do not support."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    qtype: GGMLQuantizationType
    # Logical shape in PyTorch order (rows first): a linear weight is (out_features, in_features).
    shape: tuple[int, ...]
    # The raw bytes exactly as stored (uint8, memory-mapped), one row of blocks per logical row.
    data: np.ndarray


def release_tensor_pages(data: np.ndarray) -> None:
    """Drop from this process's resident memory the whole pages under `data`, a tensor's bytes
    in a GGUF file's read-only map (they stay in the page cache and come back from the file on
    access): once a tensor is repacked, its raw blocks need not stay resident while the rest
    loads. Anything that is not a view of such a map is left alone (dropping anonymous memory
    would lose it)."""
    base = data
    while isinstance(base, np.ndarray):
        base = base.base
    if (not hasattr(mmap, "MADV_DONTNEED") or not isinstance(base, memoryview) or not base.readonly
            or not isinstance(base.obj, mmap.mmap) or not data.flags.c_contiguous):
        return
    try:
        start = data.ctypes.data - np.frombuffer(base.obj, dtype=np.uint8).ctypes.data
        page = mmap.PAGESIZE
        first, last = -(-start // page) * page, (start + data.nbytes) // page * page
        if 0 <= first < last <= len(base.obj):
            base.obj.madvise(mmap.MADV_DONTNEED, first, last - first)
    except ValueError:  # the map was closed
        pass


class GGUFFile:
    """A memory-mapped GGUF file.

    `metadata` maps every key to a plain Python value (str, int, float, bool, list of str, or a
    numpy array for numeric arrays); `tensors` maps tensor names to their raw data.
    Nothing is dequantized here.
    """

    def __init__(self, path: str | os.PathLike, *, split_part: bool = False):
        """`split_part`: a later file of a split GGUF, opened by the first (no parts of its own)."""
        self.path = os.fspath(path)
        if not os.path.isfile(self.path):
            raise GGUFError(f"model file not found: {self.path}")
        self.file_size = os.path.getsize(self.path)
        try:
            with open(self.path, "rb") as f:
                self._buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as exc:
            raise GGUFError(f"cannot read GGUF file {self.path}: {exc}") from exc
        try:
            self._parse()
        except (struct.error, UnicodeDecodeError, IndexError, KeyError, ValueError) as exc:
            if isinstance(exc, GGUFError):
                raise
            raise GGUFError(f"{self.path} is not a valid GGUF file (truncated or corrupt): {exc}") from exc
        self.parts = [self] + ([] if split_part else self._other_split_parts())
        for part in self.parts[1:]:
            self.tensors.update(part.tensors)
        expected = self.metadata.get("split.tensors.count")
        if len(self.parts) > 1 and expected is not None and len(self.tensors) != int(expected):
            raise GGUFError(f"{self.path}: the split holds {len(self.tensors)} tensors, its header says {expected}")

    def _other_split_parts(self) -> list["GGUFFile"]:
        """The other files of a split GGUF (llama.cpp's gguf-split: NAME-00001-of-0000N.gguf, the
        first holding the metadata), opened when this is the first; [] for a whole file."""
        count = int(self.metadata.get("split.count", 1) or 1)
        if count <= 1:
            return []
        if int(self.metadata.get("split.no", 0)) != 0:
            raise GGUFError(f"{self.path} is part {int(self.metadata['split.no']) + 1} of a split GGUF: give the first part")
        match = SPLIT_NAME.fullmatch(os.path.basename(self.path))
        if match is None:
            raise GGUFError(f"{self.path}: a split GGUF whose name does not end in -00001-of-{count:05d}.gguf")
        folder, prefix = os.path.dirname(self.path), match.group(1)
        paths = [os.path.join(folder, f"{prefix}-{i:05d}-of-{count:05d}.gguf") for i in range(2, count + 1)]
        missing = [p for p in paths if not os.path.isfile(p)]
        if missing:
            raise GGUFError(f"{self.path}: split GGUF part(s) missing: {', '.join(missing)}")
        return [GGUFFile(p, split_part=True) for p in paths]

    # -- public helpers -------------------------------------------------------------------------

    def release_pages(self) -> None:
        """Let the OS drop the file's pages from this process's resident memory (they stay in
        the page cache and come back on access): after the weights were repacked, the raw
        blocks are only read again for a few embedding rows per step."""
        if hasattr(mmap, "MADV_DONTNEED"):
            for part in self.parts:
                part._buf.madvise(mmap.MADV_DONTNEED)

    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise GGUFError(f"{self.path}: no general.architecture in metadata")
        return arch

    def arch_value(self, key: str, default: Any = None) -> Any:
        """A metadata value under the architecture's prefix, e.g. arch_value('block_count')."""
        return self.metadata.get(f"{self.architecture}.{key}", default)

    def require_arch_value(self, key: str) -> Any:
        value = self.arch_value(key)
        if value is None:
            raise GGUFError(f"{self.path}: metadata key {self.architecture}.{key} is missing")
        return value

    # -- parsing --------------------------------------------------------------------------------

    def _parse(self) -> None:
        buf = self._buf
        if buf[:4] != GGUF_MAGIC:
            raise GGUFError(f"{self.path} is not a GGUF file (bad magic {bytes(buf[:4])!r})")
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
        if version < 2:
            raise GGUFError(f"{self.path}: GGUF version {version} is not supported (need 2 or 3)")
        self.version = version
        pos = 24
        self.metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key, pos = self._read_string(pos)
            (vtype,) = struct.unpack_from("<I", buf, pos)
            value, pos = self._read_value(vtype, pos + 4)
            self.metadata[key] = value

        infos = []
        for _ in range(n_tensors):
            name, pos = self._read_string(pos)
            (n_dims,) = struct.unpack_from("<I", buf, pos)
            dims = struct.unpack_from(f"<{n_dims}Q", buf, pos + 4)
            pos += 4 + 8 * n_dims
            qtype_id, offset = struct.unpack_from("<IQ", buf, pos)
            pos += 12
            infos.append((name, dims, qtype_id, offset))

        alignment = int(self.metadata.get("general.alignment", DEFAULT_ALIGNMENT))
        data_start = (pos + alignment - 1) // alignment * alignment
        self.tensors: dict[str, TensorInfo] = {}
        for name, dims, qtype_id, offset in infos:
            self.tensors[name] = self._tensor(name, dims, qtype_id, data_start + offset)

    def _tensor(self, name: str, dims: tuple[int, ...], qtype_id: int, start: int) -> TensorInfo:
        try:
            qtype = GGMLQuantizationType(qtype_id)
        except ValueError:
            raise GGUFError(f"{self.path}: tensor {name} has unknown GGML type id {qtype_id}") from None
        block_size, type_size = GGML_QUANT_SIZES[qtype]
        row_len = dims[0]
        if row_len % block_size:
            raise GGUFError(f"{self.path}: tensor {name} row of {row_len} is not a multiple of {block_size}")
        n_rows = int(np.prod(dims[1:])) if len(dims) > 1 else 1
        row_bytes = row_len // block_size * type_size
        end = start + n_rows * row_bytes
        if end > self.file_size:
            raise GGUFError(f"{self.path}: tensor {name} extends past the end of the file (truncated download?)")
        raw = np.frombuffer(self._buf, dtype=np.uint8, count=n_rows * row_bytes, offset=start)
        shape = tuple(int(d) for d in reversed(dims))
        return TensorInfo(name, qtype, shape, raw.reshape(n_rows, row_bytes))

    def _read_string(self, pos: int) -> tuple[str, int]:
        (n,) = struct.unpack_from("<Q", self._buf, pos)
        pos += 8
        raw = self._buf[pos : pos + n]
        return raw.decode("utf-8", errors="surrogateescape"), pos + n

    def _read_value(self, vtype: int, pos: int) -> tuple[Any, int]:
        if vtype == _STRING:
            return self._read_string(pos)
        if vtype == _ARRAY:
            item_type, n = struct.unpack_from("<IQ", self._buf, pos)
            return self._read_array(item_type, n, pos + 12)
        fmt, _ = _SCALARS[vtype]
        (value,) = struct.unpack_from(fmt, self._buf, pos)
        return value, pos + struct.calcsize(fmt)

    def _read_array(self, item_type: int, n: int, pos: int) -> tuple[Any, int]:
        if item_type == _STRING:
            out = []
            buf, unpack = self._buf, struct.Struct("<Q").unpack_from
            for _ in range(n):
                (length,) = unpack(buf, pos)
                pos += 8
                out.append(buf[pos : pos + length].decode("utf-8", errors="surrogateescape"))
                pos += length
            return out, pos
        if item_type == _ARRAY:
            out = []
            for _ in range(n):
                sub_type, sub_n = struct.unpack_from("<IQ", self._buf, pos)
                value, pos = self._read_array(sub_type, sub_n, pos + 12)
                out.append(value)
            return out, pos
        _, dtype = _SCALARS[item_type]
        arr = np.frombuffer(self._buf, dtype=dtype, count=n, offset=pos).copy()
        return arr, pos + arr.nbytes
