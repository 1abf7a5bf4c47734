/* Low-bit weight x 8-bit activation matrix multiplication (llama.cpp style, batch-invariant).

Activations are quantized per block of 32 to int8 with a float scale (and, for the k-quants'
super-blocks, per 256 as well); each weight block's dot product with them is an exact integer
sum, and the float scales are applied after it (once per 256 k for the k-quants), in one
fixed order per output element (see qmatmul.cpp), so every build (generic, avx2, avx512vnni)
gives bit-identical results, and a row's result never depends on the other rows or columns.

Packed weights (written by lamplight/native/pack.py; one layout for every build):
  a 64-byte header (LP_HEADER_BYTES), then the columns in groups of LP_COL_GROUP = 16 (the last
  group padded with zero columns), each group a run of block records in k order:
    [quants][16 float32 scales][16 float32 mins, only with LP_FLAG_MIN]
  or, with LP_FLAG_SUPER (the k-quants' own scales: k a multiple of 256), a run of super-blocks of
  256 k: [16 float32 d, or with LP_FLAG_MIN 16 fp16 d and 16 fp16 dmin: one 64-byte line][each
  block's 16 int8 scale factors][each block's 16 int8 min factors, with LP_FLAG_MIN][each
  block's quants]; a block's scale is d * factor (exact in float32), so both layouts give the
  same bits.
  The quants of one record hold, for each quad of 4 consecutive k, a 64-byte chunk with the 16
  columns' 4 values each (byte 4*c + i = column c, k = 4*quad + i): a chunk against 4 activation
  bytes broadcast gives the 16 columns' partial sums in 16 int32 lanes (vpdpbusd / maddubs).
  LP_W4    block 32, 4-bit q in 0..15; 256 bytes: chunk t (t < 4) holds quad t in its low nibbles
           and quad t + 4 in its high nibbles. w = scale * (q - 8 * zero8) + min.
  LP_W8    block 16, int8 q; 256 bytes (4 chunks). w = scale * q (+ min).
  LP_W8_32 block 32, int8 q; 512 bytes (8 chunks). w = scale * q (+ min).
  LP_W6    block 16, q + 32 in 0..63 in 192 bytes: chunk 0 holds the low 4 bits of quads 0 (low
           nibbles) and 2 (high), chunk 1 those of quads 1 and 3, chunk 2 the high 2 bits of quad
           j at bits 2j. w = scale * q (no mins).
The header's int32 at LP_HEADER_FLAGS_OFFSET holds the flags (LP_FLAG_MIN, LP_FLAG_ZERO8, LP_FLAG_SUPER). */
#ifndef LAMPLIGHT_QMATMUL_H
#define LAMPLIGHT_QMATMUL_H

#include <stddef.h>
#include <stdint.h>

#include "boundary.h"
#include "qacts.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { LP_W4 = 1, LP_W8 = 2, LP_W8_32 = 3, LP_W6 = 4 };
enum { LP_FLAG_MIN = 1, LP_FLAG_ZERO8 = 2, LP_FLAG_SUPER = 4 };
enum { LP_HEADER_BYTES = 64, LP_HEADER_FLAGS_OFFSET = 16, LP_COL_GROUP = 16 };

typedef struct lp_qweight {
    int32_t format;  /* LP_W4, LP_W8, LP_W8_32 or LP_W6 */
    int32_t n;       /* output features (columns of y) */
    int32_t k;       /* input features, a multiple of 32 */
    int32_t reserved;
    const uint8_t* data; /* packed by lamplight/native/pack.py, 64-byte aligned */
} lp_qweight;

/* y[r*ldy + c] = sum_i x[r,i] w[c,i] for r < n_rows and col_begin <= c < col_end (other columns
untouched). Returns LP_OK, or LP_ERR_ARGUMENT for an unknown format, a k that is not a multiple of
32 or a column range outside [0, n) or off the column groups (nothing written then); the caller
sizes acts (n_rows rows of lp_qacts_row_bytes(k)) and y. */
// How many bytes ahead one-row tiles (a decode row) ask for their weights, 0 for not at all. A
// property of the machine: on some CPUs the hardware prefetchers alone stream one row's weights
// fastest, on others a software prefetch reads them 1.2-1.5x faster, at a distance that differs
// by CPU (qmatmul.cpp). Off until set; bytes are clamped to [0, LP_MAX_ONE_ROW_PREFETCH] and
// rounded down to whole lines. lamplight/native/prefetch.py times its candidates once per process
// and keeps the fastest. Prefetching changes no result. Returns the previous distance.
#define LP_MAX_ONE_ROW_PREFETCH 65536
int32_t lp_set_one_row_prefetch(int32_t bytes);
// How many groups of columns one-row tiles read side by side: each group is one stream of memory,
// and on some CPUs a core reads several streams at once faster than one. 1 until set; a build
// with side-by-side tiles (AVX-512) keeps LP_STREAM_GROUPS (4) for any groups >= that, every
// other value and build 1. Changes no result. Returns the previous setting.
int32_t lp_set_one_row_streams(int32_t groups);

int32_t lp_qmatmul(const lp_qweight* w, const uint8_t* acts, int32_t n_rows, float* y, int64_t ldy,
                   int32_t col_begin, int32_t col_end);
/* col_begin must be a multiple of this (col_end too, unless it is n). */
int32_t lp_qweight_col_align(int32_t format);
/* "avx512vnni", "avx2" or "generic": the code path this build runs. */
const char* lp_isa(void);

#ifdef __cplusplus
}

namespace lp {
/* The part of an activation row the weight's tiles read. */
int acts_parts(const lp_qweight* w);
/* lp_qmatmul without its argument checks and exception guard, for the forward pass (its callers
pass valid weights; an exception reaches the forward's own guard). y[r * ldy + c - y_col0] is
column c of row r (y_col0 = col_begin: a block of the output's columns of its own). */
void qmatmul(const lp_qweight* w, const uint8_t* acts, int32_t n_rows, float* y, int64_t ldy, int32_t col_begin,
             int32_t col_end, int32_t y_col0 = 0);
}  // namespace lp
#endif

#endif
