// LayerNorm of a residual sum, row by row on the pool's threads (the encoders' post-norm layers:
// x = LN(x + branch)), in one pass instead of PyTorch's add and layer_norm, each with its OpenMP
// team. As ggml's norm: the row's mean, its centred values, their mean square (the biased
// variance), then times 1 / sqrt(variance + eps), the weight and the bias. Sums in vec.h's fixed
// orders, no contraction: the same bits on every build, a row's result its own.
#include <cmath>
#include <cstdint>

#include "boundary.h"
#include "forward.h"
#include "linear.h"
#include "pool.h"
#include "vec.h"

namespace {

void add_norm_row(const float* x, const float* residual, const float* weight, const float* bias, float eps, int n,
                  float* out) {
    for (int i = 0; i < n; i++) out[i] = residual ? x[i] + residual[i] : x[i];
    const float mean = lp::sum_of(out, n) / (float)n;
    for (int i = 0; i < n; i++) out[i] -= mean;
    const float scale = 1.0f / std::sqrt(lp::dot(out, out, n) / (float)n + eps);
    for (int i = 0; i < n; i++) out[i] = out[i] * scale * weight[i] + (bias ? bias[i] : 0.0f);
}

}  // namespace

extern "C" int32_t lp_add_layer_norm(const float* x, const float* residual, const float* weight, const float* bias,
                                     float eps, int64_t n_rows, int32_t n, float* out) {
    if (n_rows < 0 || n < 1 || !weight || (n_rows > 0 && (!x || !out)))
        return lp::fail(LP_ERR_ARGUMENT, "lp_add_layer_norm: %lld rows of %d, a null input, weight or output",
                        (long long)n_rows, n);
    int32_t rc = lp::guarded([&] {
        lp::for_rows((int)n_rows, [&](int r, int) {
            const int64_t at = (int64_t)r * n;
            add_norm_row(x + at, residual ? residual + at : nullptr, weight, bias, eps, n, out + at);
        });
        return (int32_t)LP_OK;
    });
    lp::pool_park();
    return rc;
}
