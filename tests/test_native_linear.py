"""The native pieces the encoders use outside any model: their attention (src/encoder_attention.cpp)
and residual layer norm (src/layer_norm.cpp), PyTorch's to float32 rounding, the same bits on every
build and in any batch; one linear (lamplight.native.linear.NativeLinear, src/linear.cpp's lp_linear
on the pool's threads), the bits of the single-threaded matmul of tests/test_native_kernels.py plus
the bias, whatever rows come with a row, and a description the forward would refuse refused here
too; and ggml's fp16 GELU table looked up in one pass (src/table.cpp), the bits of the PyTorch
lookup on every build."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as Q

from test_native_kernels import bits, random_info

from lamplight.models.activations import GELU_IDENTITY_FROM, fp16_gelu_table, gelu_tanh_fp16_table
from lamplight.native import abi, build, runtime
from lamplight.native.elementwise import add_layer_norm, attend_full, fp16_lookup
from lamplight.native.kernels import QKernels
from lamplight.gguf.file import TensorInfo
from lamplight.gguf.quant import dequantize as dequantize_info
from lamplight.native import linear as native_linear
from lamplight.native.linear import NativeLinear
from lamplight.native.pack import pack

pytestmark = pytest.mark.skipif(runtime.library() is None, reason="no native library on this machine")


@pytest.fixture(scope="module")
def lib():
    library = runtime.library()
    library.lp_set_threads(2)
    return library


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_K, Q.Q4_1, Q.Q6_K], ids=lambda t: t.name)
def test_a_native_linear_gives_the_matmuls_bits_plus_its_bias(lib, qtype):
    infos = [random_info(qtype, 48, 256, seed=1), random_info(qtype, 80, 256, seed=2)]  # fused, as Q/K/V
    bias = torch.randn(128, generator=torch.Generator().manual_seed(3))
    linear = NativeLinear(lib, infos, bias)
    assert (linear.in_features, linear.out_features) == (256, 128)
    x = torch.randn(37, 256, generator=torch.Generator().manual_seed(4))
    y = linear(x)
    single = QKernels(build.library_path(runtime.variant_of(lib)))
    expected = torch.cat([single.matmul(pack(info), x) for info in infos], dim=1) + bias
    np.testing.assert_array_equal(bits(y.numpy()), bits(expected.numpy()))
    # every row alone, and in another batch: the same bits
    for r in (0, 17, 36):
        np.testing.assert_array_equal(bits(linear(x[r:r + 1]).numpy()), bits(y[r:r + 1].numpy()))
    np.testing.assert_array_equal(bits(linear(x[5:30]).numpy()), bits(y[5:30].numpy()))
    assert linear(x.reshape(37, 1, 256)).shape == (37, 1, 128)


def test_activations_quantized_for_what_each_linear_reads(lib):
    """A linear quantizes only the parts of each activation row its weights read (per 32 for
    Q8_0, per 256 for the k-quants, both when it mixes them): the single-threaded matmul's bits
    for each, whatever the previous call on this thread left in the shared buffer."""
    single = QKernels(build.library_path(runtime.variant_of(lib)))
    infos = {t: random_info(t, 32, 512, seed=11) for t in (Q.Q8_0, Q.Q4_K, Q.Q6_K)}
    mixed = NativeLinear(lib, [infos[Q.Q4_K], infos[Q.Q8_0]])  # two parts: one reads each
    for seed, linear, parts in [(1, NativeLinear(lib, [infos[Q.Q8_0]]), [Q.Q8_0]),
                                (2, NativeLinear(lib, [infos[Q.Q4_K]]), [Q.Q4_K]),
                                (3, mixed, [Q.Q4_K, Q.Q8_0]),
                                (4, NativeLinear(lib, [infos[Q.Q6_K]]), [Q.Q6_K]),
                                (5, NativeLinear(lib, [infos[Q.Q8_0]]), [Q.Q8_0])]:
        x = torch.randn(9, 512, generator=torch.Generator().manual_seed(seed))
        expected = torch.cat([single.matmul(pack(infos[t]), x) for t in parts], dim=1)
        np.testing.assert_array_equal(bits(linear(x).numpy()), bits(expected.numpy()))


def test_a_native_linear_refuses_what_the_kernels_do_not_take(lib):
    with pytest.raises(ValueError, match="do not read the same input"):
        NativeLinear(lib, [random_info(Q.Q8_0, 16, 256), random_info(Q.Q8_0, 16, 512)])
    linear = NativeLinear(lib, [random_info(Q.Q8_0, 16, 256)])
    linear.lin.n_out = 17  # a description whose parts do not add up: refused before any work
    y = torch.full((2, 17), 7.0)
    rc = lib.lp_linear(ctypes.byref(linear.lin), torch.zeros(2, 256).data_ptr(), 2, y.data_ptr())
    assert rc != abi.LP_OK and "outputs in its parts" in str(abi.error(lib, rc, "lp_linear"))
    assert bool((y == 7.0).all())


@pytest.mark.parametrize("variant", build.runnable_variants())
def test_the_native_gelu_lookup_gives_the_tables_bits(variant):
    lib = runtime.load_variant(variant)
    lib.lp_set_threads(2)
    special = [float("nan"), float("inf"), -float("inf"), 1e6, -1e6, 65519.0, 65520.0, -65520.0, 9.99, 10.0, -10.0,
               -9.99, 0.0, -0.0, 6e-8, 2.9e-8, 3.1e-8, -6e-5, 1.00048828125, 1.000244140625, 1.000732421875]
    rng = torch.Generator().manual_seed(5)
    flat = torch.cat([torch.tensor(special), torch.randn(40001, generator=rng) * 4,
                      torch.arange(0, 2**20, 7, dtype=torch.int32).view(torch.float32),  # subnormals, tiny values
                      torch.rand(5000, generator=rng) * 131000 - 65500])
    x = flat[: flat.numel() // 7 * 7].reshape(-1, 7)  # 2-D, and not a multiple of 8: the scalar tail too
    mine, theirs = fp16_lookup(lib, fp16_gelu_table(), x, GELU_IDENTITY_FROM), gelu_tanh_fp16_table(x, 1.0)
    assert mine.shape == x.shape
    nan = torch.isnan(theirs)
    assert torch.equal(torch.isnan(mine), nan)
    np.testing.assert_array_equal(bits(mine[~nan].numpy()), bits(theirs[~nan].numpy()))
    with pytest.raises(ValueError, match="65536"):
        fp16_lookup(lib, torch.zeros(10), x, GELU_IDENTITY_FROM)


def test_the_native_gelu_lookup_in_place(lib):
    x = torch.randn(33, 9, generator=torch.Generator().manual_seed(2)) * 6
    expected = gelu_tanh_fp16_table(x, 1.0)
    out = fp16_lookup(lib, fp16_gelu_table(), x, GELU_IDENTITY_FROM, in_place=True)
    assert out.data_ptr() == x.data_ptr() and torch.equal(out, expected)
    strided = torch.randn(9, 33).t()  # not contiguous: a copy is looked up, the input is left alone
    before = strided.clone()
    assert torch.equal(fp16_lookup(lib, fp16_gelu_table(), strided, GELU_IDENTITY_FROM, in_place=True),
                       gelu_tanh_fp16_table(before, 1.0)) and torch.equal(strided, before)


@pytest.mark.parametrize("variant", build.runnable_variants())
@pytest.mark.parametrize("qtype", [Q.F16, Q.BF16], ids=lambda t: t.name)
def test_half_precision_linears_give_the_float32_dots_bits_whatever_the_rows(variant, qtype, monkeypatch):
    """fp16/bf16 weights read as stored (AVX-512: up to six rows share each widened column, the
    rest of a batch in smaller tiles) give, row by row, the bits of the same weights widened to
    float32 beforehand (the one dot order of every build), whatever rows come with a row; a
    column count that is not a multiple of the 4-column tiles keeps its last columns too."""
    lib = runtime.load_variant(variant)
    lib.lp_set_threads(2)
    rng = np.random.default_rng(5)
    raw = (rng.standard_normal((71, 160)) * 0.05).astype(np.float16 if qtype == Q.F16 else np.float32)
    if qtype == Q.BF16:
        raw = (raw.view(np.uint32) >> 16).astype(np.uint16)
    info = TensorInfo(f"random {qtype.name}", qtype, (71, 160), raw.view(np.uint8).reshape(71, -1))
    bias = torch.randn(71, generator=torch.Generator().manual_seed(6))
    half = NativeLinear(lib, [info], bias)
    x = torch.randn(45, 160, generator=torch.Generator().manual_seed(7))
    y = half(x)
    monkeypatch.setattr(native_linear, "_DENSE_FORMATS", {})
    wide = NativeLinear(lib, [info], bias)
    assert wide.lin.parts[0].w.format == abi.DENSE_F32 and half.lin.parts[0].w.format != abi.DENSE_F32
    np.testing.assert_array_equal(bits(y.numpy()), bits(wide(x).numpy()))
    for rows in (slice(0, 1), slice(44, 45), slice(3, 10), slice(1, 25), slice(6, 45)):
        np.testing.assert_array_equal(bits(half(x[rows]).numpy()), bits(y[rows].numpy()))
    dequantized = torch.from_numpy(dequantize_info(info))
    torch.testing.assert_close(y, x @ dequantized.T + bias, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n,head_dim", [(37, 64), (13, 32), (1, 16)])
def test_the_encoders_attention_is_pytorchs_and_the_same_bits_everywhere(n, head_dim):
    """lp_attend_full (src/encoder_attention.cpp): every row of a sequence attends to all of it,
    as F.scaled_dot_product_attention computes (to float32 rounding); the same bits on every build,
    for a sequence alone or beside others, from row-strided views (a fused Q/K/V's columns)."""
    heads, n_seqs = 3, 4
    qkv = torch.randn(n_seqs * n, 3 * heads * head_dim, generator=torch.Generator().manual_seed(8))
    q, k, v = qkv.split(heads * head_dim, dim=1)
    scale = head_dim ** -0.5
    shape = (n_seqs, n, heads, head_dim)
    expected = F.scaled_dot_product_attention(*(t.reshape(shape).transpose(1, 2) for t in (q, k, v)))
    expected = expected.transpose(1, 2).reshape(n_seqs * n, heads * head_dim)
    results = []
    for variant in build.runnable_variants():
        lib = runtime.load_variant(variant)
        lib.lp_set_threads(2)
        together = attend_full(lib, q, k, v, n_seqs, heads, scale)
        torch.testing.assert_close(together, expected, rtol=1e-5, atol=1e-5)
        alone = attend_full(lib, q[n:2 * n], k[n:2 * n], v[n:2 * n], 1, heads, scale)
        np.testing.assert_array_equal(bits(alone.numpy()), bits(together[n:2 * n].numpy()))
        results.append(together)
    for other in results[1:]:
        np.testing.assert_array_equal(bits(other.numpy()), bits(results[0].numpy()))


def test_the_encoders_residual_layer_norm_is_pytorchs_and_the_same_bits_everywhere():
    """lp_add_layer_norm (src/layer_norm.cpp): LayerNorm(x + residual) * weight + bias as PyTorch
    computes it (to float32 rounding), with or without a residual and a bias, into x's own rows;
    the same bits on every build and for a row alone."""
    g = torch.Generator().manual_seed(9)
    x, residual = torch.randn(13, 200, generator=g) * 3, torch.randn(13, 200, generator=g)
    weight, bias = torch.randn(200, generator=g), torch.randn(200, generator=g)
    expected = F.layer_norm(x + residual, (200,), weight, bias, 1e-12)
    results = []
    for variant in build.runnable_variants():
        lib = runtime.load_variant(variant)
        lib.lp_set_threads(2)
        together = add_layer_norm(lib, x, residual, weight, bias, 1e-12)
        torch.testing.assert_close(together, expected, rtol=1e-5, atol=1e-5)
        alone = add_layer_norm(lib, x[5:6].clone(), residual[5:6].clone(), weight, bias, 1e-12)
        np.testing.assert_array_equal(bits(alone.numpy()), bits(together[5:6].numpy()))
        in_place = x.clone()
        assert add_layer_norm(lib, in_place, residual, weight, bias, 1e-12, out=in_place) is in_place
        np.testing.assert_array_equal(bits(in_place.numpy()), bits(together.numpy()))
        plain = add_layer_norm(lib, x, None, weight, None, 1e-5)
        torch.testing.assert_close(plain, F.layer_norm(x, (200,), weight, None, 1e-5), rtol=1e-5, atol=1e-5)
        results.append(together)
    for other in results[1:]:
        np.testing.assert_array_equal(bits(other.numpy()), bits(results[0].numpy()))
    with pytest.raises(ValueError, match="do not match"):
        add_layer_norm(lib, x, residual[:3], weight, bias, 1e-12)


def test_the_encoders_attention_refuses_what_it_cannot_compute(lib):
    x = torch.zeros(8, 2 * 24)
    with pytest.raises(ValueError, match="multiple of 16"):
        attend_full(lib, x, x, x, 2, 2, 0.2)  # heads of 24 values
    with pytest.raises(ValueError, match="not 3 sequences"):
        attend_full(lib, x, x, x, 3, 2, 0.2)
