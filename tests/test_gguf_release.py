"""Dropping a repacked tensor's raw pages while a model loads (lamplight.gguf.file.
release_tensor_pages): the bytes read the same afterwards, the file map's resident pages go,
and memory that is not a GGUF file's read-only map is never touched."""

from __future__ import annotations

import numpy as np
from tiny_gguf import write_tiny_llama

from lamplight.gguf.file import GGUFFile, release_tensor_pages


def _resident_kib(path: str) -> int:
    """Resident KiB of this process's maps of `path`."""
    total, inside = 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if not fields[0].endswith(":"):
                inside = len(fields) > 5 and fields[5] == path
            elif inside and fields[0] == "Rss:":
                total += int(fields[1])
    return total


def test_a_tensors_pages_go_and_its_bytes_stay(tmp_path):
    path = write_tiny_llama(tmp_path / "m.gguf", n_embd=256)
    gguf = GGUFFile(path)
    info = max(gguf.tensors.values(), key=lambda t: t.data.nbytes)
    assert info.data.nbytes > 4 * 4096
    before = info.data.copy()
    int(info.data.sum())  # every page resident
    resident = _resident_kib(str(path))
    release_tensor_pages(info.data)
    assert _resident_kib(str(path)) <= resident - (info.data.nbytes // 4096 - 1) * 4
    assert np.array_equal(info.data, before)  # read back from the file


def test_memory_that_is_not_a_file_map_is_left_alone(tmp_path):
    ones = np.ones(1 << 16, dtype=np.uint8)
    release_tensor_pages(ones)
    assert ones.all()
    buffer = np.frombuffer(bytearray(b"\x07" * (1 << 16)), dtype=np.uint8)  # a writable buffer, not a map
    release_tensor_pages(buffer)
    assert (buffer == 7).all()
    gguf = GGUFFile(write_tiny_llama(tmp_path / "m.gguf"))
    info = next(iter(gguf.tensors.values()))
    copied = info.data.copy()  # the tensor's bytes, in anonymous memory
    release_tensor_pages(copied)
    assert np.array_equal(copied, info.data)


def test_loading_on_the_native_kernels_leaves_the_logits_as_they_were(tmp_path, monkeypatch):
    """The packer drops each tensor's pages as it goes (the load's peak); the logits are those
    of a load that keeps them, bit for bit (the embeddings, read from the raw blocks every step,
    come back from the file)."""
    import torch

    import lamplight
    from lamplight.models.batch import SequenceChunk
    from lamplight.native import linear

    path = write_tiny_llama(tmp_path / "m.gguf", n_embd=256)
    ids = [(5 * i + 3) % 200 + 5 for i in range(9)]

    def logits() -> torch.Tensor:
        runner = lamplight.load(str(path), backend="native").runner
        assert runner.backend == "native"
        state = runner.new_state(16, torch.float16)
        return runner.run([SequenceChunk(ids, 0, range(len(ids)), all_logits=True)], state)

    released = logits()
    monkeypatch.setattr(linear, "release_tensor_pages", lambda data: None)
    assert torch.equal(released, logits())
