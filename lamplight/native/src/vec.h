// Small vector helpers shared by the forward pass and the recurrent mixers. Each reduces in one
// fixed order for a given build, so a row's result never depends on the rows around it.
#pragma once
#include <stdint.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace lp {

// The reduction order of dot() is the AVX2 one in every build (two 8-lane accumulators, then a
// fixed tree), so the generic build computes the same bits as the vector builds.
inline float dot(const float* a, const float* b, int n) {
    int i = 0;
#if defined(__AVX2__)
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
    }
    for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    __m256 acc = _mm256_add_ps(acc0, acc1);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    float sum = _mm_cvtss_f32(s);
#else
    float acc0[8] = {0}, acc1[8] = {0};
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 8; l++) {
            acc0[l] = std::fma(a[i + l], b[i + l], acc0[l]);
            acc1[l] = std::fma(a[i + 8 + l], b[i + 8 + l], acc1[l]);
        }
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) acc0[l] = std::fma(a[i + l], b[i + l], acc0[l]);
    float acc[8], quad[4];
    for (int l = 0; l < 8; l++) acc[l] = acc0[l] + acc1[l];
    for (int l = 0; l < 4; l++) quad[l] = acc[l] + acc[l + 4];
    float sum = (quad[0] + quad[2]) + (quad[1] + quad[3]);
#endif
    for (; i < n; i++) sum = std::fma(a[i], b[i], sum);
    return sum;
}

// The largest of x[0..n) (exact in any order; a NaN may or may not win, as with std::max). Four
// accumulators, so that the maxes do not wait on each other (a softmax over each head's scores
// takes one).
inline float max_of(const float* x, int64_t n) {
    float mx = -INFINITY;
    int64_t i = 0;
#if defined(__AVX2__)
    __m256 m[4];
    for (int a = 0; a < 4; a++) m[a] = _mm256_set1_ps(-INFINITY);
    for (; i + 32 <= n; i += 32)
        for (int a = 0; a < 4; a++) m[a] = _mm256_max_ps(m[a], _mm256_loadu_ps(x + i + 8 * a));
    for (; i + 8 <= n; i += 8) m[0] = _mm256_max_ps(m[0], _mm256_loadu_ps(x + i));
    float lanes[8];
    _mm256_storeu_ps(lanes, _mm256_max_ps(_mm256_max_ps(m[0], m[1]), _mm256_max_ps(m[2], m[3])));
    for (int l = 0; l < 8; l++) mx = std::max(mx, lanes[l]);
#endif
    for (; i < n; i++) mx = std::max(mx, x[i]);
    return mx;
}

// sum_of's ending: its eight lane sums as ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)), then x[i..n) in
// order (the tail after the whole eights).
inline float lanes_total(const float (&lanes)[8], const float* x, int64_t i, int64_t n) {
    float sum = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
    for (; i < n; i++) sum += x[i];
    return sum;
}

// x[0..n) summed in one fixed order in every build: eight lanes (lane l takes i = l mod 8 of each
// whole 8), then ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)), then the tail in order. A sequential sum
// waits on each add; this one does not.
inline float sum_of(const float* x, int64_t n) {
    int64_t i = 0;
    float lanes[8] = {0};
#if defined(__AVX2__)
    __m256 acc = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) acc = _mm256_add_ps(acc, _mm256_loadu_ps(x + i));
    _mm256_storeu_ps(lanes, acc);
#else
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) lanes[l] += x[i + l];
#endif
    return lanes_total(lanes, x, i, n);
}

// sum_of(x[h], n[h]) for H arrays at once, each in sum_of's order: their lane chains side by
// side, so that one's adds do not wait on another's (each chain waits on its own every 8 values).
template <int H>
inline void sums_of(const float* const* x, const int64_t* n, float* out) {
#if defined(__AVX2__)
    const int64_t shared = *std::min_element(n, n + H) / 8 * 8;
    __m256 acc[H];
    for (int h = 0; h < H; h++) acc[h] = _mm256_setzero_ps();
    for (int64_t i = 0; i < shared; i += 8)
        for (int h = 0; h < H; h++) acc[h] = _mm256_add_ps(acc[h], _mm256_loadu_ps(x[h] + i));
    for (int h = 0; h < H; h++) {
        int64_t i = shared;
        for (; i + 8 <= n[h]; i += 8) acc[h] = _mm256_add_ps(acc[h], _mm256_loadu_ps(x[h] + i));
        float lanes[8];
        _mm256_storeu_ps(lanes, acc[h]);
        out[h] = lanes_total(lanes, x[h], i, n[h]);
    }
#else
    for (int h = 0; h < H; h++) out[h] = sum_of(x[h], n[h]);
#endif
}

inline void rms_norm(const float* x, const float* w, float eps, int n, float* out) {
    float mean = dot(x, x, n) / (float)n;
    float scale = 1.0f / std::sqrt(mean + eps);
    for (int i = 0; i < n; i++) out[i] = x[i] * scale * w[i];
}

// exp(x) as Cephes' expf: x = n ln2 + r, a degree-6 polynomial for e^r, and 2^n by exponent
// bits. Only plain float operations with no branch, so GCC vectorises the loops that call it
// with the same results in every build (libm's expf is scalar, and was most of attention's time).
inline float exp_approx(float x) {
    x = std::min(std::max(x, -87.3f), 88.3f);
    float n = std::nearbyint(x * 1.44269504088896341f);
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    float y = p * r * r + r + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    std::memcpy(&scale, &bits, 4);
    return y * scale;
}

inline float silu(float x) { return x / (1.0f + exp_approx(-x)); }

inline float sigmoid(float x) { return 1.0f / (1.0f + exp_approx(-x)); }

}  // namespace lp
