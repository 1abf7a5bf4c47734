"""The C boundary of the native kernels (lamplight/native/abi.py, src/boundary.h, src/abi.cpp):
the ctypes declarations are checked against the library's own layout when it is loaded (a
mismatch is named, and lamplight falls back to PyTorch's kernels), and no C++ exception crosses
into Python: one thrown on any pool thread comes back as an error code and a message.
(The forward's checks of each step's arrays are tested in test_native_forward.py.)"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from lamplight.native import abi, build, runtime

pytestmark = pytest.mark.skipif(build.compiler() is None, reason="no C++ compiler")


@pytest.fixture(scope="module", params=build.runnable_variants())
def lib(request):
    return runtime.load_variant(request.param)


def _copy(struct: type[ctypes.Structure], fields: list) -> type[ctypes.Structure]:
    return type(struct.__name__, (ctypes.Structure,), {"_fields_": fields})


def _with_batch(fields: list) -> abi.Layout:
    """The declared layout, with LpBatch declared as `fields`."""
    return abi.python_layout({**abi.STRUCTS, "LpBatch": _copy(abi.Batch, fields)})


def test_every_build_matches_the_declarations(lib):
    assert abi.layout_mismatches(abi.library_layout(lib), abi.python_layout()) == []
    abi.check_layout(lib)
    names = set(abi.library_layout(lib))
    assert {"LpBatch.n_key_slots", "LpKV.n_layers", "LpLinear.parts", "LP_MAX_LORA_RANK", "LP_ERR_LOGIT_ROW"} <= names
    assert set(abi.STRUCTS) <= names


def test_a_missing_field_is_named(lib):
    fields = [f for f in abi.Batch._fields_ if f[0] != "n_key_slots"]
    with pytest.raises(abi.LayoutMismatch) as info:
        abi.check_layout(lib, _with_batch(fields))
    first_line = str(info.value).splitlines()[0]
    assert "LpBatch field n_key_slots (offset 8, size 8) is in the library, not declared in abi.py" in first_line
    assert "more below" in first_line  # the fields after it moved too, and the struct's size


def test_reordered_fields_and_a_wrong_type_are_named(lib):
    fields = list(abi.Batch._fields_)
    fields[0], fields[1] = fields[1], fields[0]
    problems = abi.layout_mismatches(abi.library_layout(lib), _with_batch(fields))
    assert problems == ["LpBatch field n_rows: offset 0, size 4 in the library, offset 4, size 4 in abi.py",
                        "LpBatch field n_logits: offset 4, size 4 in the library, offset 0, size 4 in abi.py"]
    # A narrower type whose change alignment hides from every offset and the struct's size: the
    # field's own size names it.
    fields = [(name, ctypes.c_int16 if name == "n_lora_scales" else kind) for name, kind in abi.Batch._fields_]
    problems = abi.layout_mismatches(abi.library_layout(lib), _with_batch(fields))
    assert problems == ["LpBatch field n_lora_scales: offset 16, size 4 in the library, offset 16, size 2 in abi.py"]


def test_extra_fields_structs_and_constants_are_named(lib):
    fields = [*abi.Batch._fields_, ("extra", ctypes.c_int64)]
    end = ctypes.sizeof(abi.Batch)
    assert f"LpBatch field extra (offset {end}, size 8) is declared in abi.py, not in the library" in \
        abi.layout_mismatches(abi.library_layout(lib), _with_batch(fields))
    constants = {**abi.constants(), "LP_KV_F16": 5, "LP_NEW": 1}
    problems = abi.layout_mismatches(abi.library_layout(lib), abi.python_layout(consts=constants))
    assert problems == ["constant LP_KV_F16: value 1 in the library, value 5 in abi.py",
                        "constant LP_NEW (value 1) is declared in abi.py, not in the library"]
    structs = {name: s for name, s in abi.STRUCTS.items() if name != "LpExperts"}
    problems = abi.layout_mismatches(abi.library_layout(lib), abi.python_layout(structs))
    assert problems[0] == "LpExperts field n_expert (offset 0, size 4) is in the library, not declared in abi.py"
    assert problems[-1] == f"struct LpExperts (size {ctypes.sizeof(abi.Experts)}) is in the library, not declared in abi.py"


def test_a_mismatched_library_is_refused_for_pytorchs_kernels(monkeypatch):
    """A library whose layout differs is never used: library() says why and returns None."""
    bad = _copy(abi.Batch, [f for f in abi.Batch._fields_ if f[0] != "n_lora_scales"])
    monkeypatch.setenv("LAMPLIGHT_NATIVE", "auto")
    monkeypatch.setattr(abi, "STRUCTS", {**abi.STRUCTS, "LpBatch": bad})
    monkeypatch.setattr(runtime, "_loaded", {})  # load it afresh, as a new process would
    runtime.reset_for_tests()
    try:
        assert runtime.library() is None
        reason = runtime.unavailable_reason()
        assert "does not match lamplight/native/abi.py" in reason and "LpBatch field n_lora_scales" in reason
    finally:
        runtime.reset_for_tests()


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("kind, code, message", [
    (0, abi.LP_ERR_NO_MEMORY, "out of memory"),
    (1, abi.LP_ERR_INTERNAL, "selftest task"),
    (2, abi.LP_ERR_INTERNAL, "unknown C++ exception"),
])
def test_exceptions_on_pool_threads_come_back_as_codes(lib, threads, kind, code, message):
    """Tasks throwing on the workers and on the calling thread: the process lives on, the call
    returns the code, and the pool runs the next phases as before."""
    before = lib.lp_get_threads()
    assert lib.lp_set_threads(threads) == abi.LP_OK
    try:
        for _ in range(3):
            assert lib.lp_selftest_throw(64, kind) == code
            assert abi.last_error(lib)[0] == code and message in abi.last_error(lib)[1]
            assert lib.lp_selftest_throw(1, kind) == abi.LP_OK  # task 0 only: nothing thrown
    finally:
        lib.lp_set_threads(before)
    assert str(abi.error(lib, code)).startswith("native forward: ")
    assert isinstance(abi.error(lib, abi.LP_ERR_NO_MEMORY), MemoryError)


def test_qmatmul_refuses_bad_arguments(lib):
    """lp_qmatmul (the tests' and benchmarks' entry point) checks what it can see: the weight's
    format and k, the column range; QKernels checks the array shapes it cannot."""
    from lamplight.native.kernels import QKernels

    k = QKernels.load(runtime.variant_of(lib))
    data = np.zeros(4096, dtype=np.uint8)
    acts = np.zeros(k.row_bytes(64), dtype=np.uint8)
    out = np.zeros(32, dtype=np.float32)
    for weight, begin, end, what in [
        (abi.QWeight(9, 32, 64, 0, data.ctypes.data), 0, 32, "an unknown format"),
        (abi.QWeight(1, 32, 48, 0, data.ctypes.data), 0, 32, "k must be a positive multiple of 32"),
        (abi.QWeight(1, 32, 64, 0, data.ctypes.data), 8, 32, "off the groups"),
        (abi.QWeight(1, 32, 64, 0, data.ctypes.data), 48, 64, "outside [0, n)"),
        (abi.QWeight(1, 32, 64, 0, None), 0, 32, "a null weight"),
    ]:
        rc = k.lib.lp_qmatmul(ctypes.byref(weight), acts.ctypes.data, 1, out.ctypes.data, 32, begin, end)
        assert rc == abi.LP_ERR_ARGUMENT and what in abi.last_error(k.lib)[1]
