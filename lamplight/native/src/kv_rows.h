// KV rows as the pool stores them: float32, fp16, bf16, or ggml's blocks of 32 values
// (lamplight/state/kv_quant.py is the Python side of the same formats, to the bit).
#pragma once
#include <cstdint>

namespace lp {

constexpr int KV_QBLOCK = 32;  // values per block of a quantized type

bool kv_quantized(int type);  // one of the block types (LP_KV_Q8_0 ... LP_KV_IQ4_NL)
bool kv_type_known(int type);

// One row of `n` values at value `index` of a pool of `type` (for block types, `index` and `n`
// are multiples of 32), read into float32 or written from it.
void load_kv(const void* base, int type, int64_t index, int n, float* out);
void store_kv(void* base, int type, int64_t index, int n, const float* in);

}  // namespace lp
