// Elementwise functions looked up in a table indexed by the input rounded to fp16, as ggml's CPU
// computes GELU (BERT's feed-forward, gemma2): one pass over the values on the pool's threads,
// instead of rounding, indexing and selecting in three. Every build rounds to the same fp16 bits
// (F16C, or half.h's float_to_half), so the results are the same bits on each.
#include <cstdint>

#include "boundary.h"
#include "forward.h"
#include "half.h"
#include "pool.h"
#if defined(__AVX2__) && defined(__F16C__)
#include <immintrin.h>
#endif

namespace {

constexpr int64_t kChunk = 16384;  // values a task looks up

void lookup(const float* table, const float* x, int64_t n, float identity_from, float* y) {
    int64_t i = 0;
#if defined(__AVX2__) && defined(__F16C__)
    const __m256 limit = _mm256_set1_ps(identity_from);
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        const __m256i index = _mm256_cvtepu16_epi32(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
        // (Eight plain loads instead of the gather: 29 against 24 ms for 12M values, Zen 4.)
        const __m256 looked = _mm256_i32gather_ps(table, index, 4);
        _mm256_storeu_ps(y + i, _mm256_blendv_ps(looked, v, _mm256_cmp_ps(v, limit, _CMP_GE_OQ)));
    }
#endif
    for (; i < n; i++) y[i] = x[i] >= identity_from ? x[i] : table[lp::float_to_half(x[i])];
}

}  // namespace

extern "C" int32_t lp_fp16_lookup(const float* table, const float* x, int64_t n, float identity_from, float* y) {
    if (!table || n < 0 || (n > 0 && (!x || !y))) return lp::fail(LP_ERR_ARGUMENT, "lp_fp16_lookup: a null table, input or output");
    int32_t rc = lp::guarded([&] {
        lp::parallel_for((n + kChunk - 1) / kChunk, [&](int64_t task, int) {
            int64_t begin = task * kChunk, count = n - begin < kChunk ? n - begin : kChunk;
            lookup(table, x + begin, count, identity_from, y + begin);
        });
        return (int32_t)LP_OK;
    });
    lp::pool_park();
    return rc;
}
