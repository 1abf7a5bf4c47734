// Quantized activation rows: the 8-bit input of the low-bit matmul (qmatmul.h), their layout
// (the tiles in qmatmul.cpp read it) and their quantization (qacts.cpp).
#pragma once
#include <cstddef>
#include <cstdint>

extern "C" {
// Bytes of one quantized activation row of width k (a multiple of 64).
size_t lp_qacts_row_bytes(int32_t k);
// Quantize n_rows rows of x (row stride ldx floats) into acts (rows at stride lp_qacts_row_bytes(k)).
void lp_quantize_rows(const float* x, int64_t ldx, int32_t k, int32_t n_rows, uint8_t* acts);
}

namespace lp {
// The parts of a quantized activation row: per block of 32 (the block formats' tiles read them)
// and per super-block of 256 (the k-quants' with LP_FLAG_SUPER). lp_quantize_rows writes both.
enum { ACTS_BLOCKS = 1, ACTS_SUPER = 2, ACTS_ALL = 3 };
// lp_quantize_rows writing only `parts` of each row (the others' bytes left as they were).
void quantize_rows(const float* x, int64_t ldx, int32_t k, int32_t n_rows, uint8_t* acts, int parts);
// Columns [c0, c1) of an activation row of width k (x: their values) quantized into out (a row of
// lp_qacts_row_bytes(k)): qacts::quantize_range.
void quantize_columns(const float* x, int32_t k, int32_t c0, int32_t c1, uint8_t* out, int parts);
}  // namespace lp

namespace lp::qacts {

constexpr int kActBlock = 32;  // values per activation block (the block formats' scales)
constexpr int kSuper = 256;    // values per super-block (the k-quants' scales, LP_FLAG_SUPER)

// One quantized row of width k (nb = k / 32 blocks, ns = k / 256 super-blocks), every array
// 4-byte aligned. First per block of 32 (the formats with float block scales):
//   q   int8[k]     round-half-even(x * 127 / amax) per block of 32
//   qu  uint8[k]    q + 128 (the unsigned operand of vpdpbusd against signed weights)
//   d   float[nb]   amax / 127
//   s   float[nb]   d * (float)sum(q of the block)      (min term of 32-blocks)
//   s16 float[2nb]  d * (float)sum(q of each half)      (min term of 16-blocks)
//   sum int32[nb]   sum(q of the block)                 (LP_FLAG_ZERO8's -8 * sum)
//   sum16 int32[2nb] sum(q of each half)                (LP_W6's -32 * sum)
// then the same per super-block of 256 (FLAG_SUPER: the k-quants, as llama.cpp's Q8_K):
//   kq, kqu int8/uint8[k], kd float[ns], ksum16 int32[k/16] (LP_W6's -32 * sum), and kp16
//   int16[k/16], kp32 int16[k/32]: the blocks' sums as int16 (|sum| <= 32 * 127), two adjacent
//   blocks' read as one int32 pair (the mins' term), and km32s8 int32[k/8]: -32 * the sum of
//   each 8 q (where the AVX-512 LP_W6 tiles start each half-block's integer sum).
struct ActsRow {
    const int8_t* q;
    const uint8_t* qu;
    const float* d;
    const float* s;
    const float* s16;
    const int32_t* sum;
    const int32_t* sum16;
    // per super-block of 256
    const int8_t* kq;
    const uint8_t* kqu;
    const float* kd;
    const int32_t* ksum16;
    const int16_t* kp16;
    const int16_t* kp32;
    const int32_t* km32s8;
};

// One row's bytes (a multiple of 64: rows stay line-aligned).
size_t acts_bytes(int k);
// The arrays of the row at `base`.
ActsRow acts_row(const uint8_t* base, int k);
// The row as the k-quant tiles read it: the super-block quants where the block formats' tiles
// read theirs (q, qu, sum16), so one block_sums serves both (sum, LP_FLAG_ZERO8's, is never a
// k-quant's).
ActsRow super_view(const ActsRow& a);
// Columns [c0, c1) of a row (x: their values): the parts `parts` asks for (lp::ACTS_BLOCKS,
// lp::ACTS_SUPER; the others' bytes are left as they were), and with the row's last columns its
// padding. c0 and c1 are multiples of 256, so the range's blocks and super-blocks are whole, or
// c0 = 0 and c1 = k (a k that is not a multiple of 256 has a tail to clear).
void quantize_range(const float* x, int k, int c0, int c1, uint8_t* out, int parts);

}  // namespace lp::qacts
