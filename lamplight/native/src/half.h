// fp16 <-> float32 for the builds without F16C and the scalar paths: the KV rows (kv_rows.cpp),
// the k-quants' fp16 scales (qmatmul.cpp), the fp16-indexed tables (table.cpp) and the GGUF
// row lookups (dequant.cpp); and bf16 -> float32, an exact widening.
#pragma once
#include <stdint.h>

#include <cmath>
#include <cstring>

namespace lp {

inline float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000 | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else {  // subnormal: normalise
        int e = -1;
        do { man <<= 1; e++; } while (!(man & 0x400));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ff) << 13);
    }
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

// float32 -> fp16 bits, rounded to nearest even as torch's .to(float16) and F16C's vcvtps2ph
// round (a NaN becomes a quiet NaN without its payload).
inline uint16_t float_to_half(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t abs = x & 0x7fffffff;
    if (abs >= 0x7f800000) return (uint16_t)(sign | 0x7c00 | (abs > 0x7f800000 ? 0x200 : 0));
    if (abs >= 0x477ff000) return (uint16_t)(sign | 0x7c00);  // rounds to infinity
    if (abs < 0x38800000) {  // subnormal or zero in half
        float af;
        std::memcpy(&af, &abs, 4);
        // 2^-24 is the half subnormal step: scale and round to an integer count of steps.
        return (uint16_t)(sign | (uint32_t)std::nearbyint(af * 16777216.0f));
    }
    uint32_t mant_odd = (abs >> 13) & 1;
    abs += 0xc8000fff + mant_odd;  // rebias exponent (-112 << 23) and round to nearest even
    return (uint16_t)(sign | (abs >> 13));
}

// bf16 is float32's top half: widening it is exact.
inline float bf16_to_float(uint16_t h) {
    const uint32_t bits = (uint32_t)h << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

}  // namespace lp
