// Linear layers: a step's matmuls over packed (qmatmul.h) and dense (forward.h) weights, split
// into column tasks over the pool. A row's result depends only on that row (every kernel is
// row-invariant, and the column split changes no sum), so any batch gives the same bits.
#include "linear.h"

#include <algorithm>
#include <cstring>

#include "boundary.h"
#include "half.h"
#include "qmatmul.h"
#include "vec.h"
#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace lp {
namespace {

using std::vector;

int64_t column_align(const LpLinearPart& part) { return part.dense ? 8 : lp_qweight_col_align(part.w.format); }

// About how many bytes of weights one column of the part holds (quants and scales).
int64_t column_bytes(const LpLinearPart& part) {
    const int64_t k = part.w.k;
    switch (part.w.format) {
        case LP_DENSE_F32: return 4 * k;
        case LP_DENSE_F16: case LP_DENSE_BF16: return 2 * k;
        case LP_W4: return k / 2 + k / 4;   // 4-bit quants, a float scale (and min) per 32
        case LP_W6: return 3 * k / 4 + k / 4;
        default: return k + k / 4;          // 8-bit quants
    }
}

// Quantized activations for `n_rows` rows of x: the `parts` of each row the linear's packed
// weights read (acts_parts: per 32 and/or per 256; a Q8_0 linear needs no super-blocks, a
// k-quant one no blocks of 32, each about half the work).
void quantize(const float* x, int n_rows, int k, int parts, vector<uint8_t>& acts) {
    size_t row_bytes = lp_qacts_row_bytes(k);
    uint8_t* dst = grow(acts, row_bytes * (size_t)n_rows);
    const int64_t rows_per_task = 8;
    lp::parallel_for((n_rows + rows_per_task - 1) / rows_per_task, [&](int64_t task, int) {
        int begin = (int)(task * rows_per_task), count = std::min<int>(rows_per_task, n_rows - begin);
        lp::quantize_rows(x + (int64_t)begin * k, k, k, count, dst + row_bytes * begin, parts);
    });
}

// Dense fp16/bf16 weights (forward.h) lie in tiles of LP_DENSE_TILE_COLS columns x 16 k: for
// each group of 4 columns (the last padded with zeros), for each 16 k, the 4 columns' 16 values.
// One row then reads a group's values in one sequential stream, which the hardware prefetches.
constexpr int kTileCols = LP_DENSE_TILE_COLS, kTileK = 16;
// Rows that share each widened value (dot_tile): 2 x 4 x 2 accumulators fit AVX-512's 32 registers.
constexpr int kTileRows = 2;

inline const uint16_t* dense_tile(const LpLinearPart& part, int group) {
    return (const uint16_t*)part.dense + (int64_t)group * kTileCols * part.w.k;
}

#if defined(__AVX2__) && defined(__F16C__)
template <int FORMAT>
inline __m256 widen8(const uint16_t* p) {
    __m128i h = _mm_loadu_si128((const __m128i*)p);
    if (FORMAT == LP_DENSE_BF16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}

// dot(x row r, column j widened) for R rows (at stride k) and the 4 columns of one tile group, in
// dot()'s order for each pair (two 8-lane accumulators over 16 k at a time, then its final tree; k
// is a multiple of 16, so no tail): the rows share each widened value.
template <int FORMAT, int R>
void dot_tile(const float* x, const uint16_t* tile, int k, float* out /* [R][4] */) {
    __m256 a0[R][kTileCols], a1[R][kTileCols];
    for (int r = 0; r < R; r++)
        for (int j = 0; j < kTileCols; j++) a0[r][j] = a1[r][j] = _mm256_setzero_ps();
    for (int i = 0; i < k; i += kTileK, tile += kTileCols * kTileK) {
        __m256 x0[R], x1[R];
        for (int r = 0; r < R; r++) {
            x0[r] = _mm256_loadu_ps(x + (int64_t)r * k + i);
            x1[r] = _mm256_loadu_ps(x + (int64_t)r * k + i + 8);
        }
        for (int j = 0; j < kTileCols; j++) {
            __m256 w0 = widen8<FORMAT>(tile + kTileK * j), w1 = widen8<FORMAT>(tile + kTileK * j + 8);
            for (int r = 0; r < R; r++) {
                a0[r][j] = _mm256_fmadd_ps(x0[r], w0, a0[r][j]);
                a1[r][j] = _mm256_fmadd_ps(x1[r], w1, a1[r][j]);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int j = 0; j < kTileCols; j++) {
            __m256 acc = _mm256_add_ps(a0[r][j], a1[r][j]);
            __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
            s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            s = _mm_add_ss(s, _mm_movehdup_ps(s));
            out[r * kTileCols + j] = _mm_cvtss_f32(s);
        }
}

template <int R>
inline void dot_tile_as(int format, const float* x, const uint16_t* tile, int k, float* out) {
    if (format == LP_DENSE_BF16)
        dot_tile<LP_DENSE_BF16, R>(x, tile, k, out);
    else
        dot_tile<LP_DENSE_F16, R>(x, tile, k, out);
}

#if defined(__AVX512F__)
// 16 values of a tile's column, fp16 or bf16, widened exactly to float32.
template <int FORMAT>
inline __m512 column16(const uint16_t* tile, int64_t at) {
    __m256i h = _mm256_loadu_si256((const __m256i*)(tile + at));
    if (FORMAT == LP_DENSE_BF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}

// dot_tile's sums in 16-lane vectors: lanes 0-7 carry its first accumulator (k i..i+7 of each 16),
// lanes 8-15 its second, and the halves then add and reduce as there, so every output has dot_tile's
// bits (and dot()'s: the AVX2 and generic builds'). Up to kWideTileRows rows share each column's
// values: a prompt's or an encoder batch's thousands of rows run near the FMA units' peak.
constexpr int kWideTileRows = 6;  // 6 x 4 accumulators + 6 rows + 1 column: 31 of 32 registers

// dot_tile's final sums of four 16-lane accumulators at once (lane l of column j's is a0[l] for
// l < 8, a1[l - 8] after): v = a0 + a1; s = v[0:4] + v[4:8]; t = (s0 + s2, s1 + s3); t0 + t1,
// each column's in its own 128-bit quarter, the same additions as dot_tile's.
inline __m128 reduce_four(const __m512 a[4]) {
    // Quarters [a_j.q0, a_j.q1, a_j+1.q0, a_j+1.q1] + [a_j.q2, a_j.q3, a_j+1.q2, a_j+1.q3]: v_j | v_j+1.
    __m512 v01 = _mm512_add_ps(_mm512_shuffle_f32x4(a[0], a[1], 0x44), _mm512_shuffle_f32x4(a[0], a[1], 0xEE));
    __m512 v23 = _mm512_add_ps(_mm512_shuffle_f32x4(a[2], a[3], 0x44), _mm512_shuffle_f32x4(a[2], a[3], 0xEE));
    // [v0 lo, v1 lo, v2 lo, v3 lo] + [v0 hi, v1 hi, v2 hi, v3 hi]: s_j in quarter j.
    __m512 s = _mm512_add_ps(_mm512_shuffle_f32x4(v01, v23, 0x88), _mm512_shuffle_f32x4(v01, v23, 0xDD));
    __m512 t = _mm512_add_ps(s, _mm512_permute_ps(s, 0xEE));   // + (s2, s3, s2, s3): movehl
    __m512 u = _mm512_add_ps(t, _mm512_movehdup_ps(t));        // + (t1, t1, t3, t3)
    return _mm512_castps512_ps128(_mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), u));
}

template <int FORMAT, int R>
void dot_tile16(const float* x, const uint16_t* tile, int k, float* out /* [R][4] */) {
    __m512 a[R][kTileCols];
    for (int r = 0; r < R; r++)
        for (int j = 0; j < kTileCols; j++) a[r][j] = _mm512_setzero_ps();
    for (int i = 0; i < k; i += kTileK) {
        __m512 xr[R];
        // The weights' next lines asked for 4 KiB ahead: a few rows' FMAs are too short for the
        // hardware's prefetch to keep up (8 rows of an 8192 x 2048 F16 weight: 1.2 against 1.6 ms
        // with none), and 2 KiB still left them waiting (4, 8 and 16 rows of it, weights from
        // DRAM, Zen 5: 16-22% slower than 4 KiB; 6 KiB the same as 4).
        const char* ahead = (const char*)(tile + (int64_t)i * kTileCols) + 4096;
        _mm_prefetch(ahead, _MM_HINT_T0);
        _mm_prefetch(ahead + 64, _MM_HINT_T0);
        for (int r = 0; r < R; r++) xr[r] = _mm512_loadu_ps(x + (int64_t)r * k + i);
        for (int j = 0; j < kTileCols; j++) {
            __m512 w = column16<FORMAT>(tile, (int64_t)i * kTileCols + kTileK * j);
            for (int r = 0; r < R; r++) a[r][j] = _mm512_fmadd_ps(xr[r], w, a[r][j]);
        }
    }
    for (int r = 0; r < R; r++) _mm_storeu_ps(out + r * kTileCols, reduce_four(a[r]));
}

template <int FORMAT>
void dot_tile16_rows(int rows, const float* x, const uint16_t* tile, int k, float* out) {
    switch (rows) {
        case 6: return dot_tile16<FORMAT, 6>(x, tile, k, out);
        case 5: return dot_tile16<FORMAT, 5>(x, tile, k, out);
        case 4: return dot_tile16<FORMAT, 4>(x, tile, k, out);
        case 3: return dot_tile16<FORMAT, 3>(x, tile, k, out);
        case 2: return dot_tile16<FORMAT, 2>(x, tile, k, out);
        default: return dot_tile16<FORMAT, 1>(x, tile, k, out);
    }
}

// The first rows (up to kWideTileRows of the `rows` at x) of one tile group (4 columns) into
// out [rows][4]; returns how many.
inline int row_tile(int format, int rows, const float* x, const uint16_t* tile, int k, float* out) {
    rows = std::min(rows, kWideTileRows);
    if (format == LP_DENSE_BF16)
        dot_tile16_rows<LP_DENSE_BF16>(rows, x, tile, k, out);
    else
        dot_tile16_rows<LP_DENSE_F16>(rows, x, tile, k, out);
    return rows;
}

// y's fp16/bf16 columns [begin, end) for n_rows rows, in tiles of rows (one row alone computes as
// in any tile) that read the columns' groups in turn while their rows stay in L1. (Widening the
// columns once per task instead, to spare the conversions, measured slower: twice the bytes.)
void dense_half_tiles(const LpLinearPart& part, const float* x, int n_rows, float* y, int64_t ldy, int begin,
                      int end) {
    const int k = part.w.k;
    for (int r = 0; r < n_rows;) {
        int done = 0;
        for (int c = begin; c < end; c += kTileCols) {
            float out[kWideTileRows * kTileCols];
            done = row_tile(part.w.format, n_rows - r, x + (int64_t)r * k, dense_tile(part, c / kTileCols), k, out);
            for (int i = 0; i < done; i++)
                for (int j = 0; j < kTileCols && c + j < end; j++) y[(int64_t)(r + i) * ldy + c + j] = out[i * kTileCols + j];
        }
        r += done;
    }
}
#else
// y's fp16/bf16 columns [begin, end) for n_rows rows. With F16C: each tile group straight from its
// values (no buffer), for blocks of rows, a group (4 columns) staying in L1 while the block's rows
// read it.
void dense_half_tiles(const LpLinearPart& part, const float* x, int n_rows, float* y, int64_t ldy, int begin,
                      int end) {
    const int k = part.w.k;
    const int rows_per_block = 32;  // x's rows that stay in L2 while the chunk's groups pass
    for (int r0 = 0; r0 < n_rows; r0 += rows_per_block) {
        int r1 = std::min(n_rows, r0 + rows_per_block);
        for (int c = begin; c < end; c += kTileCols) {
            const uint16_t* tile = dense_tile(part, c / kTileCols);
            for (int r = r0; r < r1;) {
                const int rows = r + kTileRows <= r1 ? kTileRows : 1;
                float out[kTileRows * kTileCols];
                if (rows == kTileRows)
                    dot_tile_as<kTileRows>(part.w.format, x + (int64_t)r * k, tile, k, out);
                else
                    dot_tile_as<1>(part.w.format, x + (int64_t)r * k, tile, k, out);
                for (int i = 0; i < rows; i++, r++)
                    for (int j = 0; j < kTileCols && c + j < end; j++) y[(int64_t)r * ldy + c + j] = out[i * kTileCols + j];
            }
        }
    }
}
#endif
#else
inline float widen1(int format, uint16_t h) {
    return format == LP_DENSE_F16 ? lp::half_to_float(h) : lp::bf16_to_float(h);
}

// Column c of a dense fp16 or bf16 weight as float32 (exact conversions) into `out`: the builds
// without F16C widen a column once for a block of rows.
void widen_column(const LpLinearPart& part, int c, float* out) {
    const int k = part.w.k, format = part.w.format;
    const uint16_t* src = dense_tile(part, c / kTileCols) + (c % kTileCols) * kTileK;
    for (int i = 0; i < k; i += kTileK, src += kTileCols * kTileK)
        for (int t = 0; t < kTileK; t++) out[i + t] = widen1(format, src[t]);
}

void dense_half_tiles(const LpLinearPart& part, const float* x, int n_rows, float* y, int64_t ldy, int begin,
                      int end) {
    const int k = part.w.k;
    thread_local vector<float> column;
    float* wide = grow(column, (size_t)k);
    const int rows_per_block = 16;  // x's rows that stay in cache while a column is reused
    for (int r0 = 0; r0 < n_rows; r0 += rows_per_block) {
        int r1 = std::min(n_rows, r0 + rows_per_block);
        for (int c = begin; c < end; c++) {
            widen_column(part, c, wide);
            for (int r = r0; r < r1; r++) y[(int64_t)r * ldy + c] = dot(x + (int64_t)r * k, wide, k);
        }
    }
}
#endif

// y[r, c] = dot(x row r, column c) for the chunk's columns: float32 columns read in place, fp16 and
// bf16 ones widened exactly (on the fly from the tiles; builds without F16C into a buffer, once
// per block of rows), so every format, build and row count adds in dot()'s one order.
void dense_columns(const LpLinearPart& part, const float* x, int n_rows, float* y, int64_t ldy, int begin, int end) {
    const int k = part.w.k;
    if (part.w.format == LP_DENSE_F32) {
        const float* w = (const float*)part.dense;
        for (int r = 0; r < n_rows; r++)
            for (int c = begin; c < end; c++) y[(int64_t)r * ldy + c] = dot(x + (int64_t)r * k, w + (int64_t)c * k, k);
        return;
    }
    dense_half_tiles(part, x, n_rows, y, ldy, begin, end);
}



// The step's LoRA deltas on y, row by row in a fixed order (float32, like the adapters).
void add_loras(const LpLinear& lin, const float* x, int n_rows, float* y, const float* scales) {
    if (!lin.n_loras || !scales) return;
    int k = lin.parts[0].w.k;
    for_rows(n_rows, [&](int r, int) {
        const float* xr = x + (int64_t)r * k;
        float* yr = y + (int64_t)r * lin.n_out;
        for (int i = 0; i < lin.n_loras; i++) {
            const LpLora& lora = lin.loras[i];
            float s = scales[lora.adapter] * lora.factor;
            if (s == 0.0f) continue;
            float t[LP_MAX_LORA_RANK];
            for (int j = 0; j < lora.rank; j++) t[j] = dot(xr, lora.a + (int64_t)j * k, k);
            for (int c = 0; c < lora.n_out; c++) yr[lora.out_offset + c] += s * dot(lora.b + (int64_t)c * lora.rank, t, lora.rank);
        }
    });
}

}  // namespace

uint8_t* acts_for(vector<uint8_t>& acts, int n_rows, int k) { return grow(acts, lp_qacts_row_bytes(k) * (size_t)n_rows); }

int acts_parts(const LpLinear& lin) {
    int parts = 0;
    for (int p = 0; p < lin.n_parts; p++)
        if (!lin.parts[p].dense) parts |= lp::acts_parts(&lin.parts[p].w);
    return parts;
}

void quantize_row(const float* x, int k, int r, uint8_t* acts, int parts) {
    lp::quantize_rows(x + (int64_t)r * k, k, k, 1, acts + lp_qacts_row_bytes(k) * r, parts);
}

void linear(const LpLinear& lin, const float* x, int n_rows, float* y, vector<uint8_t>& acts, bool quantized,
            const float* lora_scales) {
    int k = lin.parts[0].w.k;
    const int parts = acts_parts(lin);  // 0: every part is dense
    if (parts && !quantized) quantize(x, n_rows, k, parts, acts);
    // Tasks: column chunks of every part, sized so each thread gets several (load balance) and
    // each chunk is a multiple of the kernel's column group, over blocks of rows, the blocks
    // outermost: the threads' chunks then read one block of x (from L3) at a time, not all of x
    // (tens of MiB for an encoder's batch) once per chunk. In a whole block a chunk takes up to
    // 256 KiB of weights (they stay in L2 while the block's rows pass in tiles), so fewer chunks
    // read each row. On 2 Zen 5 cores, 4000 rows: 768 x 768 F16 333-340 GFLOP/s against 265-270,
    // Q8_0 790-900 GOP/s against 680; a 64-document Q8_0 rerank 3.8-4.4 s against 4.2-4.6.
    struct Chunk { int part, begin, end, offset, row_begin, row_end; };
    vector<Chunk> chunks;
    int threads = lp::pool_threads();
    vector<int> offsets(lin.n_parts, 0);
    for (int p = 1; p < lin.n_parts; p++) offsets[p] = offsets[p - 1] + lin.parts[p - 1].w.n;
    const int block_rows = 192;
    const int64_t chunk_bytes = 256 << 10;
    // A decode row streams its weights from memory, and each chunk starts its stream anew. One
    // chunk a thread instead of 8 ran one-row steps of the random 1B Q4_K_M file 2-7% faster
    // (steps of the two builds alternated in one process), 2 a thread 1-2%, and 2 with
    // qmatmul's prefetch of a range's first lines 2-2.5% (the 3B file 4%). 2, so that a thread
    // that finishes first can still take the other's last chunk.
    const int chunks_per_thread = n_rows == 1 ? 2 : 8;
    auto add_chunks = [&](int p, int row_begin, int row_end) {
        const LpLinearPart& part = lin.parts[p];
        int64_t align = column_align(part);
        int64_t target = std::max<int64_t>(align, (int64_t)part.w.n / (threads * chunks_per_thread));
        if (row_end - row_begin == block_rows) target = std::max<int64_t>(target, chunk_bytes / column_bytes(part));
        int64_t step = (target + align - 1) / align * align;
        for (int64_t c = 0; c < part.w.n; c += step)
            chunks.push_back({p, (int)c, (int)std::min<int64_t>(c + step, part.w.n), offsets[p], row_begin, row_end});
    };
    for (int r0 = 0; r0 < n_rows || r0 == 0; r0 += block_rows)
        for (int p = 0; p < lin.n_parts; p++) add_chunks(p, r0, std::min(n_rows, r0 + block_rows));
    const int64_t ldy = lin.n_out;
    lp::parallel_for((int64_t)chunks.size(), [&](int64_t task, int) {
        const Chunk& ch = chunks[task];
        const LpLinearPart& part = lin.parts[ch.part];
        const int rows = ch.row_end - ch.row_begin;
        float* yp = y + ch.offset + (int64_t)ch.row_begin * ldy;
        if (part.dense)
            dense_columns(part, x + (int64_t)ch.row_begin * k, rows, yp, ldy, ch.begin, ch.end);
        else
            lp::qmatmul(&part.w, acts.data() + lp_qacts_row_bytes(k) * ch.row_begin, rows, yp, ldy, ch.begin, ch.end);
        if (lin.bias)
            for (int r = 0; r < rows; r++)
                for (int c = ch.begin; c < ch.end; c++) yp[(int64_t)r * ldy + c] += lin.bias[ch.offset + c];
    });
    add_loras(lin, x, n_rows, y, lora_scales);
}

namespace {

// Output column c of a linear: its part and the part's own column.
struct PartColumn {
    const LpLinearPart* part;
    int column;
};

PartColumn part_column(const LpLinear& lin, int c) {
    int p = 0;
    while (p + 1 < lin.n_parts && c >= lin.parts[p].w.n) c -= lin.parts[p++].w.n;
    return {&lin.parts[p], c};
}

bool all_packed(const LpLinear& lin) {
    for (int p = 0; p < lin.n_parts; p++)
        if (lin.parts[p].dense) return false;
    return true;
}

// gated_linear's tasks: blocks of 64 rows and 256 columns of the gate and the up, whose outputs
// (128 KiB) stay in L2 until the activation and quantization read them. 192 x 512 ran 512-token
// prompts of the random 1B Q4_K_M file 0.5-2% slower (alternated in one process, both orders).
constexpr int kGatedRows = 64, kGatedColumns = 256;
// Steps of fewer rows keep linear and the row-by-row activation: their gate_up output is small
// enough to stay in cache, and one-row and 8-row decode steps of the 1B file ran 1-2.7% slower
// fused (both orders; 16 and 32 rows the same within noise).
constexpr int kGatedMinRows = 64;

}  // namespace

bool gated_fuses(const LpLinear& gate_up, const LpLinear& down, int n_ff, int n_rows) {
    if (n_rows < kGatedMinRows || gate_up.n_out != 2 * n_ff || n_ff % kGatedColumns != 0) return false;
    if (gate_up.bias || gate_up.n_loras || down.n_loras) return false;
    if (!all_packed(gate_up) || !all_packed(down)) return false;  // packed down: quantized input only
    // The gate's columns and the up's each lie in one part.
    return part_column(gate_up, n_ff - 1).part == part_column(gate_up, 0).part &&
           part_column(gate_up, 2 * n_ff - 1).part == part_column(gate_up, n_ff).part;
}

void gated_linear(const LpLinear& gate_up, int n_ff, int n_rows, const uint8_t* acts_in, int parts,
                  uint8_t* acts_out, vector<vector<float>>& scratch, const GatedActivation& activate) {
    const int k = gate_up.parts[0].w.k;
    const size_t in_bytes = lp_qacts_row_bytes(k), out_bytes = lp_qacts_row_bytes(n_ff);
    const int threads = pool_threads();
    if ((int)scratch.size() < threads) scratch.resize(threads);
    const int64_t n_chunks = n_ff / kGatedColumns, n_blocks = (n_rows + kGatedRows - 1) / kGatedRows;
    parallel_for(n_blocks * n_chunks, [&](int64_t task, int thread) {
        const int r0 = (int)(task / n_chunks) * kGatedRows, rows = std::min(kGatedRows, n_rows - r0);
        const int c0 = (int)(task % n_chunks) * kGatedColumns, c1 = c0 + kGatedColumns;
        float* gate = grow(scratch[thread], (size_t)2 * kGatedRows * kGatedColumns);
        float* up = gate + (size_t)kGatedRows * kGatedColumns;
        const uint8_t* in = acts_in + in_bytes * r0;
        const PartColumn g = part_column(gate_up, c0), u = part_column(gate_up, n_ff + c0);
        qmatmul(&g.part->w, in, rows, gate, kGatedColumns, g.column, g.column + (c1 - c0), g.column);
        qmatmul(&u.part->w, in, rows, up, kGatedColumns, u.column, u.column + (c1 - c0), u.column);
        float a[kGatedColumns];
        for (int r = 0; r < rows; r++) {
            activate(gate + (size_t)r * kGatedColumns, up + (size_t)r * kGatedColumns, kGatedColumns, a);
            quantize_columns(a, n_ff, c0, c1, acts_out + out_bytes * (r0 + r), parts);
        }
    });
}

int32_t check_linear(const LpLinear& lin, const char* name, int64_t k, int64_t n_out, int32_t& n_adapters) {
    if (lin.n_parts < 1 || lin.n_parts > LP_MAX_PARTS)
        return lp::fail(LP_ERR_MODEL, "%s: %d parts (1 to %d)", name, lin.n_parts, LP_MAX_PARTS);
    int64_t sum = 0;
    for (int p = 0; p < lin.n_parts; p++) {
        const LpLinearPart& part = lin.parts[p];
        bool packed = part.dense == nullptr;
        if (part.w.k != k || part.w.n < 0 || (packed && (!part.w.data || k % 32 != 0)) ||
            (packed && part.w.format != LP_W4 && part.w.format != LP_W8 && part.w.format != LP_W8_32 &&
             part.w.format != LP_W6) ||
            (!packed && part.w.format != LP_DENSE_F32 && part.w.format != LP_DENSE_F16 &&
             part.w.format != LP_DENSE_BF16) ||
            (!packed && part.w.format != LP_DENSE_F32 && k % 16 != 0))
            return lp::fail(LP_ERR_MODEL, "%s: part %d (format %d, %d x %d, %s) does not take %lld inputs", name, p,
                            part.w.format, part.w.n, part.w.k, packed ? "packed" : "dense", (long long)k);
        sum += part.w.n;
    }
    if (sum != lin.n_out || lin.n_out != n_out)
        return lp::fail(LP_ERR_MODEL, "%s: %lld outputs in its parts, n_out %d, %lld expected", name, (long long)sum,
                        lin.n_out, (long long)n_out);
    if (lin.n_loras < 0 || (lin.n_loras > 0 && !lin.loras))
        return lp::fail(LP_ERR_MODEL, "%s: n_loras %d without adapters", name, lin.n_loras);
    for (int i = 0; i < lin.n_loras; i++) {
        const LpLora& lora = lin.loras[i];
        if (lora.adapter < 0 || lora.rank < 0 || lora.rank > LP_MAX_LORA_RANK || lora.out_offset < 0 || lora.n_out < 0 ||
            (int64_t)lora.out_offset + lora.n_out > lin.n_out || (lora.rank > 0 && (!lora.a || !lora.b)))
            return lp::fail(LP_ERR_MODEL, "%s: LoRA %d (adapter %d, rank %d up to %d, columns %d + %d of %d) is out of range",
                            name, i, lora.adapter, lora.rank, LP_MAX_LORA_RANK, lora.out_offset, lora.n_out, lin.n_out);
        n_adapters = std::max(n_adapters, lora.adapter + 1);
    }
    return LP_OK;
}

}  // namespace lp

extern "C" int32_t lp_linear(const LpLinear* lin, const float* x, int32_t n_rows, float* y) {
    if (!lin || n_rows < 0 || (n_rows > 0 && (!x || !y)))
        return lp::fail(LP_ERR_ARGUMENT, "lp_linear: a null linear, input or output");
    int32_t n_adapters = 0;
    if (int32_t rc = lp::check_linear(*lin, "lp_linear", lin->parts[0].w.k, lin->n_out, n_adapters)) return rc;
    if (lin->n_loras) return lp::fail(LP_ERR_ARGUMENT, "lp_linear: LoRA adapters are the forward's");
    int32_t rc = lp::guarded([&] {
        thread_local std::vector<uint8_t> acts;
        lp::linear(*lin, x, n_rows, y, acts);
        return (int32_t)LP_OK;
    });
    lp::pool_park();
    return rc;
}
