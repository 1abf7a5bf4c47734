// One row's attention for the query heads of one KV group: the kernels (forward.cpp runs them
// over a step's rows and KV heads). See attention.h.
#include "attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "half.h"
#include "kv_rows.h"
#include "linear.h"
#include "vec.h"
#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace {

using lp::exp_approx;
using lp::grow;
using std::vector;

#if !defined(__AVX2__)
// The generic build's kernels, one head at a time, in the vector builds' order (their lane
// chains and reduction tree emulated), so every build computes the same bits.

// scores[j] = dot(q, keys[j]) * scale for j < n (keys: n rows of d floats, d a multiple of 8).
// Eight keys at a time, each with its own 8-lane accumulator chain over d (eight independent
// chains keep the FMA units busy); a missing key of the last eight reads zeros, which leaves
// the other keys' sums as they are.
void score_keys(const float* q, const float* keys, int64_t n, int d, float scale, float* scores, const float* zeros) {
    for (int64_t j0 = 0; j0 < n; j0 += 8) {
        int count = (int)std::min<int64_t>(8, n - j0);
        const float* k[8];
        for (int j = 0; j < 8; j++) k[j] = j < count ? keys + (j0 + j) * d : zeros;
        for (int j = 0; j < count; j++) {
            float a[8] = {0};
            for (int i = 0; i < d; i += 8)
                for (int l = 0; l < 8; l++) a[l] = std::fma(q[i + l], k[j][i + l], a[l]);
            scores[j0 + j] = (((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]))) * scale;
        }
    }
}

// out[0..d) = sum_j p[j] * values[j] * inv_sum, accumulated in key order (eight 8-lane chains
// per 64 values).
void weigh_values(const float* p, const float* values, int64_t n, int d, float inv_sum, float* out) {
    for (int i0 = 0; i0 < d; i0 += 64) {
        int width = std::min(64, d - i0);
        float acc[64] = {0};
        for (int64_t j = 0; j < n; j++)
            for (int i = 0; i < width; i++) acc[i] = std::fma(p[j], values[j * d + i0 + i], acc[i]);
        for (int i = 0; i < width; i++) out[i0 + i] = acc[i] * inv_sum;
    }
}
#endif

#if defined(__AVX2__)
// Calls fn(std::integral_constant<int, H>(), first head) for runs of heads covering [0, group):
// as many as share loads, largest first (AVX-512 holds the accumulators of 4 or 3, AVX2 of 2).
template <class Fn>
void head_runs(int group, Fn&& fn) {
    int h = 0;
#if defined(__AVX512F__)
    for (; group - h >= 4; h += 4) fn(std::integral_constant<int, 4>(), h);
    for (; group - h >= 3; h += 3) fn(std::integral_constant<int, 3>(), h);
#endif
    for (; group - h >= 2; h += 2) fn(std::integral_constant<int, 2>(), h);
    for (; h < group; h++) fn(std::integral_constant<int, 1>(), h);
}

// Asks for the cache lines of `bytes` from p (a prefetch never faults, and changes no result).
// An asm statement rather than __builtin_prefetch: GCC 12's dead-code elimination dropped the
// builtin's loops from the score kernels below (they have no other effect), leaving no prefetch.
inline void prefetch_bytes(const void* p, int bytes) {
    for (int offset = 0; offset < bytes; offset += 64)
        asm volatile("prefetcht0 %0" : : "m"(*(static_cast<const char*>(p) + offset)));
}

// Where the kernels below read the rows of keys or values: float32 rows one after another (a
// chunk's keys converted once, or a KV type converted per row), or the pool's fp16 rows at their
// slots, read in place. fp16 converts to float32 exactly, so both give a row the same bits; read
// in place, a decode row's keys cross memory once, as fp16, instead of being written out as
// float32 and read back.
struct F32Rows {
    using T = float;
    const float* base;
    int d;
    const float* zero;  // d zeros: the missing keys of a last group
    const float* row(int64_t j) const { return base + j * d; }
    void prefetch(int64_t j) const { prefetch_bytes(row(j), d * (int)sizeof(T)); }
    static __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
    static float at(const float* p, int i) { return p[i]; }
#if defined(__AVX512F__)
    static __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
    static __m512 load8x2(const float* a, const float* b) {  // a's 8 values, then b's
        return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(a)), _mm256_loadu_ps(b), 1);
    }
#endif
};

struct F16PoolRows {
    using T = uint16_t;
    const uint16_t* base;  // the KV head's first pool row
    const int64_t* slots;  // row j's pool slot
    int d;
    const uint16_t* zero;
    const uint16_t* row(int64_t j) const { return base + slots[j] * d; }
    void prefetch(int64_t j) const { prefetch_bytes(row(j), d * (int)sizeof(T)); }
    static __m256 load8(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
    static float at(const uint16_t* p, int i) { return lp::half_to_float(p[i]); }
#if defined(__AVX512F__)
    static __m512 load16(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
    static __m512 load8x2(const uint16_t* a, const uint16_t* b) {
        __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a));
        __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b));
        return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1));
    }
#endif
};

// A decode row's keys and values are in no cache: a step's pool outgrows L2, and the weights
// streaming between two layers' attention push it out of L3. Where a score kernel is asked to
// (`prefetch`), it asks for the key rows kAheadBytes past the block it reads, and for the block's
// value rows, which the weighing pass reads after the softmax. Random 1B Q4_K_M file on Zen 5,
// builds alternated step by step in one process: 16-row decode steps 1.8% faster at context 64,
// 6.1% at 128, 7.4% at 256 (attention 7.5 -> 4.2 ms), 8 rows 5.4% at 128, one row 1-2.6%;
// the AVX2 build 1.4-2%. At 256, 6 KiB ahead ran as fast as 8, 12 KiB a third less of the
// gain; the keys alone (4, 8, 16 KiB) gave 2-3.5%. Prompt chunks, whose rows find their keys
// and values in cache, ran 2% slower with it and do without.
constexpr int kAheadBytes = 8192;

// The first `ahead` key rows (kAheadBytes), asked for before a score kernel's first block.
template <class Rows>
inline void prefetch_first(const Rows& keys, int64_t n, int64_t ahead) {
    for (int64_t j = 0; j < std::min(n, ahead); j++) keys.prefetch(j);
}

// At the block [j0, j0 + count) of n keys: the key rows `ahead` further on, and the block's
// value rows (read after the softmax).
template <class Rows>
inline void prefetch_block(const Rows& keys, const Rows& values, int64_t j0, int count, int64_t n, int64_t ahead) {
    for (int64_t j = j0 + ahead; j < std::min(n, j0 + ahead + count); j++) keys.prefetch(j);
    for (int64_t j = j0; j < j0 + count; j++) values.prefetch(j);
}

// Key rows in kAheadBytes (at least one).
template <class Rows>
inline int64_t rows_ahead(int d) { return std::max<int64_t>(1, kAheadBytes / (d * (int64_t)sizeof(typename Rows::T))); }

const float zero_floats[LP_MAX_HEAD_DIM] = {};    // the missing keys of a last group, as rows
const uint16_t zero_halves[LP_MAX_HEAD_DIM] = {};  // fp16 +0.0

// score_keys for H heads at once with 8-lane vectors (AVX2 builds; AVX-512 ones run
// score_keys_heads16), J keys at a time (4, or 8 for one head: eight independent
// chains keep the FMA units busy): each head and key keeps its own 8-lane chain over d and
// score_keys' reduction tree, ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)), so every score is
// score_keys' bits; the heads share each key's loads.
template <int H, class Rows>
void score_keys_heads(const float* const* q, const Rows& keys, int64_t n, int d, float scale, float* const* scores,
                      const Rows& values, bool prefetch) {
    constexpr int J = H == 1 ? 8 : 4;
    const int64_t ahead = rows_ahead<Rows>(d);
    if (prefetch) prefetch_first(keys, n, ahead);
    for (int64_t j0 = 0; j0 < n; j0 += J) {
        int count = (int)std::min<int64_t>(J, n - j0);
        if (prefetch) prefetch_block(keys, values, j0, count, n, ahead);
        const typename Rows::T* k[J];
        for (int j = 0; j < J; j++) k[j] = j < count ? keys.row(j0 + j) : keys.zero;
        __m256 a[H][J];
        for (int h = 0; h < H; h++)
            for (int j = 0; j < J; j++) a[h][j] = _mm256_setzero_ps();
        for (int i = 0; i < d; i += 8) {
            __m256 kv[J];
            for (int j = 0; j < J; j++) kv[j] = Rows::load8(k[j] + i);
            for (int h = 0; h < H; h++) {
                __m256 qv = _mm256_loadu_ps(q[h] + i);
                for (int j = 0; j < J; j++) a[h][j] = _mm256_fmadd_ps(qv, kv[j], a[h][j]);
            }
        }
        for (int h = 0; h < H; h++)
            for (int j4 = 0; j4 < J; j4 += 4) {
                __m256 u = _mm256_hadd_ps(_mm256_hadd_ps(a[h][j4], a[h][j4 + 1]), _mm256_hadd_ps(a[h][j4 + 2], a[h][j4 + 3]));
                __m128 sums = _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1));
                float out[4];
                _mm_storeu_ps(out, _mm_mul_ps(sums, _mm_set1_ps(scale)));
                for (int j = j4; j < std::min(count, j4 + 4); j++) scores[h][j0 + j] = out[j - j4];
            }
    }
}

#endif

// Softmax of H heads' scores in place, head h's n[h] scores at s[h] (softcap, the sink's logit
// sinks[h] or none, exp); inv[h] = 1 / the sum. Each head's bits are its own whatever H: the
// heads only share the loop of their sums (lp::sums_of), whose chains would otherwise each wait
// on its own adds.
template <int H>
void softmax_heads(const LpConfig& c, float* const* s, const int64_t* n, const float* const* sinks, float* inv) {
    float mx[H], sum[H];
    for (int h = 0; h < H; h++) {
        if (c.attn_softcap > 0.0f)
            for (int64_t j = 0; j < n[h]; j++) s[h][j] = std::tanh(s[h][j] / c.attn_softcap) * c.attn_softcap;
        mx[h] = std::max(sinks[h] ? *sinks[h] : -INFINITY, lp::max_of(s[h], n[h]));
        for (int64_t j = 0; j < n[h]; j++) s[h][j] = exp_approx(s[h][j] - mx[h]);
    }
    lp::sums_of<H>(s, n, sum);
    for (int h = 0; h < H; h++) {
        if (sinks[h]) sum[h] += exp_approx(*sinks[h] - mx[h]);
        inv[h] = 1.0f / sum[h];
    }
}

#if !defined(__AVX2__)
// Softmax of one head's n scores in place; returns 1 / sum.
float softmax_scores(const LpConfig& c, float* s, int64_t n, const float* sink) {
    float inv;
    softmax_heads<1>(c, &s, &n, &sink, &inv);
    return inv;
}
#endif

#if defined(__AVX512F__)
// _mm256_hadd_ps in each half: per 128 bits, [x0 + x1, x2 + x3, y0 + y1, y2 + y3].
inline __m512 hadd16(__m512 x, __m512 y) {
    return _mm512_add_ps(_mm512_shuffle_ps(x, y, _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_ps(x, y, _MM_SHUFFLE(3, 1, 3, 1)));
}

// The sums of eight keys' 8-lane chains (keys 2p and 2p + 1 in pair p's halves), each in
// score_keys' tree ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)): the AVX2 build's hadd steps, two keys'
// worth an instruction.
inline __m256 sums_of_eight(__m512 p0, __m512 p1, __m512 p2, __m512 p3) {
    __m512 t = hadd16(_mm512_shuffle_f32x4(p0, p1, 0x44), _mm512_shuffle_f32x4(p0, p1, 0xEE));  // [hadd(k0,k1) | hadd(k2,k3)]
    __m512 t2 = hadd16(_mm512_shuffle_f32x4(p2, p3, 0x44), _mm512_shuffle_f32x4(p2, p3, 0xEE));
    __m512 u = hadd16(_mm512_shuffle_f32x4(t, t2, 0x44), _mm512_shuffle_f32x4(t, t2, 0xEE));
    __m512 v = _mm512_add_ps(u, _mm512_shuffle_f32x4(u, u, 0xB1));  // each 256 bits' low 128 + high 128
    return _mm512_castps512_ps256(_mm512_shuffle_f32x4(v, v, 0x08));
}

// score_keys_heads with 16-lane vectors: two keys a vector (key 2p in lanes 0-7, 2p + 1 in 8-15,
// the query's 8 values in both halves), so each key keeps its own 8-lane chain over d and its
// reduction tree: score_keys' bits, at twice the values an instruction.
template <int H, class Rows>
void score_keys_heads16(const float* const* q, const Rows& keys, int64_t n, int d, float scale, float* const* scores,
                        const Rows& values, bool prefetch) {
    // Keys a block: H * J / 2 accumulators, J / 2 key vectors and a query vector fit in the 32
    // registers (the rows of a chunk scored together, attend_chunk_rows_in_place, bring up to 8
    // heads; lp::chunk_rows_score_in_eights says which keep 8 keys).
    constexpr int J = H == 1 ? 16 : H <= 6 ? 8 : 4, P = J / 2;
    const __m256 scale8 = _mm256_set1_ps(scale);
    const int64_t ahead = rows_ahead<Rows>(d);
    if (prefetch) prefetch_first(keys, n, ahead);
    for (int64_t j0 = 0; j0 < n; j0 += J) {
        int count = (int)std::min<int64_t>(J, n - j0);
        if (prefetch) prefetch_block(keys, values, j0, count, n, ahead);
        const typename Rows::T* k[J];
        for (int j = 0; j < J; j++) k[j] = j < count ? keys.row(j0 + j) : keys.zero;
        __m512 a[H][P];
        for (int h = 0; h < H; h++)
            for (int p = 0; p < P; p++) a[h][p] = _mm512_setzero_ps();
        for (int i = 0; i < d; i += 8) {
            __m512 kv[P];
            for (int p = 0; p < P; p++) kv[p] = Rows::load8x2(k[2 * p] + i, k[2 * p + 1] + i);
            for (int h = 0; h < H; h++) {
                __m512 qv = _mm512_broadcast_f32x8(_mm256_loadu_ps(q[h] + i));
                for (int p = 0; p < P; p++) a[h][p] = _mm512_fmadd_ps(qv, kv[p], a[h][p]);
            }
        }
        for (int h = 0; h < H; h++)
            for (int e = 0; e < J; e += 8) {
                __m256 s = _mm256_mul_ps(sums_of_eight(a[h][e / 2], a[h][e / 2 + 1], a[h][e / 2 + 2], a[h][e / 2 + 3]), scale8);
                int left = count - e;
                if (left >= 8)
                    _mm256_storeu_ps(scores[h] + j0 + e, s);
                else if (left > 0)
                    _mm256_mask_storeu_ps(scores[h] + j0 + e, (__mmask8)((1u << left) - 1), s);
            }
    }
}


// Scores against a chunk's transposed keys (lp::transpose_keys): a 16-lane vector holds one
// index of 16 keys, so each key's 8-lane chain of score_keys (lane l: the products at l, l + 8,
// ... in order) is a vector of its own, accumulated by FMAs against the query's value at that
// index broadcast, and score_keys' tree over the eight lanes is a few vector adds: no shuffles,
// and one fp16 conversion per index of 16 keys instead of one per key and 8 values for each row.
// The chains run a few lanes at a time, as many as H heads' accumulators leave room for in the
// registers (4 lanes for up to 6 heads, 2 for 7 or 8: the rows of a chunk scored together,
// attend_chunk_rows_transposed), so that the heads share each key vector; ((l0+l1)+(l2+l3)) +
// ((l4+l5)+(l6+l7)) as score_keys adds them, the partial sums of 2-lane passes kept in the
// scores' own lines. 4 lanes for 6 heads (30 of the 32 registers) ran SmolLM2's 512-token
// prompt's attention 2% faster than 2 lanes. Every key's score has score_keys' bits (fp16
// converts exactly); keys do not mix, and a last block's missing ones score zeros, unread.
template <int H>
void score_keys_transposed(const float* const* q, const uint16_t* kt, int64_t n_blocks, int d, float scale,
                           float* const* scores) {
    constexpr int kLanes = H <= 6 ? 4 : 2;  // chain lanes a pass
    static_assert(H <= 8, "at most 8 heads' accumulators fit");
    const __m512 scale16 = _mm512_set1_ps(scale);
    alignas(64) float upper[kLanes == 2 ? H : 1][lp::KEY_BLOCK];  // 2-lane passes: (l4+l5) until (l6+l7) comes
    for (int64_t blk = 0; blk < n_blocks; blk++) {
        const uint16_t* keys = kt + blk * lp::KEY_BLOCK * d;
        __m512 low[kLanes == 4 ? H : 1];
        for (int part = 0; part < 8 / kLanes; part++) {
            __m512 a[H][kLanes];
            for (int h = 0; h < H; h++)
                for (int l = 0; l < kLanes; l++) a[h][l] = _mm512_setzero_ps();
            for (int i = kLanes * part; i < d; i += 8)
                for (int l = 0; l < kLanes; l++) {
                    const __m512 kv = _mm512_cvtph_ps(
                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(keys + (int64_t)(i + l) * lp::KEY_BLOCK)));
                    for (int h = 0; h < H; h++) a[h][l] = _mm512_fmadd_ps(_mm512_set1_ps(q[h][i + l]), kv, a[h][l]);
                }
            for (int h = 0; h < H; h++) {
                float* out = scores[h] + blk * lp::KEY_BLOCK;
                if constexpr (kLanes == 4) {
                    const __m512 sum = _mm512_add_ps(_mm512_add_ps(a[h][0], a[h][1]), _mm512_add_ps(a[h][2], a[h][3]));
                    if (part == 0)
                        low[h] = sum;
                    else
                        _mm512_storeu_ps(out, _mm512_mul_ps(_mm512_add_ps(low[h], sum), scale16));
                } else {
                    const __m512 pair = _mm512_add_ps(a[h][0], a[h][1]);  // (l0+l1), (l2+l3), (l4+l5), (l6+l7)
                    if (part == 0)
                        _mm512_storeu_ps(out, pair);
                    else if (part == 1)
                        _mm512_storeu_ps(out, _mm512_add_ps(_mm512_loadu_ps(out), pair));
                    else if (part == 2)
                        _mm512_store_ps(upper[h], pair);
                    else
                        _mm512_storeu_ps(out, _mm512_mul_ps(_mm512_add_ps(_mm512_loadu_ps(out),
                                                                          _mm512_add_ps(_mm512_load_ps(upper[h]), pair)),
                                                            scale16));
                }
            }
        }
    }
}
#endif

#if defined(__AVX2__)
// The float32 vectors the values kernel runs on: 8 lanes (AVX2) or 16 (AVX-512), with the values
// of d a pass takes for H heads (64 for one head: eight 8-lane or four 16-lane chains; for more,
// as many as their accumulators, weights and a value leave room for in the registers).
struct Lanes8 {
    using V = __m256;
    static constexpr int n = 8;
    template <int H> static constexpr int pass = H == 1 ? 64 : 32;
    static V zero() { return _mm256_setzero_ps(); }
    static V set1(float x) { return _mm256_set1_ps(x); }
    static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
    static void store(float* p, V v, float scale) { _mm256_storeu_ps(p, _mm256_mul_ps(v, _mm256_set1_ps(scale))); }
    template <class Rows> static V load(const typename Rows::T* p) { return Rows::load8(p); }
};

#if defined(__AVX512F__)
struct Lanes16 {
    using V = __m512;
    static constexpr int n = 16;
    template <int H> static constexpr int pass = H == 1 ? 128 : H <= 4 ? 64 : 32;
    static V zero() { return _mm512_setzero_ps(); }
    static V set1(float x) { return _mm512_set1_ps(x); }
    static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
    static void store(float* p, V v, float scale) { _mm512_storeu_ps(p, _mm512_mul_ps(v, _mm512_set1_ps(scale))); }
    template <class Rows> static V load(const typename Rows::T* p) { return Rows::load16(p); }
};
using ValueLanes = Lanes16;
#else
using ValueLanes = Lanes8;
#endif

// weigh_values for H heads at once: Lanes::pass<H> values of d a pass, then Lanes::n at a time,
// then one by one; each output value is the same chain of fmas in key order whatever the width
// (weigh_values' bits), and the heads share each value's loads.
// Head h weighs the values of its first n[h] keys (the rows of a chunk attend to different
// numbers): the heads share the loads of the keys they all have, then each goes on alone, its
// chains unbroken.
template <int H, class Lanes, class Rows>
void weigh_values_heads(const float* const* p, const Rows& values, const int64_t* n, int d, const float* inv_sum,
                        float* const* out) {
    const int64_t shared = *std::min_element(n, n + H);
    auto pass = [&](auto width, int i0) {
        constexpr int L = decltype(width)::value / Lanes::n;
        typename Lanes::V a[H][L];
        for (int h = 0; h < H; h++)
            for (int l = 0; l < L; l++) a[h][l] = Lanes::zero();
        for (int64_t j = 0; j < shared; j++) {
            const typename Rows::T* v = values.row(j) + i0;
            typename Lanes::V w[H];
            for (int h = 0; h < H; h++) w[h] = Lanes::set1(p[h][j]);
            for (int l = 0; l < L; l++) {
                typename Lanes::V vv = Lanes::template load<Rows>(v + Lanes::n * l);
                for (int h = 0; h < H; h++) a[h][l] = Lanes::fma(w[h], vv, a[h][l]);
            }
        }
        for (int h = 0; h < H; h++)
            for (int64_t j = shared; j < n[h]; j++)
                for (int l = 0; l < L; l++)
                    a[h][l] = Lanes::fma(Lanes::set1(p[h][j]), Lanes::template load<Rows>(values.row(j) + i0 + Lanes::n * l), a[h][l]);
        for (int h = 0; h < H; h++)
            for (int l = 0; l < L; l++) Lanes::store(out[h] + i0 + Lanes::n * l, a[h][l], inv_sum[h]);
    };
    constexpr int W = Lanes::template pass<H>;
    int i0 = 0;
    for (; i0 + W <= d; i0 += W) pass(std::integral_constant<int, W>(), i0);
    for (; i0 + Lanes::n <= d; i0 += Lanes::n) pass(std::integral_constant<int, Lanes::n>(), i0);
    for (int h = 0; h < H && i0 < d; h++) {
        float acc[Lanes::n] = {0};
        for (int64_t j = 0; j < n[h]; j++)
            for (int i = i0; i < d; i++) acc[i - i0] = std::fma(p[h][j], Rows::at(values.row(j), i), acc[i - i0]);
        for (int i = i0; i < d; i++) out[h][i] = acc[i - i0] * inv_sum[h];
    }
}
#endif

#if defined(__AVX2__)
// A row's attention for its KV group, the heads in runs that share the loads (the same bits as
// one at a time): `score(heads, i, qs, ss)` writes the scores of run [i, i + H) into ss (rows of
// `stride` scores, the row's n keys from `offset` on), then softmax and the values, in key order.
template <class Rows, class Score>
void attend_heads(const LpConfig& c, const float* q, int64_t n, int64_t stride, int64_t offset, const Rows& values,
                  const float* sinks, float* out, vector<float>& scratch, Score&& score) {
    int dk = c.head_dim_k, dv = c.head_dim_v, group = c.n_heads / c.n_kv_heads;
    float* scores = grow(scratch, (size_t)stride * group);
    head_runs(group, [&](auto heads, int i) {
        constexpr int H = decltype(heads)::value;
        const float* qs[H];
        float* ss[H];
        float* outs[H];
        float inv[H];
        for (int h = 0; h < H; h++) qs[h] = q + (int64_t)(i + h) * dk, ss[h] = scores + (i + h) * stride, outs[h] = out + (int64_t)(i + h) * dv;
        score(heads, i, qs, ss);
        int64_t ns[H];
        const float* sink[H];
        for (int h = 0; h < H; h++) ss[h] += offset, ns[h] = n, sink[h] = sinks ? sinks + i + h : nullptr;
        softmax_heads<H>(c, ss, ns, sink, inv);
        weigh_values_heads<H, ValueLanes>(ss, values, ns, dv, inv, outs);
    });
}

// attend_rows over keys and values wherever they are (F32Rows, F16PoolRows). `prefetch`: ask for
// the rows ahead (a decode row's: kAheadBytes).
template <class Rows>
void attend_rows_in(const LpConfig& c, const float* q, const Rows& keys, const Rows& values, int64_t n,
                    const float* sinks, float* out, vector<float>& scratch, bool prefetch = false) {
    attend_heads(c, q, n, n, 0, values, sinks, out, scratch, [&](auto heads, int i, const float* const* qs, float* const* ss) {
        constexpr int H = decltype(heads)::value;
        // The group's first run of heads asks for the rows; a later run finds them in cache.
#if defined(__AVX512F__)
        score_keys_heads16<H>(qs, keys, n, c.head_dim_k, c.attn_scale, ss, values, prefetch && i == 0);
#else
        score_keys_heads<H>(qs, keys, n, c.head_dim_k, c.attn_scale, ss, values, prefetch && i == 0);
#endif
    });
}
#endif

#if defined(__AVX512F__)
// The rows of a chunk attending together as H = rows * group heads: every (row, query head) a
// head of its own, scored by score(qs, ss) into rows of `stride` scores, the rows' keys from
// `offset` on, against the longest row's keys (a key's score is its own, so the shorter rows'
// extra scores are never read), its softmax and values over its own row's keys.
template <int H, class Score>
void attend_chunk_heads(const lp::LpChunkRows& rows, int64_t stride, int64_t offset, const F16PoolRows& values,
                        vector<float>& scratch, Score&& score) {
    const LpConfig& c = *rows.c;
    const int group = c.n_heads / c.n_kv_heads;
    float* scores = grow(scratch, (size_t)stride * H);
    const float* qs[H];
    float* ss[H];
    float* outs[H];
    float inv[H];
    int64_t ns[H];
    const float* sink[H];
    for (int h = 0; h < H; h++) {
        const int r = h / group, i = h % group;
        qs[h] = rows.q[r] + (int64_t)i * c.head_dim_k, ss[h] = scores + h * stride, outs[h] = rows.out[r] + (int64_t)i * c.head_dim_v;
        ns[h] = rows.n[r], sink[h] = rows.sinks ? rows.sinks + i : nullptr;
    }
    score(qs, ss);
    for (int h = 0; h < H; h++) ss[h] += offset;
    softmax_heads<H>(c, ss, ns, sink, inv);
    weigh_values_heads<H, ValueLanes>(ss, values, ns, c.head_dim_v, inv, outs);
}

// fn(std::integral_constant<int, H>()) for H = `heads` from 2 to 8 (attend_chunk_heads' counts);
// false for any other.
template <class Fn>
bool with_heads(int heads, Fn&& fn) {
    switch (heads) {
        case 2: fn(std::integral_constant<int, 2>()); return true;
        case 3: fn(std::integral_constant<int, 3>()); return true;
        case 4: fn(std::integral_constant<int, 4>()); return true;
        case 5: fn(std::integral_constant<int, 5>()); return true;
        case 6: fn(std::integral_constant<int, 6>()); return true;
        case 7: fn(std::integral_constant<int, 7>()); return true;
        case 8: fn(std::integral_constant<int, 8>()); return true;
        default: return false;
    }
}
#endif

#if defined(__AVX512F__)
// The blocks of a chunk's transposed keys (lp::transpose_keys, d values a key) that a row whose
// keys are the chunk's [skip, skip + n) scores against: whole blocks from the one holding key
// `skip`, which is that block's key `offset` (the keys before it score too: their lanes are
// their own, and unread).
struct TransposedSpan {
    const uint16_t* blocks;
    int64_t n_blocks, offset;
    int64_t keys() const { return n_blocks * lp::KEY_BLOCK; }
};

inline TransposedSpan transposed_span(const uint16_t* kt, int64_t skip, int64_t n, int d) {
    const int64_t first_block = skip / lp::KEY_BLOCK, offset = skip % lp::KEY_BLOCK;
    return {kt + first_block * lp::KEY_BLOCK * d, (offset + n + lp::KEY_BLOCK - 1) / lp::KEY_BLOCK, offset};
}

// attend_rows_in with the scores from a chunk's transposed keys, the row's keys being the
// chunk's from `skip` on (transposed_span).
void attend_rows_transposed_in(const LpConfig& c, const float* q, const uint16_t* kt, int64_t skip, int64_t n,
                               const F16PoolRows& values, const float* sinks, float* out, vector<float>& scratch) {
    const TransposedSpan span = transposed_span(kt, skip, n, c.head_dim_k);
    attend_heads(c, q, n, span.keys(), span.offset, values, sinks, out, scratch,
                 [&](auto heads, int, const float* const* qs, float* const* ss) {
                     score_keys_transposed<decltype(heads)::value>(qs, span.blocks, span.n_blocks, c.head_dim_k,
                                                                   c.attn_scale, ss);
                 });
}
#endif

}  // namespace

namespace lp {

void load_rows(const void* base, int type, int64_t head_offset, const int64_t* slots, int64_t n, int d, float* out) {
    for (int64_t j = 0; j < n; j++) load_kv(base, type, head_offset + slots[j] * d, d, out + j * d);
}

// `sinks`: the group's attention-sink logits (one per query head, joining each softmax without
// a value: gpt-oss), or null. keys [n, dk] and values [n, dv] are float32 rows.
void attend_rows(const LpConfig& c, const float* q, const float* keys, const float* values, int64_t n,
                 const float* sinks, float* out, vector<float>& scratch) {
    int dk = c.head_dim_k, dv = c.head_dim_v;
#if defined(__AVX2__)
    attend_rows_in(c, q, F32Rows{keys, dk, zero_floats}, F32Rows{values, dv, zero_floats}, n, sinks, out, scratch);
#else
    int group = c.n_heads / c.n_kv_heads;
    float* scores = grow(scratch, (size_t)n * group + dk);
    float* zeros = scores + n * group;
    std::memset(zeros, 0, dk * sizeof(float));
    for (int i = 0; i < group; i++) {
        score_keys(q + i * dk, keys, n, dk, c.attn_scale, scores + i * n, zeros);
        weigh_values(scores + i * n, values, n, dv,
                     softmax_scores(c, scores + i * n, n, sinks ? sinks + i : nullptr), out + (int64_t)i * dv);
    }
#endif
}

bool attend_rows_in_place(const LpConfig& c, const float* q, const uint16_t* k_head, const uint16_t* v_head,
                          const int64_t* slots, int64_t n, const float* sinks, float* out, vector<float>& scratch,
                          bool prefetch) {
#if defined(__AVX2__)
    F16PoolRows keys{k_head, slots, c.head_dim_k, zero_halves}, values{v_head, slots, c.head_dim_v, zero_halves};
    attend_rows_in(c, q, keys, values, n, sinks, out, scratch, prefetch);
    return true;
#else
    (void)c, (void)q, (void)k_head, (void)v_head, (void)slots, (void)n, (void)sinks, (void)out, (void)scratch,
        (void)prefetch;
    return false;
#endif
}

bool attend_chunk_rows_in_place(const LpChunkRows& rows, const uint16_t* k_head, const uint16_t* v_head,
                                const int64_t* slots, std::vector<float>& scratch) {
#if defined(__AVX512F__)
    const LpConfig& c = *rows.c;
    F16PoolRows keys{k_head, slots, c.head_dim_k, zero_halves}, values{v_head, slots, c.head_dim_v, zero_halves};
    const int64_t n_max = *std::max_element(rows.n, rows.n + rows.count);
    return with_heads(rows.count * (c.n_heads / c.n_kv_heads), [&](auto heads) {
        constexpr int H = decltype(heads)::value;
        attend_chunk_heads<H>(rows, n_max, 0, values, scratch, [&](const float* const* qs, float* const* ss) {
            score_keys_heads16<H>(qs, keys, n_max, c.head_dim_k, c.attn_scale, ss, values, rows.prefetch);
        });
    });
#else
    (void)rows, (void)k_head, (void)v_head, (void)slots, (void)scratch;
    return false;
#endif
}

void transpose_keys(const uint16_t* k_head, const int64_t* slots, int64_t n, int d, uint16_t* kt) {
    const int64_t padded = (int64_t)transposed_keys(n, d) / d;
    for (int64_t j = 0; j < padded; j++) {
        uint16_t* column = kt + (j / KEY_BLOCK) * KEY_BLOCK * d + j % KEY_BLOCK;
        const uint16_t* row = j < n ? k_head + slots[j] * d : nullptr;
        for (int i = 0; i < d; i++) column[(int64_t)i * KEY_BLOCK] = row ? row[i] : 0;
    }
}

bool attend_chunk_rows_transposed(const LpChunkRows& rows, const uint16_t* kt, int64_t skip, const uint16_t* v_head,
                                  const int64_t* slots, std::vector<float>& scratch) {
#if defined(__AVX512F__)
    // The rows' scores from the chunk's transposed keys, the longest row's span of blocks.
    const LpConfig& c = *rows.c;
    const F16PoolRows values{v_head, slots, c.head_dim_v, zero_halves};
    const TransposedSpan span = transposed_span(kt, skip, *std::max_element(rows.n, rows.n + rows.count), c.head_dim_k);
    return with_heads(rows.count * (c.n_heads / c.n_kv_heads), [&](auto heads) {
        constexpr int H = decltype(heads)::value;
        attend_chunk_heads<H>(rows, span.keys(), span.offset, values, scratch,
                              [&](const float* const* qs, float* const* ss) {
                                  score_keys_transposed<H>(qs, span.blocks, span.n_blocks, c.head_dim_k, c.attn_scale, ss);
                              });
    });
#else
    (void)rows, (void)kt, (void)skip, (void)v_head, (void)slots, (void)scratch;
    return false;
#endif
}

bool attend_rows_transposed(const LpConfig& c, const float* q, const uint16_t* kt, int64_t skip, int64_t n,
                            const uint16_t* v_head, const int64_t* slots, const float* sinks, float* out,
                            std::vector<float>& scratch) {
#if defined(__AVX512F__)
    attend_rows_transposed_in(c, q, kt, skip, n, F16PoolRows{v_head, slots, c.head_dim_v, zero_halves}, sinks, out, scratch);
    return true;
#else
    (void)c, (void)q, (void)kt, (void)skip, (void)n, (void)v_head, (void)slots, (void)sinks, (void)out, (void)scratch;
    return false;
#endif
}

}  // namespace lp
