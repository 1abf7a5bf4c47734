// Quantized activation rows (qacts.h): per block of 32 and per super-block of 256, int8 values
// round-half-even(x * 127 / amax) with their scales and sums, computed alike on every build.
#include "qacts.h"

#include <cfloat>
#include <cmath>
#include <cstring>

#include "isa.h"

namespace lp::qacts {
namespace {

size_t block32_bytes(int k) { return 2 * size_t(k) + size_t(k / kActBlock) * 4 * (1 + 1 + 2 + 1 + 2); }

size_t acts_used_bytes(int k) {
    return block32_bytes(k) + 2 * size_t(k) + size_t(k / kSuper) * 4 + size_t(k / 16) * 4 + size_t(k / 16) * 2 +
           size_t(k / 32) * 2 + size_t(k / 8) * 4;
}

}  // namespace

size_t acts_bytes(int k) { return (acts_used_bytes(k) + 63) / 64 * 64; }

ActsRow acts_row(const uint8_t* base, int k) {
    const int nb = k / kActBlock;
    const float* d = reinterpret_cast<const float*>(base + 2 * size_t(k));
    const int32_t* sum = reinterpret_cast<const int32_t*>(d + 4 * nb);
    const uint8_t* super = base + block32_bytes(k);
    const float* kd = reinterpret_cast<const float*>(super + 2 * size_t(k));
    const int32_t* ksum16 = reinterpret_cast<const int32_t*>(kd + k / kSuper);
    const int16_t* kp16 = reinterpret_cast<const int16_t*>(ksum16 + k / 16);
    const int32_t* km32s8 = reinterpret_cast<const int32_t*>(kp16 + k / 16 + k / 32);
    return {reinterpret_cast<const int8_t*>(base), base + k, d, d + nb, d + 2 * nb, sum, sum + nb,
            reinterpret_cast<const int8_t*>(super), super + k, kd, ksum16, kp16, kp16 + k / 16, km32s8};
}

ActsRow super_view(const ActsRow& a) {
    ActsRow v = a;
    v.q = a.kq, v.qu = a.kqu, v.sum = nullptr, v.sum16 = a.ksum16;
    return v;
}

namespace {

// Blocks whose amax is below this are stored as zeros: 127 / amax would overflow, and values
// this small cannot matter next to the float32 sums they join.
constexpr float kTinyAmax = 1e-30f;

// Per block of 32: amax = max |x| (exact in any order), d = amax / 127, and
// q = round-half-even(x * (127 / amax)): IEEE operations every build performs alike, the SIMD
// ones lane by lane. block_amax returns false for a block holding an inf or a NaN.
#if defined(LP_ISA_AVX512VNNI)

bool block_amax(const float* x, float* amax) {
    const __m512 a0 = _mm512_abs_ps(_mm512_loadu_ps(x)), a1 = _mm512_abs_ps(_mm512_loadu_ps(x + 16));
    const __m512 big = _mm512_set1_ps(FLT_MAX);
    *amax = _mm512_reduce_max_ps(_mm512_max_ps(a0, a1));
    return (_mm512_cmp_ps_mask(a0, big, _CMP_LE_OQ) & _mm512_cmp_ps_mask(a1, big, _CMP_LE_OQ)) == 0xFFFF;
}

void round_block(const float* x, float id, int8_t* q, uint8_t* qu, int32_t (&half)[2]) {
    for (int h = 0; h < 2; ++h) {
        const __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + 16 * h), _mm512_set1_ps(id)));
        const __m128i bytes = _mm512_cvtsepi32_epi8(v);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16 * h), bytes);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(qu + 16 * h), _mm_xor_si128(bytes, _mm_set1_epi8(char(0x80))));
        half[h] = _mm512_reduce_add_epi32(v);
    }
}

#elif defined(LP_ISA_AVX2)

inline float hmax(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

inline int32_t hsum(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1)));
}

bool block_amax(const float* x, float* amax) {
    const __m256 sign = _mm256_set1_ps(-0.0f), big = _mm256_set1_ps(FLT_MAX);
    __m256 m = _mm256_setzero_ps(), ok = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
    for (int i = 0; i < 32; i += 8) {
        const __m256 a = _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i));
        m = _mm256_max_ps(m, a);
        ok = _mm256_and_ps(ok, _mm256_cmp_ps(a, big, _CMP_LE_OQ));
    }
    *amax = hmax(m);
    return _mm256_movemask_ps(ok) == 0xFF;
}

void round_block(const float* x, float id, int8_t* q, uint8_t* qu, int32_t (&half)[2]) {
    const __m256 scale = _mm256_set1_ps(id);
    __m256i v[4];
    for (int i = 0; i < 4; ++i) v[i] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * i), scale));
    half[0] = hsum(_mm256_add_epi32(v[0], v[1]));
    half[1] = hsum(_mm256_add_epi32(v[2], v[3]));
    // The packs work within 128-bit lanes; the permutation puts the 32 values back in order.
    const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
    const __m256i bytes = _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), bytes);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(qu), _mm256_xor_si256(bytes, _mm256_set1_epi8(char(0x80))));
}

#else

bool block_amax(const float* x, float* amax) {
    bool finite = true;
    float m = 0.0f;
    for (int i = 0; i < kActBlock; ++i) {
        const float a = std::fabs(x[i]);
        finite = finite && a <= FLT_MAX;  // false for inf and NaN
        m = a > m ? a : m;
    }
    *amax = m;
    return finite;
}

void round_block(const float* x, float id, int8_t* q, uint8_t* qu, int32_t (&half)[2]) {
    for (int i = 0; i < kActBlock; ++i) {
        const int v = int(std::lrint(x[i] * id));  // |v| <= 127; half to even (the default rounding)
        q[i] = int8_t(v);
        qu[i] = uint8_t(v + 128);
        half[i / 16] += v;
    }
}

#endif

// One scale per `n_blocks` blocks of 32 from x: d = amax / 127 (0 if tiny, NaN if any value is
// not finite, its quants then 0), q = round-half-even(x * 127 / amax), with each block's half sums.
float quantize_span(const float* x, int n_blocks, int8_t* q, uint8_t* qu, int32_t (*halves)[2]) {
    float amax = 0.0f;
    bool finite = true;
    for (int b = 0; b < n_blocks; ++b) {
        float m;
        finite = block_amax(x + b * kActBlock, &m) && finite;
        amax = m > amax ? m : amax;
    }
    const bool tiny = amax < kTinyAmax;
    for (int b = 0; b < n_blocks; ++b) {
        halves[b][0] = halves[b][1] = 0;
        if (finite) round_block(x + b * kActBlock, tiny ? 0.0f : 127.0f / amax, q + b * kActBlock, qu + b * kActBlock, halves[b]);
    }
    if (!finite) {
        std::memset(q, 0, size_t(n_blocks) * kActBlock);
        std::memset(qu, 128, size_t(n_blocks) * kActBlock);
        return NAN;  // the span's outputs become NaN, as a float matmul's would
    }
    return tiny ? 0.0f : amax / 127.0f;
}

// km32s8 of a super-block: -32 times the sum of each 8 of its quants, from their unsigned form
// qu = q + 128 (the sums of 8 are then 1024 more): psadbw against zero sums 8 bytes a lane, where
// a scalar loop took an add a byte (perf, the random 1B Q4_K_M file's 512-token prompts:
// quantize_range 2.8% of the samples before, 2.0% after).
void eights_times_minus_32(const uint8_t* qu, int32_t* out) {
#if defined(LP_ISA_AVX512VNNI)
    for (int c = 0; c < kSuper; c += 64) {
        const __m512i sums = _mm512_sad_epu8(_mm512_loadu_si512(qu + c), _mm512_setzero_si512());
        const __m512i v = _mm512_slli_epi64(_mm512_sub_epi64(_mm512_set1_epi64(1024), sums), 5);  // -32 (sum - 1024)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + c / 8), _mm512_cvtepi64_epi32(v));
    }
#elif defined(LP_ISA_AVX2)
    for (int c = 0; c < kSuper; c += 32) {
        const __m256i sums = _mm256_sad_epu8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(qu + c)), _mm256_setzero_si256());
        alignas(32) int64_t lanes[4];
        _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), sums);
        for (int i = 0; i < 4; ++i) out[c / 8 + i] = -32 * int32_t(lanes[i] - 1024);
    }
#else
    for (int e = 0; e < kSuper / 8; ++e) {
        int32_t sum8 = 0;
        for (int i = 0; i < 8; ++i) sum8 += int32_t(qu[8 * e + i]) - 128;
        out[e] = -32 * sum8;
    }
#endif
}

// Per block of 32 in [b_begin, b_end): q, qu, d, s, s16, sum, sum16. x holds the row's values
// from block b_begin on.
void quantize_blocks(const float* x, int k, uint8_t* out, int b_begin, int b_end) {
    const int nb = k / kActBlock;
    int8_t* q = reinterpret_cast<int8_t*>(out);
    uint8_t* qu = out + k;
    float* d = reinterpret_cast<float*>(out + 2 * size_t(k));
    float* s = d + nb;
    float* s16 = d + 2 * nb;
    int32_t* sum = reinterpret_cast<int32_t*>(d + 4 * nb);
    int32_t* sum16 = sum + nb;
    for (int b = b_begin; b < b_end; ++b) {
        int32_t half[1][2];
        d[b] = quantize_span(x + (b - b_begin) * kActBlock, 1, q + b * kActBlock, qu + b * kActBlock, half);
        sum[b] = half[0][0] + half[0][1];
        sum16[2 * b] = half[0][0];
        sum16[2 * b + 1] = half[0][1];
        s[b] = d[b] * float(sum[b]);
        s16[2 * b] = d[b] * float(half[0][0]);
        s16[2 * b + 1] = d[b] * float(half[0][1]);
    }
}

// Per super-block of 256 in [sb_begin, sb_end) (whole ones only: the k-quants' k is a multiple
// of 256). x holds the row's values from super-block sb_begin on.
void quantize_super(const float* x, int k, uint8_t* out, int sb_begin, int sb_end) {
    uint8_t* super = out + block32_bytes(k);
    int8_t* kq = reinterpret_cast<int8_t*>(super);
    uint8_t* kqu = super + k;
    float* kd = reinterpret_cast<float*>(super + 2 * size_t(k));
    int32_t* ksum16 = reinterpret_cast<int32_t*>(kd + k / kSuper);
    int16_t* kp16 = reinterpret_cast<int16_t*>(ksum16 + k / 16);
    int16_t* kp32 = kp16 + k / 16;
    int32_t* km32s8 = reinterpret_cast<int32_t*>(kp32 + k / 32);
    constexpr int per = kSuper / kActBlock;
    for (int sb = sb_begin; sb < sb_end; ++sb) {
        int32_t halves[per][2];
        const int b0 = sb * per;
        kd[sb] = quantize_span(x + (sb - sb_begin) * kSuper, per, kq + sb * kSuper, kqu + sb * kSuper, halves);
        for (int j = 0; j < per; ++j) {
            const int b = b0 + j;
            ksum16[2 * b] = halves[j][0], ksum16[2 * b + 1] = halves[j][1];
            kp16[2 * b] = int16_t(halves[j][0]), kp16[2 * b + 1] = int16_t(halves[j][1]);
            kp32[b] = int16_t(halves[j][0] + halves[j][1]);
        }
        eights_times_minus_32(kqu + sb * kSuper, km32s8 + sb * kSuper / 8);
    }
}

}  // namespace

void quantize_range(const float* x, int k, int c0, int c1, uint8_t* out, int parts) {
    if (parts & lp::ACTS_BLOCKS) quantize_blocks(x, k, out, c0 / kActBlock, c1 / kActBlock);
    if (parts & lp::ACTS_SUPER) {
        // Whole super-blocks write every byte below; a k past the last one leaves a tail to clear.
        if (c1 == k && k % kSuper != 0) std::memset(out + block32_bytes(k), 0, acts_used_bytes(k) - block32_bytes(k));
        quantize_super(x, k, out, c0 / kSuper, c1 / kSuper);
    }
    if (c1 == k) std::memset(out + acts_used_bytes(k), 0, acts_bytes(k) - acts_used_bytes(k));  // deterministic padding
}

}  // namespace lp::qacts

namespace lp {

void quantize_columns(const float* x, int32_t k, int32_t c0, int32_t c1, uint8_t* out, int parts) {
    qacts::quantize_range(x, k, c0, c1, out, parts);
}

void quantize_rows(const float* x, int64_t ldx, int32_t k, int32_t n_rows, uint8_t* acts, int parts) {
    const size_t row_bytes = qacts::acts_bytes(k);
    for (int32_t r = 0; r < n_rows; ++r) qacts::quantize_range(x + r * ldx, k, 0, k, acts + r * row_bytes, parts);
}

}  // namespace lp

extern "C" {

size_t lp_qacts_row_bytes(int32_t k) { return lp::qacts::acts_bytes(k); }

void lp_quantize_rows(const float* x, int64_t ldx, int32_t k, int32_t n_rows, uint8_t* acts) {
    lp::quantize_rows(x, ldx, k, n_rows, acts, lp::ACTS_ALL);
}

}  // extern "C"
