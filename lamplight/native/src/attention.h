// One row's attention for the query heads of one KV group (those sharing a KV head): the kernels
// of the native forward pass, which runs them over a step's rows and KV heads (forward.cpp).
//
// Attention of one row's query heads sharing KV head `g`. Its keys and values are read as fp16
// where they are (the default KV type, AVX2 builds) or converted to float32 first (`n` rows of
// the task's scratch, or once for a chunk's rows), scores are computed eight keys at a time with
// one transposing reduction for the eight (the AVX2 hadd tree; the generic build adds in the
// same order), softmax per head, then each head's output accumulates the values in key order.
// Every step depends only on this row's own keys, so the result is the same in any batch.
#pragma once
#include <stdint.h>

#include <vector>

#include "forward.h"

namespace lp {

// Whether attend_rows_in_place runs on this build (AVX2 and AVX-512 ones); the generic build
// converts the rows with load_rows and runs attend_rows.
#if defined(__AVX2__)
constexpr bool reads_fp16_in_place = true;
#else
constexpr bool reads_fp16_in_place = false;
#endif

// The `n` rows at `slots` of one KV head's part of a pool (type LP_KV_*, that head's rows from
// head_offset) as float32 rows of d values.
void load_rows(const void* base, int type, int64_t head_offset, const int64_t* slots, int64_t n, int d, float* out);

// out [group heads * head_dim_v] for the group's queries q [group heads * head_dim_k] over keys
// [n, head_dim_k] and values [n, head_dim_v] (float32 rows); `sinks`: the group's attention-sink
// logits (one per query head, gpt-oss) or null; `scratch` grows to hold the scores.
void attend_rows(const LpConfig& c, const float* q, const float* keys, const float* values, int64_t n,
                 const float* sinks, float* out, std::vector<float>& scratch);

// attend_rows over an fp16 pool read in place: the KV head's key and value rows from k_head and
// v_head, row j at slots[j]. The same bits as converting them first. False (nothing computed)
// where the build cannot (reads_fp16_in_place). `prefetch`: ask for the rows ahead of the reads,
// for a decode row, whose keys and values are in no cache, or a row of a chunk too short to
// transpose its keys (forward.cpp's kTransposeMinRows) (speed only; attention.cpp's kAheadBytes).
bool attend_rows_in_place(const LpConfig& c, const float* q, const uint16_t* k_head, const uint16_t* v_head,
                          const int64_t* slots, int64_t n, const float* sinks, float* out, std::vector<float>& scratch,
                          bool prefetch);

// Several rows of one chunk (one sequence's consecutive positions, the same first key) for one
// KV head: row r's queries q[r] [group heads * head_dim_k] over its first n[r] keys, into out[r].
struct LpChunkRows {
    const LpConfig* c;
    int count;  // rows
    const float* const* q;
    const int64_t* n;
    float* const* out;
    const float* sinks;  // the group's attention-sink logits, or null
    bool prefetch;       // ask for the rows ahead, as attend_rows_in_place's `prefetch`
};

// Whether attend_chunk_rows_in_place runs on this build (AVX-512 ones).
#if defined(__AVX512F__)
constexpr bool attends_chunk_rows_together = true;
#else
constexpr bool attends_chunk_rows_together = false;
#endif

// The most rows attend_chunk_rows_in_place takes (8 at most) for a group of `group` query heads a KV head:
// rows * group heads share each key's and value's loads, up to 8 (the registers' room) from 4
// heads a group on, up to 6 below, where the score kernel keeps its 8-key blocks (7-8 heads take
// 4-key ones).
inline int chunk_rows_together(int group) { return group >= 8 ? 1 : group >= 4 ? 8 / group : 6 / group; }
// Whether those rows' heads score in 8-key blocks (at most 6 heads).
inline bool chunk_rows_score_in_eights(int group) { return chunk_rows_together(group) * group <= 6; }

// attend_rows_in_place for the rows of a chunk at once, sharing the reads of their keys and
// values: each row's result has the bits attend_rows_in_place gives it alone. False (nothing
// computed) where the build cannot (attends_chunk_rows_together), or for more rows than chunk_rows_together.
bool attend_chunk_rows_in_place(const LpChunkRows& rows, const uint16_t* k_head, const uint16_t* v_head,
                                const int64_t* slots, std::vector<float>& scratch);

// Whether attend_rows_transposed runs on this build (AVX-512 ones): the rows of a prompt chunk
// over an fp16 pool then score against the chunk's keys transposed once (transpose_keys).
#if defined(__AVX512F__)
constexpr bool scores_transposed = true;
#else
constexpr bool scores_transposed = false;
#endif

// Keys a block of transposed keys holds.
constexpr int KEY_BLOCK = 16;

// fp16 values transpose_keys writes for n keys of d values: whole blocks of KEY_BLOCK keys.
inline size_t transposed_keys(int64_t n, int d) { return (size_t)((n + KEY_BLOCK - 1) / KEY_BLOCK) * KEY_BLOCK * d; }

// The n fp16 key rows at `slots` of one KV head's part of a pool (k_head: its first row) into kt,
// as they are stored (the same bits): block b holds keys [16 b, 16 b + 16) as d rows of 16
// values, value i of key j at kt[(j / 16) * 16 d + i * 16 + j % 16]; a last block's missing keys
// are zeros.
void transpose_keys(const uint16_t* k_head, const int64_t* slots, int64_t n, int d, uint16_t* kt);

// attend_rows_in_place for a row of a chunk whose keys transpose_keys wrote to kt: the row's n
// keys are kt's from key `skip` on, its values the pool's rows read in place (v_head, value j at
// slots[j]). The same bits. False (nothing computed) where the build cannot (scores_transposed).
bool attend_rows_transposed(const LpConfig& c, const float* q, const uint16_t* kt, int64_t skip, int64_t n,
                            const uint16_t* v_head, const int64_t* slots, const float* sinks, float* out,
                            std::vector<float>& scratch);

// The most rows attend_chunk_rows_transposed takes (8 at most) for a group of `group` query heads
// a KV head: rows * group heads share each transposed key vector, up to 8.
inline int transposed_rows_together(int group) { return group >= 8 ? 1 : 8 / group; }

// attend_chunk_rows_in_place for rows of a chunk whose keys transpose_keys wrote to kt, the rows'
// keys being kt's from key `skip` on (the same first key for all), their values the pool's rows
// read in place (v_head, value j at slots[j]): each row's result has the bits
// attend_rows_in_place gives it alone. False (nothing computed) where the build cannot
// (scores_transposed), or for more rows than transposed_rows_together.
bool attend_chunk_rows_transposed(const LpChunkRows& rows, const uint16_t* kt, int64_t skip, const uint16_t* v_head,
                                  const int64_t* slots, std::vector<float>& scratch);

}  // namespace lp
