// The encoders' attention (BERT, nomic-bert): every row of a sequence sees every row of it, no
// cache, no mask. Sequences of one length are computed side by side, one (sequence, head) a task.
//
// Each score is q . k summed over the head's dimensions in order (one fused multiply-add chain),
// then times the scale; softmax as the forward's (exp_approx, sum_of: one order in every build);
// each output value is sum over the keys in order of p_j v_j (one chain), then times 1 / sum. The
// loops run over 16 keys or 16 dimensions at a time, each lane its own chain, which GCC vectorises
// as they are written: every build (generic, avx2, avx512vnni) gives the same bits, and a
// sequence's result depends on that sequence alone.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "boundary.h"
#include "forward.h"
#include "linear.h"
#include "pool.h"
#include "vec.h"

namespace lp {
namespace {

constexpr int kLanes = 16;  // keys scored, or output values accumulated, at a time
constexpr int kRows = 4;    // query rows sharing each key's or value's loads

// 16 float lanes, each its own chain of fused multiply-adds: one AVX-512 vector, two AVX2 ones,
// or 16 floats (the same operations lane by lane, so the same bits).
struct Lanes16 {
#if defined(__AVX512F__)
    __m512 v;
    static Lanes16 zero() { return {_mm512_setzero_ps()}; }
    static Lanes16 load(const float* p) { return {_mm512_loadu_ps(p)}; }
    void fma(float a, const Lanes16& b) { v = _mm512_fmadd_ps(_mm512_set1_ps(a), b.v, v); }
    void store_times(float s, float* p) const { _mm512_storeu_ps(p, _mm512_mul_ps(v, _mm512_set1_ps(s))); }
#elif defined(__AVX2__) && defined(__FMA__)
    __m256 lo, hi;
    static Lanes16 zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
    static Lanes16 load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
    void fma(float a, const Lanes16& b) {
        const __m256 a8 = _mm256_set1_ps(a);
        lo = _mm256_fmadd_ps(a8, b.lo, lo);
        hi = _mm256_fmadd_ps(a8, b.hi, hi);
    }
    void store_times(float s, float* p) const {
        const __m256 s8 = _mm256_set1_ps(s);
        _mm256_storeu_ps(p, _mm256_mul_ps(lo, s8));
        _mm256_storeu_ps(p + 8, _mm256_mul_ps(hi, s8));
    }
#else
    float v[kLanes];
    static Lanes16 zero() { return {}; }
    static Lanes16 load(const float* p) {
        Lanes16 x;
        for (int l = 0; l < kLanes; l++) x.v[l] = p[l];
        return x;
    }
    void fma(float a, const Lanes16& b) {
        for (int l = 0; l < kLanes; l++) v[l] = std::fma(a, b.v[l], v[l]);
    }
    void store_times(float s, float* p) const {
        for (int l = 0; l < kLanes; l++) p[l] = v[l] * s;
    }
#endif
};

// scores [rows][n_pad] = (q rows . keys) * scale for the 16-key blocks of kt ([d][n_pad]: the
// head's keys transposed, padded with zero keys), two blocks at a time.
template <int R>
void score_rows(const float* const* q, const float* kt, int n_pad, int d, float scale, float* const* scores) {
    for (int j0 = 0; j0 < n_pad; j0 += 2 * kLanes) {
        const bool two = j0 + kLanes < n_pad;
        Lanes16 acc[R][2];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = Lanes16::zero();
        for (int i = 0; i < d; i++) {
            const float* k = kt + (int64_t)i * n_pad + j0;
            const Lanes16 k0 = Lanes16::load(k), k1 = two ? Lanes16::load(k + kLanes) : Lanes16::zero();
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                acc[r][0].fma(q[r][i], k0);
                acc[r][1].fma(q[r][i], k1);
            }
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            acc[r][0].store_times(scale, scores[r] + j0);
            if (two) acc[r][1].store_times(scale, scores[r] + j0 + kLanes);
        }
    }
}

// out rows [rows][d] = sum_j p[r][j] v[j] over the n keys in order, times inv[r]; d a multiple of
// 16, four 16-value slices at a time (a 64-value head in one pass over the keys).
template <int R>
void weigh_rows(const float* const* p, const float* v, int n, int d, const float* inv, float* const* out) {
    constexpr int S = 4;
    for (int c0 = 0; c0 < d; c0 += S * kLanes) {
        const int slices = std::min(S, (d - c0) / kLanes);
        Lanes16 acc[R][S];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++)
            for (int c = 0; c < S; c++) acc[r][c] = Lanes16::zero();
        for (int j = 0; j < n; j++) {
            const float* vj = v + (int64_t)j * d + c0;
            Lanes16 vs[S];
#pragma GCC unroll 4
            for (int c = 0; c < S; c++) vs[c] = c < slices ? Lanes16::load(vj + c * kLanes) : Lanes16::zero();
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                const float pj = p[r][j];
#pragma GCC unroll 4
                for (int c = 0; c < S; c++) acc[r][c].fma(pj, vs[c]);
            }
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; r++)
            for (int c = 0; c < slices; c++) acc[r][c].store_times(inv[r], out[r] + c0 + c * kLanes);
    }
}

struct Scratch {
    std::vector<float> kt, v, scores;
};

// One head of one sequence: rows [first, first + n) of q, k, v (head h's d columns).
void attend_sequence(const float* q, const float* k, const float* v, int64_t ld_q, int64_t ld_k, int64_t ld_v,
                     int64_t first, int n, int h, int d, float scale, float* out, int64_t ld_out, Scratch& s) {
    const int n_pad = (n + kLanes - 1) / kLanes * kLanes;
    float* kt = grow(s.kt, (size_t)d * n_pad);
    float* vs = grow(s.v, (size_t)n * d);
    float* scores = grow(s.scores, (size_t)kRows * n_pad);
    for (int i = 0; i < d; i++) std::fill(kt + (int64_t)i * n_pad + n, kt + (int64_t)(i + 1) * n_pad, 0.0f);
    for (int j = 0; j < n; j++) {
        const float* kj = k + (first + j) * ld_k + (int64_t)h * d;
        for (int i = 0; i < d; i++) kt[(int64_t)i * n_pad + j] = kj[i];
        std::copy(v + (first + j) * ld_v + (int64_t)h * d, v + (first + j) * ld_v + (int64_t)(h + 1) * d,
                  vs + (int64_t)j * d);
    }
    for (int r0 = 0; r0 < n; r0 += kRows) {
        const int rows = std::min(kRows, n - r0);
        const float* qr[kRows];
        float* sr[kRows];
        float* orow[kRows];
        float inv[kRows];
        for (int r = 0; r < kRows; r++) {
            const int row = std::min(r0 + r, n - 1);  // a short tile repeats its last row, unused
            qr[r] = q + (first + row) * ld_q + (int64_t)h * d;
            sr[r] = scores + (int64_t)r * n_pad;
            orow[r] = out + (first + row) * ld_out + (int64_t)h * d;
        }
        score_rows<kRows>(qr, kt, n_pad, d, scale, sr);
        for (int r = 0; r < kRows; r++) {
            const float mx = max_of(sr[r], n);
            for (int j = 0; j < n; j++) sr[r][j] = exp_approx(sr[r][j] - mx);
            inv[r] = 1.0f / sum_of(sr[r], n);
        }
        if (rows == kRows) {
            weigh_rows<kRows>(sr, vs, n, d, inv, orow);
        } else {
            for (int r = 0; r < rows; r++) weigh_rows<1>(sr + r, vs, n, d, inv + r, orow + r);
        }
    }
}

}  // namespace
}  // namespace lp

extern "C" int32_t lp_attend_full(const float* q, const float* k, const float* v, int64_t ld_q, int64_t ld_k,
                                  int64_t ld_v, int32_t n_seqs, int32_t n, int32_t n_heads, int32_t head_dim,
                                  float scale, float* out, int64_t ld_out) {
    if (n_seqs < 0 || n < 1 || n_heads < 1 || head_dim < 1 || head_dim % lp::kLanes != 0 || !q || !k || !v || !out)
        return lp::fail(LP_ERR_ARGUMENT, "lp_attend_full: %d sequences of %d rows, %d heads of %d (a multiple of %d)",
                        n_seqs, n, n_heads, head_dim, lp::kLanes);
    int32_t rc = lp::guarded([&] {
        lp::parallel_for((int64_t)n_seqs * n_heads, [&](int64_t task, int) {
            thread_local lp::Scratch scratch;
            const int64_t seq = task / n_heads;
            const int h = (int)(task % n_heads);
            lp::attend_sequence(q, k, v, ld_q, ld_k, ld_v, seq * n, n, h, head_dim, scale, out, ld_out, scratch);
        });
        return (int32_t)LP_OK;
    });
    lp::pool_park();
    return rc;
}
