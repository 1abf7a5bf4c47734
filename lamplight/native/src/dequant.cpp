// GGUF rows to float32 (dequant.h). Each format is written as ggml lays out its blocks and with
// the float operations of gguf's numpy dequantizer, one rounding each and none fused (the build
// has -ffp-contract=off): scale * q, (d * sc) * q - dmin * m, d * q + m, so the rows are the
// bits the Python path gave.
#include "dequant.h"

#include <algorithm>
#include <cstring>

#include "boundary.h"
#include "half.h"
#include "pool.h"

namespace {

// GGML's type numbers (ggml.h's enum ggml_type, as the GGUF file stores them).
enum GgmlType : int32_t {
    kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8,
    kQ4_K = 12, kQ5_K = 13, kQ6_K = 14, kBF16 = 30
};

struct Format {
    int block;       // values a block holds
    int block_bytes;
    void (*block_fn)(const uint8_t* in, float* out);
};

float f16_at(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return lp::half_to_float(h);
}

void f32_block(const uint8_t* in, float* out) { std::memcpy(out, in, 4); }
void f16_block(const uint8_t* in, float* out) { *out = f16_at(in); }
void bf16_block(const uint8_t* in, float* out) {
    uint16_t h;
    std::memcpy(&h, in, 2);
    *out = lp::bf16_to_float(h);
}

// Q4_0: d, then 16 bytes: value j in the low nibble of byte j, value j + 16 in the high one; q - 8.
void q4_0_block(const uint8_t* in, float* out) {
    const float d = f16_at(in);
    for (int j = 0; j < 16; ++j) {
        out[j] = d * float(int(in[2 + j] & 0x0F) - 8);
        out[j + 16] = d * float(int(in[2 + j] >> 4) - 8);
    }
}

// Q4_1: d, m, then the nibbles as Q4_0's: d * q + m.
void q4_1_block(const uint8_t* in, float* out) {
    const float d = f16_at(in), m = f16_at(in + 2);
    for (int j = 0; j < 16; ++j) {
        out[j] = d * float(in[4 + j] & 0x0F) + m;
        out[j + 16] = d * float(in[4 + j] >> 4) + m;
    }
}

// Q5_0 and Q5_1: the nibbles as Q4's, with value j's fifth bit at bit j of a 32-bit word.
template <bool MIN>
void q5_block(const uint8_t* in, float* out) {
    const float d = f16_at(in), m = MIN ? f16_at(in + 2) : 0.0f;
    const uint8_t* p = in + (MIN ? 4 : 2);
    uint32_t qh;
    std::memcpy(&qh, p, 4);
    const uint8_t* qs = p + 4;
    for (int j = 0; j < 32; ++j) {
        const int low = j < 16 ? qs[j] & 0x0F : qs[j - 16] >> 4;
        const int q = low | int((qh >> j) & 1) << 4;
        out[j] = MIN ? d * float(q) + m : d * float(q - 16);
    }
}

// Q8_0: d, then 32 int8.
void q8_0_block(const uint8_t* in, float* out) {
    const float d = f16_at(in);
    for (int j = 0; j < 32; ++j) out[j] = float(int8_t(in[2 + j])) * d;
}

// Q4_K and Q5_K's 12 bytes of eight 6-bit scales and mins (ggml's get_scale_min_k4).
void scale_min_k4(const uint8_t* s, int j, int* sc, int* m) {
    if (j < 4) {
        *sc = s[j] & 63, *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

// Q4_K (d, dmin, scales, 128 bytes of nibbles) and Q5_K (the same with 32 bytes of fifth bits
// before the nibbles): sub-block j of 32 reads the low nibbles of bytes [32 (j / 2), +32) for an
// even j, their high ones for an odd j, and bit j of each byte of qh.
template <bool FIFTH>
void k4_block(const uint8_t* in, float* out) {
    const float d = f16_at(in), dmin = f16_at(in + 2);
    const uint8_t* scales = in + 4;
    const uint8_t* qh = in + 16;
    const uint8_t* qs = in + (FIFTH ? 48 : 16);
    for (int j = 0; j < 8; ++j) {
        int sc, m;
        scale_min_k4(scales, j, &sc, &m);
        const float dl = d * float(sc), ml = dmin * float(m);
        const uint8_t* bytes = qs + 32 * (j / 2);
        for (int l = 0; l < 32; ++l) {
            int q = j % 2 ? bytes[l] >> 4 : bytes[l] & 0x0F;
            if (FIFTH) q |= ((qh[l] >> j) & 1) << 4;
            out[32 * j + l] = dl * float(q) - ml;
        }
    }
}

// Q6_K: 128 bytes of low nibbles, 64 of high bit pairs, 16 int8 scales, d. Value 128 h + 32 k + l
// (k < 4) takes its nibble from byte 64 h + 32 (k % 2) + l (high for k >= 2) and its pair from
// bits 2k of byte 32 h + l; scale (value / 16).
void q6_k_block(const uint8_t* in, float* out) {
    const uint8_t* ql = in;
    const uint8_t* qh = in + 128;
    const int8_t* scales = reinterpret_cast<const int8_t*>(in + 192);
    const float d = f16_at(in + 208);
    for (int h = 0; h < 2; ++h)
        for (int k = 0; k < 4; ++k)
            for (int l = 0; l < 32; ++l) {
                const int v = 128 * h + 32 * k + l;
                const int low = (ql[64 * h + 32 * (k % 2) + l] >> (4 * (k / 2))) & 0x0F;
                const int high = (qh[32 * h + l] >> (2 * k)) & 3;
                out[v] = d * float(scales[v / 16]) * float((low | high << 4) - 32);
            }
}

bool format_of(int32_t type, Format* f) {
    switch (type) {
        case kF32: *f = {1, 4, f32_block}; return true;
        case kF16: *f = {1, 2, f16_block}; return true;
        case kBF16: *f = {1, 2, bf16_block}; return true;
        case kQ4_0: *f = {32, 18, q4_0_block}; return true;
        case kQ4_1: *f = {32, 20, q4_1_block}; return true;
        case kQ5_0: *f = {32, 22, q5_block<false>}; return true;
        case kQ5_1: *f = {32, 24, q5_block<true>}; return true;
        case kQ8_0: *f = {32, 34, q8_0_block}; return true;
        case kQ4_K: *f = {256, 144, k4_block<false>}; return true;
        case kQ5_K: *f = {256, 176, k4_block<true>}; return true;
        case kQ6_K: *f = {256, 210, q6_k_block}; return true;
        default: return false;
    }
}

// Rows a pool task dequantizes; a lookup smaller than two tasks runs on the calling thread.
constexpr int64_t kRowsPerTask = 32;

}  // namespace

extern "C" int32_t lp_dequantize_rows(int32_t ggml_type, const uint8_t* table, int64_t n_table_rows,
                                      int64_t row_bytes, int64_t n_cols, const int64_t* ids, int64_t n_ids,
                                      float* out) {
    Format f;
    if (!format_of(ggml_type, &f)) return lp::fail(LP_ERR_UNSUPPORTED, "lp_dequantize_rows: GGML type %d", ggml_type);
    if (n_cols <= 0 || n_cols % f.block != 0 || row_bytes != n_cols / f.block * f.block_bytes || n_ids < 0 ||
        n_table_rows < 0 || (n_ids > 0 && (!table || !ids || !out)))
        return lp::fail(LP_ERR_ARGUMENT, "lp_dequantize_rows: %lld columns of type %d in rows of %lld bytes",
                        (long long)n_cols, ggml_type, (long long)row_bytes);
    for (int64_t i = 0; i < n_ids; ++i)
        if (ids[i] < 0 || ids[i] >= n_table_rows)
            return lp::fail(LP_ERR_ARGUMENT, "lp_dequantize_rows: id %lld (index %lld) outside the %lld rows",
                            (long long)ids[i], (long long)i, (long long)n_table_rows);
    const auto rows = [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
            const uint8_t* row = table + ids[i] * row_bytes;
            float* dst = out + i * n_cols;
            for (int64_t b = 0; b < n_cols / f.block; ++b) f.block_fn(row + b * f.block_bytes, dst + b * f.block);
        }
    };
    if (n_ids < 2 * kRowsPerTask) {
        rows(0, n_ids);
        return LP_OK;
    }
    return lp::guarded([&] {
        lp::parallel_for((n_ids + kRowsPerTask - 1) / kRowsPerTask, [&](int64_t task, int) {
            rows(task * kRowsPerTask, std::min(n_ids, (task + 1) * kRowsPerTask));
        });
        return int32_t(LP_OK);
    });
}
