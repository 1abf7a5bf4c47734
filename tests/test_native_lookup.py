"""The native embedding lookup (src/dequant.cpp via lamplight.native.lookup): rows of every GGUF
type it handles are gguf's dequantizer's bits, on every build; other types fall back to gguf's;
ids outside the table are refused."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES as Q_SIZES, GGMLQuantizationType as Q

from test_native_kernels import bits, random_info

from lamplight.gguf.file import TensorInfo
from lamplight.gguf.quant import dequantize_rows
from lamplight.native import build, runtime
from lamplight.native.lookup import embedding_rows

pytestmark = pytest.mark.skipif(runtime.library() is None, reason="no native library on this machine")

NATIVE_TYPES = (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K)


def float_info(qtype, n: int, k: int, seed: int) -> TensorInfo:
    """F32, F16 or BF16 rows of random values, with some infinities and NaNs among them."""
    rng = np.random.default_rng(seed)
    values = rng.standard_normal((n, k)).astype(np.float32) * 3
    values.flat[::97] = np.inf
    values.flat[5::101] = np.nan
    if qtype == Q.F32:
        raw = values.view(np.uint8)
    elif qtype == Q.F16:
        raw = values.astype(np.float16).view(np.uint8)
    else:  # bf16: the top half of each float32
        raw = (values.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    return TensorInfo(f"random {qtype.name}", qtype, (n, k), np.ascontiguousarray(raw).reshape(n, -1))


@pytest.fixture(scope="module", params=build.runnable_variants())
def lib(request):
    return runtime.load_variant(request.param)


@pytest.mark.parametrize("qtype", NATIVE_TYPES + (Q.F32, Q.F16, Q.BF16), ids=lambda t: t.name)
def test_rows_are_ggufs_bits(lib, qtype):
    floats = qtype in (Q.F32, Q.F16, Q.BF16)
    info = float_info(qtype, 50, 512, seed=3) if floats else random_info(qtype, 50, 512, seed=3)
    # repeated ids, the first and last rows, and enough rows for the pool's tasks (64 and more)
    ids = np.concatenate([[0, 49, 7, 7], np.random.default_rng(4).integers(0, 50, 90)])
    expected = dequantize_rows(info, ids)
    got = embedding_rows(lib, info, ids)
    assert got.shape == expected.shape == (ids.size, 512) and got.dtype == np.float32
    nan = np.isnan(expected)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(bits(np.where(nan, 0, got)), bits(np.where(nan, 0, expected)))
    assert embedding_rows(lib, info, np.array([], dtype=np.int64)).shape == (0, 512)


def test_random_scale_bits_too(lib):
    """Raw random bytes everywhere, scales included (subnormal, huge and negative fp16 scales, the
    6-bit scales' high bits): still gguf's bits."""
    rng = np.random.default_rng(9)
    for qtype in NATIVE_TYPES:
        block, size = Q_SIZES[qtype]
        raw = rng.integers(0, 256, size=(20, 4 * size), dtype=np.uint8)
        info = TensorInfo("raw", qtype, (20, 4 * block), raw)
        ids = np.arange(20)
        with np.errstate(all="ignore"):  # inf * 0 and the like, on purpose
            expected = dequantize_rows(info, ids)
        got = embedding_rows(lib, info, ids)
        nan = np.isnan(expected)
        np.testing.assert_array_equal(np.isnan(got), nan, err_msg=qtype.name)
        np.testing.assert_array_equal(bits(np.where(nan, 0, got)), bits(np.where(nan, 0, expected)), err_msg=qtype.name)


def test_other_types_fall_back_to_gguf(lib):
    for qtype in (Q.Q2_K, Q.Q3_K, Q.MXFP4):
        info = random_info(qtype, 6, 256, seed=5)
        ids = np.array([5, 0, 3])
        np.testing.assert_array_equal(bits(embedding_rows(lib, info, ids)), bits(dequantize_rows(info, ids)))


@pytest.mark.parametrize("bad", [-1, 12, 1 << 40])
def test_an_id_outside_the_table_is_refused(lib, bad):
    info = random_info(Q.Q8_0, 12, 64, seed=6)
    with pytest.raises(ValueError, match=f"id {bad} "):
        embedding_rows(lib, info, np.array([0, bad]))


def test_a_row_size_that_does_not_match_the_type_is_refused(lib):
    info = random_info(Q.Q8_0, 4, 64, seed=7)
    rc = lib.lp_dequantize_rows(int(Q.Q8_0), info.data.ctypes.data, 4, 60, 64, np.zeros(1, np.int64).ctypes.data, 1,
                                np.empty(64, np.float32).ctypes.data)
    assert rc != 0

