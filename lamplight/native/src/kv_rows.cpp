// KV row conversions (kv_rows.h). Every conversion is scalar or a vector form of the same
// products, so a row's bytes and values never depend on the build variant.
#include "kv_rows.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "forward.h"
#include "half.h"
#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace lp {
namespace {

uint16_t float_to_bf16(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x40);
    return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

// Block-quantized KV rows (lamplight/state/kv_quant.py: ggml's q8_0, q4_0, q4_1, q5_0, q5_1 and
// iq4_nl with its reference rounding): blocks of 32 values, each fp16 scales (d, and m for the _1
// types), q5's fifth bits as a uint32, then the quants (4-bit: value j in byte j's low nibble,
// value 16 + j in its high one). `index` counts values (a multiple of 32), so a row starts at
// byte index / 32 * block bytes.
constexpr int QBLOCK = KV_QBLOCK;

int block_bytes(int type) {
    switch (type) {
        case LP_KV_Q8_0: return 2 + QBLOCK;
        case LP_KV_Q4_0: return 2 + QBLOCK / 2;
        case LP_KV_Q4_1: return 4 + QBLOCK / 2;
        case LP_KV_Q5_0: return 6 + QBLOCK / 2;
        case LP_KV_Q5_1: return 8 + QBLOCK / 2;
        default: return 2 + QBLOCK / 2;  // LP_KV_IQ4_NL
    }
}

bool with_min(int type) { return type == LP_KV_Q4_1 || type == LP_KV_Q5_1; }
bool five_bits(int type) { return type == LP_KV_Q5_0 || type == LP_KV_Q5_1; }

float c_round(float x) {  // C's roundf, written out so that it matches kv_quant's to the bit
    float t = std::trunc(x);
    return std::fabs(x - t) >= 0.5f ? t + (x < 0 ? -1.0f : 1.0f) : t;
}

float read_half(const uint8_t* p) {
    uint16_t bits;
    std::memcpy(&bits, p, 2);
    return half_to_float(bits);
}

void write_half(uint8_t* p, float x) {
    uint16_t bits = float_to_half(x);
    std::memcpy(p, &bits, 2);
}

// iq4_nl: one fp16 scale and 16 non-linear levels (ggml's kvalues_iq4nl), as ggml's
// quantize_row_iq4_nl_ref writes a KV row: the value of largest magnitude goes to level -127, each
// value to its nearest level, then d is the least-squares scale for those levels with weights
// x^2, summed in order (no fused multiply-add: the build has -ffp-contract=off).
const int8_t IQ4_NL_LEVELS[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
constexpr int IQ4_NL_ZERO = 8;  // the level an all-zero block's values get (ggml leaves them unset)

int iq4_nl_nearest(float x) {  // ggml's best_index_int8: ties go to the upper level
    if (x <= IQ4_NL_LEVELS[0]) return 0;
    if (x >= IQ4_NL_LEVELS[15]) return 15;
    int lo = 0, hi = 15;
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (x < IQ4_NL_LEVELS[mid]) hi = mid;
        else lo = mid;
    }
    return x - IQ4_NL_LEVELS[hi - 1] < IQ4_NL_LEVELS[hi] - x ? hi - 1 : hi;
}

void store_iq4_nl(uint8_t* block, const float* x) {
    float amax = 0.0f, max = 0.0f;
    for (int i = 0; i < QBLOCK; i++) {
        if (std::fabs(x[i]) > amax) {
            amax = std::fabs(x[i]);
            max = x[i];
        }
    }
    int level[QBLOCK];
    float d = 0.0f;
    if (amax < 1e-15f) {  // ggml's GROUP_MAX_EPS
        std::fill(level, level + QBLOCK, IQ4_NL_ZERO);
    } else {
        float id = 1.0f / (max / (float)IQ4_NL_LEVELS[0]);
        float sumqx = 0.0f, sumq2 = 0.0f;
        for (int i = 0; i < QBLOCK; i++) {
            level[i] = iq4_nl_nearest(id * x[i]);
            float q = IQ4_NL_LEVELS[level[i]], w = x[i] * x[i];
            sumqx += w * q * x[i];
            sumq2 += w * q * q;
        }
        d = sumq2 > 0.0f ? sumqx / sumq2 : 0.0f;
    }
    write_half(block, d);
    for (int i = 0; i < QBLOCK / 2; i++) block[2 + i] = (uint8_t)(level[i] | (level[i + QBLOCK / 2] << 4));
}

void load_iq4_nl(const uint8_t* block, float* out) {
    float d = read_half(block);
    for (int i = 0; i < QBLOCK / 2; i++) {
        out[i] = (float)IQ4_NL_LEVELS[block[2 + i] & 0x0f] * d;
        out[i + QBLOCK / 2] = (float)IQ4_NL_LEVELS[block[2 + i] >> 4] * d;
    }
}

void load_quantized(const uint8_t* block, int type, int n, float* out) {
    for (int b = 0; b < n / QBLOCK; b++, block += block_bytes(type), out += QBLOCK) {
        if (type == LP_KV_IQ4_NL) {
            load_iq4_nl(block, out);
            continue;
        }
        float d = read_half(block);
        if (type == LP_KV_Q8_0) {
            const uint8_t* q = block + 2;
            int i = 0;
#if defined(__AVX2__)
            __m256 scale = _mm256_set1_ps(d);  // the same product as the scalar loop's, 8 at a time
            for (; i < QBLOCK; i += 8) {
                __m256i q32 = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(q + i)));
                _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_cvtepi32_ps(q32), scale));
            }
#endif
            for (; i < QBLOCK; i++) out[i] = (float)(int8_t)q[i] * d;
            continue;
        }
        float m = with_min(type) ? read_half(block + 2) : 0.0f;
        int offset = with_min(type) ? 4 : 2;
        uint32_t qh = 0;
        if (five_bits(type)) {
            std::memcpy(&qh, block + offset, 4);
            offset += 4;
        }
        const uint8_t* qs = block + offset;
        int zero = type == LP_KV_Q4_0 ? 8 : type == LP_KV_Q5_0 ? 16 : 0;
        for (int i = 0; i < QBLOCK; i++) {
            int q = i < QBLOCK / 2 ? (qs[i] & 0x0f) : (qs[i - QBLOCK / 2] >> 4);
            q |= (int)((qh >> i) & 1) << 4;
            out[i] = with_min(type) ? (float)q * d + m : (float)(q - zero) * d;
        }
    }
}

void store_quantized(uint8_t* block, int type, int n, const float* x) {
    for (int b = 0; b < n / QBLOCK; b++, block += block_bytes(type), x += QBLOCK) {
        if (type == LP_KV_IQ4_NL) {
            store_iq4_nl(block, x);
            continue;
        }
        if (with_min(type)) {
            float lo = x[0], hi = x[0];
            for (int i = 1; i < QBLOCK; i++) {
                lo = std::min(lo, x[i]);
                hi = std::max(hi, x[i]);
            }
            float d = (hi - lo) / (type == LP_KV_Q4_1 ? 15.0f : 31.0f);
            float id = d != 0.0f ? 1.0f / d : 0.0f;
            write_half(block, d);
            write_half(block + 2, lo);
            uint32_t qh = 0;
            uint8_t* qs = block + (type == LP_KV_Q5_1 ? 8 : 4);
            for (int i = 0; i < QBLOCK / 2; i++) {
                int q0 = (int)(uint8_t)((x[i] - lo) * id + 0.5f), q1 = (int)(uint8_t)((x[i + QBLOCK / 2] - lo) * id + 0.5f);
                if (type == LP_KV_Q4_1) q0 = std::min(15, q0), q1 = std::min(15, q1);
                qs[i] = (uint8_t)((q0 & 0x0f) | ((q1 & 0x0f) << 4));
                qh |= (uint32_t)((q0 >> 4) & 1) << i | (uint32_t)((q1 >> 4) & 1) << (i + QBLOCK / 2);
            }
            if (type == LP_KV_Q5_1) std::memcpy(block + 4, &qh, 4);
            continue;
        }
        float amax = 0.0f, max = 0.0f;
        for (int i = 0; i < QBLOCK; i++) {
            if (amax < std::fabs(x[i])) {
                amax = std::fabs(x[i]);
                max = x[i];
            }
        }
        float d = type == LP_KV_Q8_0 ? amax / 127.0f : max / (type == LP_KV_Q4_0 ? -8.0f : -16.0f);
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        write_half(block, d);
        if (type == LP_KV_Q8_0) {
            for (int i = 0; i < QBLOCK; i++) block[2 + i] = (uint8_t)(int8_t)c_round(x[i] * id);
            continue;
        }
        float zero = type == LP_KV_Q4_0 ? 8.5f : 16.5f;
        int top = type == LP_KV_Q4_0 ? 15 : 31;
        uint32_t qh = 0;
        uint8_t* qs = block + (type == LP_KV_Q5_0 ? 6 : 2);
        for (int i = 0; i < QBLOCK / 2; i++) {
            int q0 = std::min(top, (int)(int8_t)(x[i] * id + zero));
            int q1 = std::min(top, (int)(int8_t)(x[i + QBLOCK / 2] * id + zero));
            qs[i] = (uint8_t)((q0 & 0x0f) | ((q1 & 0x0f) << 4));
            qh |= (uint32_t)((q0 >> 4) & 1) << i | (uint32_t)((q1 >> 4) & 1) << (i + QBLOCK / 2);
        }
        if (type == LP_KV_Q5_0) std::memcpy(block + 2, &qh, 4);
    }
}

}  // namespace

bool kv_quantized(int type) { return type >= LP_KV_Q8_0 && type <= LP_KV_IQ4_NL; }

bool kv_type_known(int type) { return type == LP_KV_F32 || type == LP_KV_F16 || type == LP_KV_BF16 || kv_quantized(type); }

void load_kv(const void* base, int type, int64_t index, int n, float* out) {
    if (kv_quantized(type)) {
        load_quantized((const uint8_t*)base + index / QBLOCK * block_bytes(type), type, n, out);
        return;
    }
    if (type == LP_KV_F32) {
        std::memcpy(out, (const float*)base + index, n * sizeof(float));
        return;
    }
    const uint16_t* src = (const uint16_t*)base + index;
    int i = 0;
    if (type == LP_KV_F16) {
#if defined(__F16C__)
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(src + i))));
#endif
        for (; i < n; i++) out[i] = half_to_float(src[i]);
    } else {
        for (; i < n; i++) out[i] = bf16_to_float(src[i]);
    }
}

void store_kv(void* base, int type, int64_t index, int n, const float* in) {
    if (kv_quantized(type)) {
        store_quantized((uint8_t*)base + index / QBLOCK * block_bytes(type), type, n, in);
        return;
    }
    if (type == LP_KV_F32) {
        std::memcpy((float*)base + index, in, n * sizeof(float));
        return;
    }
    uint16_t* dst = (uint16_t*)base + index;
    for (int i = 0; i < n; i++) dst[i] = type == LP_KV_F16 ? float_to_half(in[i]) : float_to_bf16(in[i]);
}

}  // namespace lp
