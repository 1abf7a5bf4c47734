"""The native low-bit matmul (lamplight/native/src/qmatmul.cpp) and its packing (lamplight/native/pack.py).

Packing is exact (bit for bit against gguf's dequantization); y[r, c] depends only on row r and
column c (any row count, row position or column split gives the same bits); every instruction
set build gives the same bits; and the error of the 8-bit activations is that of llama.cpp's.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q

from lamplight.gguf.file import GGUFFile, TensorInfo
from lamplight.gguf.quant import dequantize
from lamplight.native import build
from lamplight.native.pack import (FLAG_SUPER, FLAGS_OFFSET, FORMAT_OF, SUPPORTED, W4, W6, W8, W8_32, can_pack,
                                   dequantize_packed, pack, pack_rows)

pytestmark = pytest.mark.skipif(build.compiler() is None, reason="no C++ compiler")

# Byte offsets of each type's fp16 scales inside a block (set to sane values in random blocks).
FP16_OFFSETS = {
    Q.Q4_0: (0,), Q.Q4_1: (0, 2), Q.Q5_0: (0,), Q.Q5_1: (0, 2), Q.Q8_0: (0,),
    Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,), Q.Q2_K: (80, 82), Q.Q3_K: (108,),
    Q.MXFP4: (),  # its scale is one E8M0 byte (see random_info)
}
# One type per packed format and flag combination.
FORMAT_CASES = (Q.Q4_0, Q.Q4_1, Q.Q4_K, Q.Q8_0, Q.Q5_1, Q.Q6_K, Q.Q2_K, Q.MXFP4)


def random_info(qtype, n: int, k: int, seed: int = 0) -> TensorInfo:
    """Random GGUF blocks: random bytes, with fp16 scales of either sign around 0.01."""
    rng = np.random.default_rng(seed)
    block, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(n, k // block * size), dtype=np.uint8)
    blocks = raw.reshape(-1, size)
    for offset in FP16_OFFSETS[qtype]:
        scales = (rng.standard_normal(blocks.shape[0]) * 0.01).astype(np.float16)
        blocks[:, offset:offset + 2] = scales.view(np.uint8).reshape(-1, 2)
    if qtype == Q.MXFP4:  # scales 2^(e - 128) around 2^-4, as trained experts have
        blocks[:, 0] = rng.integers(118, 130, size=blocks.shape[0])
    return TensorInfo(f"random {qtype.name}", qtype, (n, k), raw)


@pytest.fixture(scope="module")
def kernels():
    from lamplight.native.kernels import QKernels

    return {variant: QKernels.load(variant) for variant in build.runnable_variants()}


def bits(t) -> np.ndarray:
    return np.asarray(t).view(np.uint32)


# -- packing -------------------------------------------------------------------------------------

def test_every_supported_type_has_a_format():
    assert SUPPORTED == set(FP16_OFFSETS)
    assert all(can_pack(t) for t in SUPPORTED) and not can_pack(Q.F32)


@pytest.mark.parametrize("qtype", sorted(SUPPORTED, key=lambda t: t.name), ids=lambda t: t.name)
def test_pack_is_exact_on_random_blocks(qtype):
    info = random_info(qtype, 37, 512)  # 37 columns: a padded last group
    packed = pack(info)
    assert packed.format == FORMAT_OF[qtype] and packed.data.ctypes.data % 64 == 0
    np.testing.assert_array_equal(bits(dequantize_packed(packed)), bits(dequantize(info)))


@pytest.mark.parametrize("model, names", [
    ("smollm2_path", ("blk.0.attn_q.weight", "blk.3.ffn_down.weight", "token_embd.weight")),
    ("gemma3_path", ("blk.0.attn_q.weight", "blk.0.attn_output.weight", "blk.0.ffn_down.weight",
                     "blk.0.attn_v.weight", "blk.1.attn_v.weight")),
])
def test_pack_is_exact_on_real_weights(model, names, request):
    gguf = GGUFFile(request.getfixturevalue(model))
    for name in names:
        info = gguf.tensors[name]
        np.testing.assert_array_equal(bits(dequantize_packed(pack(info))), bits(dequantize(info)), err_msg=name)


def test_pack_rows_concatenates_along_n():
    q5_0, q8_0, q6_k = (random_info(t, n, 512, seed) for seed, (t, n) in enumerate([(Q.Q5_0, 40), (Q.Q8_0, 24), (Q.Q6_K, 16)]))
    same = pack_rows([q5_0, q8_0])
    assert same.format == W8_32 and same.n == 64
    mixed = pack_rows([q5_0, q8_0, q6_k])  # 32-blocks join 16-blocks exactly
    assert mixed.format == W8 and mixed.n == 80
    reference = np.concatenate([dequantize(i) for i in (q5_0, q8_0, q6_k)])
    np.testing.assert_array_equal(bits(dequantize_packed(mixed)), bits(reference))
    np.testing.assert_array_equal(bits(dequantize_packed(same)), bits(reference[:64]))


K_QUANTS = (Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.Q3_K, Q.Q2_K)


def flags_of(packed) -> int:
    return int(packed.data[FLAGS_OFFSET:FLAGS_OFFSET + 4].view(np.int32)[0])


def _acts_per(x: torch.Tensor, block: int) -> np.ndarray:
    """x as the kernels' 8-bit activations see it, in float64: per block of `block` values,
    round-half-even(x * (127 / amax)) times amax / 127."""
    v = x.numpy().reshape(x.shape[0], -1, block)
    amax = np.abs(v).max(-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.rint(v * np.where(amax > 0, np.float32(127) / amax, 0))
    return (q * (amax / np.float32(127)).astype(np.float64)).reshape(x.shape)


@pytest.mark.parametrize("qtype", K_QUANTS, ids=lambda t: t.name)
def test_k_quants_keep_their_own_scales_and_activations_per_256(kernels, qtype):
    """FLAG_SUPER: a k-quant's block scales stay int8 factors of a float32 d per 256 k, as gguf
    has them (Q4_K 4.75 bits a weight, not 6), the same weights as float32 scales give. Its
    activations have one scale per 256 k (as llama.cpp's Q8_K for these types), so each block's
    exact sum times its factor adds up in integers; the float layout keeps blocks of 32."""
    info = random_info(qtype, 37, 768, seed=6)
    compact, floats = pack(info), pack(info, super_scales=False)
    assert flags_of(compact) & FLAG_SUPER and not flags_of(floats) & FLAG_SUPER
    assert compact.data.nbytes < floats.data.nbytes
    np.testing.assert_array_equal(bits(dequantize_packed(compact)), bits(dequantize_packed(floats)))
    w = dequantize_packed(compact).astype(np.float64)
    x = torch.randn(11, 768)
    for variant, k in kernels.items():
        for packed, block in ((compact, 256), (floats, 32)):
            expected = _acts_per(x, block) @ w.T
            other = _acts_per(x, 288 - block) @ w.T  # the other layout's activations
            y = k.matmul(packed, x).double().numpy()
            err = np.linalg.norm(y - expected) / np.linalg.norm(expected)
            assert err < 1e-6 < np.linalg.norm(y - other) / np.linalg.norm(expected), (variant, block, err)


@pytest.mark.parametrize("qtype, most_bits, gguf_bits", [(Q.Q4_K, 4.63, 4.5), (Q.Q6_K, 6.63, 6.5625)],
                         ids=lambda v: getattr(v, "name", str(v)))
def test_k_quants_pack_near_their_own_size(qtype, most_bits, gguf_bits):
    """Bits a weight the kernels read: Q4_K 4.625 (gguf 4.5), Q6_K as LP_W6 6.625 (gguf 6.5625);
    with float32 scales 6 and 8."""
    info = random_info(qtype, 64, 2048)
    bits_per_weight = [p.data.nbytes * 8 / (64 * 2048) for p in (pack(info), pack(info, super_scales=False))]
    assert gguf_bits < bits_per_weight[0] < most_bits < bits_per_weight[1]
    assert pack(info).format == FORMAT_OF[qtype] == (W4 if qtype == Q.Q4_K else W6)


def test_pack_rows_keeps_super_scales_only_when_every_part_has_them():
    q4_k, q6_k, q5_k, q8_0 = (random_info(t, 16 * (i + 1), 512, i) for i, t in enumerate([Q.Q4_K, Q.Q6_K, Q.Q5_K, Q.Q8_0]))
    assert flags_of(pack_rows([q4_k, q4_k])) & FLAG_SUPER
    mixed_blocks = pack_rows([q6_k, q5_k])  # Q5_K's 32-blocks as 16-blocks beside Q6_K's, both with factors
    assert mixed_blocks.format == W8 and flags_of(mixed_blocks) & FLAG_SUPER
    with_q8_0 = pack_rows([q6_k, q8_0])
    assert not flags_of(with_q8_0) & FLAG_SUPER
    for packed, parts in ((mixed_blocks, (q6_k, q5_k)), (with_q8_0, (q6_k, q8_0))):
        # Equal values; Q6_K's zero weights may turn +0 beside Q5_K's mins (d q + 0).
        np.testing.assert_array_equal(dequantize_packed(packed), np.concatenate([dequantize(i) for i in parts]))


def test_pack_rows_joins_q4_0_with_mins_and_refuses_4_with_8_bits():
    q4_0, q4_1 = random_info(Q.Q4_0, 16, 256, 1), random_info(Q.Q4_1, 20, 256, 2)
    joined = pack_rows([q4_0, q4_1])
    assert joined.format == W4
    # Equal values; a zero weight may change sign (d q - 8 d instead of d (q - 8)).
    np.testing.assert_array_equal(dequantize_packed(joined), np.concatenate([dequantize(q4_0), dequantize(q4_1)]))
    with pytest.raises(ValueError):
        pack_rows([q4_1, random_info(Q.Q8_0, 16, 256)])


# -- the kernels ---------------------------------------------------------------------------------

def test_builds_report_their_isa(kernels):
    for variant, k in kernels.items():
        assert k.isa == variant
        assert k.row_bytes(576) % 64 == 0
        assert all(k.col_align(fmt) == 16 for fmt in (W4, W8, W8_32, W6))


def test_activation_quantization_definition(kernels):
    """q = round-half-even(x * (127 / amax)) per block of 32, d = amax / 127, on every build."""
    x = torch.randn(3, 128) * torch.tensor([[0.1], [3.0], [50.0]])
    x[0, :32] = torch.arange(32) / 2 - 8  # ties: x * 127 / amax lands on halves
    x[1, 32:64] = 0  # an all-zero block
    amax = x.reshape(3, 4, 32).abs().amax(-1, keepdim=True).numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        expected = np.rint(x.reshape(3, 4, 32).numpy() * np.where(amax > 0, np.float32(127) / amax, 0)).astype(np.int8)
    for variant, k in kernels.items():
        acts = k.quantize(x).numpy()
        np.testing.assert_array_equal(acts[:, :128].view(np.int8), expected.reshape(3, 128), err_msg=variant)
        np.testing.assert_array_equal(acts[:, 256:256 + 16].view(np.float32), (amax / np.float32(127)).reshape(3, 4))


@pytest.mark.parametrize("qtype", FORMAT_CASES, ids=lambda t: t.name)
def test_results_are_batch_invariant(kernels, qtype):
    """y[r, c] is the same bits for any row count, row position and column range."""
    info = random_info(qtype, 70, 512)  # 5 groups of 16, the last one partial
    packed = pack(info)
    x = torch.randn(41, 512)
    for variant, k in kernels.items():
        acts = k.quantize(x)
        full = k.matmul_acts(packed, acts)
        for rows in range(1, 41):
            start = (7 * rows) % (42 - rows)
            part = k.matmul_acts(packed, acts[start:start + rows])
            assert torch.equal(part.view(torch.int32), full[start:start + rows].view(torch.int32)), (variant, rows)
        split = torch.full_like(full, float("nan"))
        for begin, end in ((0, 16), (16, 48), (48, 64), (64, 70)):
            k.matmul_acts(packed, acts, split, begin, end)
        assert torch.equal(split.view(torch.int32), full.view(torch.int32)), variant
        untouched = torch.full_like(full, 7.0)
        k.matmul_acts(packed, acts, untouched, 16, 32)
        assert (untouched[:, :16] == 7).all() and (untouched[:, 32:] == 7).all()


@pytest.mark.parametrize("qtype", FORMAT_CASES, ids=lambda t: t.name)
def test_one_row_reads_side_by_side_give_the_same_bits(kernels, qtype):
    """A decode row read 4 groups of columns at a time (lp_set_one_row_streams) at any prefetch
    distance gives the bits of one group at a time, on every build, over column ranges whose
    groups divide by 4 or not, the partial last group included."""
    packed = pack(random_info(qtype, 16 * 13 + 5, 512, seed=5))  # 13 whole groups and a partial one
    x = torch.randn(3, 512)
    generic = kernels["generic"].matmul(packed, x)
    for variant, k in kernels.items():
        acts = k.quantize(x)
        for streams in (1, 4):
            for distance in (0, 2048):
                k.lib.lp_set_one_row_streams(streams)
                k.lib.lp_set_one_row_prefetch(distance)
                for r in range(3):
                    for begin, end in ((0, 213), (16, 208), (48, 213), (32, 96)):
                        y = torch.full((1, 213), float("nan"))
                        k.matmul_acts(packed, acts[r:r + 1], y, begin, end)
                        assert torch.equal(y[0, begin:end].view(torch.int32), generic[r, begin:end].view(torch.int32)), (
                            variant, streams, distance, r, begin)
                        assert y[0, :begin].isnan().all() and y[0, end:].isnan().all()
        k.lib.lp_set_one_row_streams(1)
        k.lib.lp_set_one_row_prefetch(0)


def test_side_by_side_reads_are_kept_only_where_the_build_has_them(kernels):
    """lp_set_one_row_streams keeps 4 for 4 or more on AVX-512 builds, 1 for anything else and on
    every other build, and returns the setting before."""
    for variant, k in kernels.items():
        most = 4 if variant == "avx512vnni" else 1
        k.lib.lp_set_one_row_streams(1)
        for asked, kept in ((4, most), (9, most), (3, 1), (2, 1), (0, 1), (-4, 1)):
            k.lib.lp_set_one_row_streams(asked)
            assert k.lib.lp_set_one_row_streams(1) == kept, (variant, asked)


def test_bad_shapes_and_column_ranges_are_refused(kernels):
    """The wrapper checks the arrays' shapes (the C side sees no lengths) and lp_qmatmul the
    column range: a ValueError, never a stray read or write."""
    packed = pack(random_info(Q.Q4_0, 40, 64))
    for variant, k in kernels.items():
        acts = k.quantize(torch.randn(3, 64))
        with pytest.raises(ValueError, match=f"rows of {k.row_bytes(64)} bytes"):
            k.matmul_acts(packed, acts[:, :32])
        with pytest.raises(ValueError, match="at least 3 x 40 float32"):
            k.matmul_acts(packed, acts, torch.zeros(2, 40))
        with pytest.raises(ValueError, match="lp_qmatmul: a column range off the groups"):
            k.matmul_acts(packed, acts, None, 8, 40)
        with pytest.raises(ValueError, match="a multiple of 32"):
            k.quantize(torch.randn(3, 48))
        assert k.matmul_acts(packed, acts).shape == (3, 40), variant


@pytest.mark.parametrize("qtype", (Q.Q4_1, Q.Q4_K, Q.Q6_K), ids=lambda t: t.name)
def test_many_rows_match_single_rows(kernels, qtype):
    """Prompt-sized batches (several row blocks of activations, on every build) give each row's
    bits: the block formats and the k-quants, whose rows qmatmul views per row block (the
    AVX-512 build's Q4_K and Q6_K in tiles of 16 rows, tile_super_pair, and of up to 8)."""
    packed = pack(random_info(qtype, 48, 1536, seed=4))
    x = torch.randn(150, 1536)
    for variant, k in kernels.items():
        full = k.matmul(packed, x)
        for r in (0, 63, 64, 65, 127, 128, 149):
            assert torch.equal(k.matmul(packed, x[r:r + 1]).view(torch.int32), full[r:r + 1].view(torch.int32)), (variant, r)


@pytest.mark.parametrize("qtype", FORMAT_CASES + (Q.Q5_0, Q.Q3_K, Q.Q5_K), ids=lambda t: t.name)
def test_builds_agree_bit_for_bit(kernels, qtype):
    info = random_info(qtype, 48, 768, seed=3)
    packed = pack(info)
    x = torch.randn(9, 768) * torch.logspace(-3, 3, 9)[:, None]
    x[0, :64] = 0
    x[1, 5] = 1e-32  # a block below the smallest scale counts as zero
    results = {variant: (k.quantize(x), k.matmul(packed, x)) for variant, k in kernels.items()}
    acts, y = results["generic"]
    for variant, (acts_v, y_v) in results.items():
        assert torch.equal(acts_v, acts), variant
        assert torch.equal(y_v.view(torch.int32), y.view(torch.int32)), variant


def _extreme_info(qtype, n: int, k: int) -> TensorInfo:
    """Blocks whose every quant is at the end of its range that gives the largest integer sums
    (Q4_K nibbles 15, Q5_K 31, Q6_K -32), with the largest factors."""
    block, size = GGML_QUANT_SIZES[qtype]
    blocks = np.full((n * k // block, size), 0xFF, dtype=np.uint8)
    if qtype == Q.Q6_K:
        blocks[:, :192] = 0  # ql and qh 0: q = -32
        blocks[:, 192:208] = np.array([127, 128] * 8, dtype=np.uint8)  # factors 127 and -128
    for offset in FP16_OFFSETS[qtype]:
        blocks[:, offset:offset + 2] = np.array([0.01], dtype=np.float16).view(np.uint8)
    return TensorInfo(f"extreme {qtype.name}", qtype, (n, k), blocks.reshape(n, -1))


@pytest.mark.parametrize("qtype", (Q.Q4_K, Q.Q5_K, Q.Q6_K), ids=lambda t: t.name)
def test_k_quant_sums_are_exact_at_the_ends_of_their_ranges(kernels, qtype):
    """The AVX-512 tiles multiply each half-block's integer sum by its factor as an int16
    (vpdpwssd): activations all +-127 against weights at their extreme give the largest sums a
    half can hold (Q4_K 16 * 15 * 127, Q6_K 8 * 32 * 127), which must stay exact. Q5_K, packed as
    8-bit weights (pack.FORMAT_OF), keeps the int32 product and is here as the path without halves.
    20 rows: a tile of 16 (tile_super_pair), then one of 4."""
    packed = pack(_extreme_info(qtype, 32, 512))
    w = dequantize_packed(packed).astype(np.float64)
    x = torch.ones(4, 512)
    x[1] = -1
    x[2, ::2] = -1
    x[3] = torch.randn(512)
    x = x.repeat(5, 1)
    expected = _acts_per(x, 256) @ w.T
    for variant, k in kernels.items():
        y = k.matmul(packed, x).double().numpy()
        err = np.abs(y - expected).max() / np.abs(expected).max()
        assert err < 1e-6, (variant, err)


def test_non_finite_activations_give_nan(kernels):
    packed = pack(random_info(Q.Q8_0, 16, 64))
    x = torch.ones(2, 64)
    x[0, 3], x[1, 40] = float("nan"), float("inf")
    for variant, k in kernels.items():
        assert k.matmul(packed, x).isnan().all(), variant


def _llama_cpp_reference(x: torch.Tensor, w: np.ndarray, qtype) -> torch.Tensor:
    """x through llama.cpp's 8-bit activations for the type (Q8_K, one scale per 256, for the
    k-quants; gguf's Q8_0 otherwise), then an exact matmul."""
    from gguf.quants import dequantize as gguf_dequantize, quantize as gguf_quantize

    if qtype in K_QUANTS:  # quantize_row_q8_K: iscale = -127 / (the value of largest |x|)
        v = x.numpy().reshape(x.shape[0], -1, 256)
        peak = np.take_along_axis(v, np.abs(v).argmax(-1)[..., None], -1)
        with np.errstate(divide="ignore"):
            iscale = np.where(peak != 0, np.float32(-127) / peak, 0).astype(np.float32)
        q = np.minimum(np.rint(iscale * v), 127)
        xq = (q * np.where(iscale != 0, 1 / iscale, 0)).reshape(x.shape)
    else:
        xq = gguf_dequantize(gguf_quantize(x.numpy(), Q.Q8_0), Q.Q8_0)
    return torch.from_numpy(xq).double() @ torch.from_numpy(w).double().T


@pytest.mark.parametrize("qtype", FORMAT_CASES, ids=lambda t: t.name)
def test_accuracy_matches_llama_cpp(kernels, qtype):
    info = random_info(qtype, 256, 1024, seed=5)
    w = dequantize_packed(pack(info))
    x = torch.randn(16, 1024)
    exact = x.double() @ torch.from_numpy(w).double().T
    ours = next(iter(kernels.values())).matmul(pack(info), x).double()
    ours_err = ((ours - exact).norm() / exact.norm()).item()
    llama_err = ((_llama_cpp_reference(x, w, qtype) - exact).norm() / exact.norm()).item()
    assert ours_err < 1e-2 and ours_err < 1.05 * llama_err, (ours_err, llama_err)


def test_real_layer_accuracy(kernels, smollm2_path):
    gguf = GGUFFile(smollm2_path)
    infos = [gguf.tensors[f"blk.2.{name}.weight"] for name in ("ffn_gate", "ffn_up")]
    packed = pack_rows(infos)
    w = torch.from_numpy(np.concatenate([dequantize(i) for i in infos]))
    x = torch.randn(8, 576)
    exact = x.double() @ w.double().T
    for variant, k in kernels.items():
        err = ((k.matmul(packed, x).double() - exact).norm() / exact.norm()).item()
        assert err < 1e-2, (variant, err)
