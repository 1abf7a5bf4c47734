// Low-bit weight x 8-bit activation matmul: see qmatmul.h for the packed layouts.
//
// Every output element y[r, c] is computed in the same fixed order on every build:
//   acc = 0
//   for each weight block b in k order:
//       isum = exact integer dot product of the block's weight q and activation q
//       acc  = fmaf(wscale[c, b] * xd[r, b], (float)isum, acc)
//       acc  = fmaf(wmin[c, b], xs[r, b], acc)          (formats with mins only)
// where xd is the activation block's scale and xs = xd * (float)(sum of its q). The k-quants
// (LP_FLAG_SUPER) take activations quantized per 256 instead (one scale xd per super-block, as
// llama.cpp's Q8_K), so their integer work spans the super-block:
//   for each super-block s in k order:
//       total = sum over its blocks b of isum_b * factor[c, b]               (exact int32)
//       acc   = fmaf(d[c, s] * xd[r, s], (float)total, acc)
//       mins  = sum over its blocks b of min_factor[c, b] * (sum of b's q)   (exact int32)
//       acc   = fmaf(dmin[c, s] * xd[r, s], (float)mins, acc)              (formats with mins)
// a quarter of the float operations of a block at a time. The SIMD paths
// vectorise across the 16 columns of a group (never across the blocks of one column), so their
// float operations are the scalar ones lane by lane and the builds agree bit for bit; the
// integer sums are exact whatever the instruction sequence. A row's result depends only on
// that row and that column, never on the row tiling or the column split.
#include "qmatmul.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "half.h"
#include "isa.h"
#include "qacts.h"

// How far ahead of the block it reads a tile asks for weights (bytes). The AVX-512 tiles of
// several rows run fast enough that a 2 KiB lead left them waiting on memory: on a Zen 5 host,
// 6 KiB ran 8- and 16-row decode steps of a 1B model 20-25% faster (8 KiB and 12 KiB the same
// within noise, 4 KiB halfway); one row and 512-row prompts were unchanged. The AVX2 tiles,
// slower per byte, ran 2-4% slower with 8 KiB there, so they keep 2 KiB.
#ifndef LP_PREFETCH_BYTES
#if defined(LP_ISA_AVX512VNNI)
#define LP_PREFETCH_BYTES 6144
#else
#define LP_PREFETCH_BYTES 2048
#endif
#endif

namespace {

using lp::qacts::ActsRow;
using lp::qacts::acts_bytes;
using lp::qacts::acts_row;
using lp::qacts::kActBlock;
using lp::qacts::kSuper;
using lp::qacts::super_view;

constexpr int kGroup = LP_COL_GROUP;

// -- weight formats ----------------------------------------------------------------------------
template <int FMT> struct Fmt;
template <> struct Fmt<LP_W4> { static constexpr int block = 32, qbytes = 256; };
template <> struct Fmt<LP_W8> { static constexpr int block = 16, qbytes = 256; };
template <> struct Fmt<LP_W8_32> { static constexpr int block = 32, qbytes = 512; };
template <> struct Fmt<LP_W6> { static constexpr int block = 16, qbytes = 192; };

template <int FMT, bool MIN> constexpr int record_bytes() { return Fmt<FMT>::qbytes + 64 + (MIN ? 64 : 0); }

// Where block b of a group keeps its quants and its 16 columns' scales (which = 0) or mins
// (which = 1), in either layout (qmatmul.h): records, or super-blocks of kSuper k whose header
// holds the 16 columns' d (16 float32; with mins, 16 fp16 d then 16 fp16 dmin) and each block's
// 16 int8 factors.
template <int FMT, bool MIN, bool SUP> struct Blocks {
    static constexpr int qbytes = Fmt<FMT>::qbytes, per_super = kSuper / Fmt<FMT>::block, kinds = MIN ? 2 : 1;
    static constexpr bool half_d = SUP && MIN;  // fp16 d and dmin: 64 bytes, a whole line
    static constexpr size_t header = 64 + size_t(16 * per_super) * kinds, super_bytes = header + per_super * qbytes;

    // With SUP: the super-block holding block b.
    static const uint8_t* super_of(const uint8_t* grp, int b) { return grp + size_t(b / per_super) * super_bytes; }
    static const uint8_t* quants(const uint8_t* grp, int b) {
        if constexpr (SUP) return super_of(grp, b) + header + size_t(b % per_super) * qbytes;
        return grp + size_t(b) * record_bytes<FMT, MIN>();
    }
    // Without SUP: the 16 float32 scales (which = 0) or mins (1). With SUP and no mins: the
    // super-block's 16 float32 d.
    static const float* floats(const uint8_t* grp, int b, int which) {
        if constexpr (SUP) return reinterpret_cast<const float*>(super_of(grp, b));
        return reinterpret_cast<const float*>(quants(grp, b) + qbytes + 64 * which);
    }
    // With half_d: the super-block's 16 fp16 d (which = 0) or dmin (1).
    static const uint16_t* halves(const uint8_t* grp, int b, int which) {
        return reinterpret_cast<const uint16_t*>(super_of(grp, b) + 32 * which);
    }
    // With SUP: the block's 16 int8 factors of d (which = 0) or dmin (1).
    static const int8_t* factors(const uint8_t* grp, int b, int which) {
        return reinterpret_cast<const int8_t*>(super_of(grp, b) + 64 + 16 * (per_super * which + b % per_super));
    }
    static size_t group_bytes(int k) {
        return SUP ? size_t(k / kSuper) * super_bytes : size_t(k / Fmt<FMT>::block) * record_bytes<FMT, MIN>();
    }
};

// The activation term multiplying a block's min: xs of its 32-block or of its 16-half.
template <int FMT> inline float min_term(const ActsRow& a, int b) { return Fmt<FMT>::block == 32 ? a.s[b] : a.s16[b]; }

inline int32_t load_i32(const void* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

// A group's weights are one sequential stream, and so are a column chunk's groups; the hardware
// prefetchers stop at each 4 KiB page, so the tiles ask for the lines kPrefetchBytes ahead of
// the block they read (a prefetch never faults, past the end of the weights included).
constexpr int kPrefetchBytes = LP_PREFETCH_BYTES;
// How far ahead one-row tiles ask for their weights, 0 for not at all (lp_set_one_row_prefetch):
// a decode row is bound by memory, and the best distance depends on the CPU's own prefetchers.
// Random 1B Q4_K_M file, one-row steps: on Zen 5 6 KiB ran 1.3-1.5x faster than none; on an
// Intel Xeon (family 6 model 167, AVX-512 VNNI) 2 KiB ran 1.2x faster than none and 6 KiB 1.2x
// slower. lamplight/native/prefetch.py times the candidates once per process.
int one_row_prefetch_bytes = 0;

// How many groups of columns a one-row pass reads side by side (1, or kStreamGroups where the
// build has one_row_groups): lp_set_one_row_streams. The driver (qmatmul) splits a column range
// into that many runs of groups and reads the runs side by side, each a stream of memory of its
// own: a core with several in flight reads faster than with one (the hardware prefetchers
// follow each). One-token steps of the random 1B Q4_K_M file on an Intel Xeon (family 6 model
// 167), at each one's best prefetch distance, with neighbouring groups side by side (before the
// runs): one group 25.3 ms, 2 side by side 23.8, 4 23.3, 8 23.8.
#ifndef LP_STREAM_GROUPS
#define LP_STREAM_GROUPS 4
#endif
constexpr int kStreamGroups = LP_STREAM_GROUPS;
int one_row_streams = 1;
// One row over kStreamGroups groups `stride` bytes apart, group s writing y + ystep * s.
using StreamsFn = void (*)(const uint8_t* grp0, size_t stride, int nblk, const ActsRow* a, float* y, size_t ystep);
// kRowPair rows of one group (where the build has pair_tile).
using PairFn = void (*)(const uint8_t* grp, int nblk, const ActsRow* a, float* const* dst);

// How far ahead tiles of `rows` rows ask for their weights (0: they do not).
inline int prefetch_bytes(int rows) { return rows > 1 ? kPrefetchBytes : one_row_prefetch_bytes; }
template <int R> inline int prefetch_bytes() { return prefetch_bytes(R); }
inline bool prefetches(int rows) { return prefetch_bytes(rows) > 0; }
template <int R> inline bool prefetches() { return prefetches(R); }

// Asks for the lines of [p, p + bytes) (a prefetch never faults).
inline void prefetch_lines(const uint8_t* p, int bytes) {
    for (int line = 0; line < bytes; line += 64) __builtin_prefetch(p + line, 0, 3);
}

// The lines of a block's quants `ahead` bytes ahead.
template <int FMT> inline void prefetch_ahead(const uint8_t* rec, int ahead = kPrefetchBytes) {
    prefetch_lines(rec + ahead, Fmt<FMT>::qbytes);
}

// A one-row tile's prefetch for block j of a super-block: its share of the super-block's bytes
// (header included) `ahead` bytes ahead, so that every line of the group's stream is asked for.
// prefetch_ahead asks for each block's quants alone, which leaves the super-blocks' headers (320
// of Q4_K's 2368 bytes) to demand misses. One-row steps of the random Q4_K_M files on Zen 5,
// builds alternated in one process (both orders): 1B 3-6% faster, 3B 5-6%. Multi-row tiles,
// whose weights come from cache in prompts, ran 512-token prompts 1.5% slower with it (16-row
// steps the same) and keep prefetch_ahead.
template <class L> inline void prefetch_super_ahead(const uint8_t* grp, int b, int j, int ahead) {
    constexpr int span = int((L::super_bytes + L::per_super - 1) / L::per_super + 63) / 64 * 64;
    prefetch_lines(L::super_of(grp, b) + ahead + j * span, span);
}

// -- tiles: R rows x one group of 16 columns, the whole of k ----------------------------------
// tile<FMT, MIN, ZERO8, SUP, R>(grp, nblk, a, dst) writes dst[r][0..16) for r < R.

#if defined(LP_ISA_AVX512VNNI)

constexpr int kRowTile = 8;
const char* const kIsa = "avx512vnni";
// Activations of one row block (see lp_qmatmul): small enough that the bytes the tiles read
// (one quant array and a scale or two per block: a quarter of a row) stay in L1. With 256 KiB blocks, a matrix whose weights
// overflow L2 (576->3072 at 512 rows) pushed the activations out of L2 too and ran 10-25% slower.
constexpr size_t kRowBlockBytes = 64 * 1024;

// The output lines a tile will write kDstAheadGroups groups of columns from now, asked for
// ahead: a prompt's outputs (33.5 MB for a 512-row gate_up of a 1B model) are in no cache, and a
// tile whose first store misses waits for the line (512-token prompt of the random 1B Q4_K_M
// file on Zen 5: 894-908 ms against 959-967 ms without; a 512-row 16384x2048 Q8_0, Q4_0 or Q4_1
// linear 9-11% faster, Q6_K 1%; 2 groups ahead as fast, 1 not enough; 16-row decode steps the
// same within noise). The write hint becomes a plain prefetcht0, since the build does not enable
// PRFCHW; a prefetchw build (-mprfchw) measured the same, prompts and 16-row steps within 1%.
// Past the columns or the rows a prefetch touches a line it does not need, and never faults.
// The AVX2 tiles, which store once at their end, ran 2-10% slower with it, so they do without.
constexpr int kDstAheadGroups = 4;
template <int R> inline void prefetch_dst(float* const* dst) {
    for (int r = 0; r < R; ++r) __builtin_prefetch(dst[r] + kDstAheadGroups * kGroup, 1, 3);
}

// acc += vpdpbusd(u, the int32 at p in every lane). From two rows on, the broadcast is the
// instruction's own memory operand ({1to16}, in an asm statement): from the intrinsics GCC 12
// emitted a vpbroadcastd for each, one vector instruction more per vpdpbusd. Random 1B Q4_K_M
// file on Zen 5, builds alternated step by step in one process (both orders): 8-row decode
// steps 10% faster, 16-row 6.5-7%, 2-row 5-10%, 3-row the same within noise, 512-token prompts
// 2.8%. One row ran 3-4% slower with it (why, I have not pinned down) and keeps the intrinsic.
template <int R>
inline __m512i dpbusd_bcst(__m512i acc, __m512i u, const int8_t* p) {
    if constexpr (R == 1) {
        return _mm512_dpbusd_epi32(acc, u, _mm512_set1_epi32(load_i32(p)));
    } else {
        asm("vpdpbusd %[m]%{1to16%}, %[u], %[acc]"
            : [acc] "+v"(acc)
            : [u] "v"(u), [m] "m"(*reinterpret_cast<const int32_t*>(p)));
        return acc;
    }
}

// An LP_W6 block's 4 quads of q + 32 (0..63), quad t in u[t], from its low 4 bits' two chunks
// and its high 2 bits' chunk.
inline void w6_quads(const uint8_t* rec, __m512i (&u)[4]) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m2 = _mm512_set1_epi8(0x03);
    const __m512i w0 = _mm512_load_si512(rec), w1 = _mm512_load_si512(rec + 64), wh = _mm512_load_si512(rec + 128);
    u[0] = _mm512_or_si512(_mm512_and_si512(w0, m4), _mm512_slli_epi16(_mm512_and_si512(wh, m2), 4));
    u[1] = _mm512_or_si512(_mm512_and_si512(w1, m4), _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(wh, 2), m2), 4));
    u[2] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(w0, 4), m4),
                           _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(wh, 4), m2), 4));
    u[3] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(w1, 4), m4),
                           _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(wh, 6), m2), 4));
}

// An LP_W4 chunk's low nibbles (its quad of the block's first 16 k) and high ones (of the last 16).
inline void w4_nibbles(__m512i w, __m512i& low, __m512i& high) {
    const __m512i mask = _mm512_set1_epi8(0x0F);
    low = _mm512_and_si512(w, mask);
    high = _mm512_and_si512(_mm512_srli_epi16(w, 4), mask);
}

// An LP_W4 block's exact integer sums for 16 columns in two halves: lo over its first 16 k (the
// low nibbles), hi over the last 16. Each half is at most 16 * 15 * 127 in magnitude, so it fits
// in int16: the k-quants' factor then multiplies it with one vpdpwssd (tile_super).
template <int R>
inline void block_halves_w4(const uint8_t* rec, const ActsRow* a, int kb, __m512i (&lo)[R], __m512i (&hi)[R]) {
    for (int r = 0; r < R; ++r) lo[r] = hi[r] = _mm512_setzero_si512();
    for (int t = 0; t < 4; ++t) {
        __m512i wl, wh;
        w4_nibbles(_mm512_load_si512(rec + 64 * t), wl, wh);
        for (int r = 0; r < R; ++r) {
            const int8_t* x = a[r].q + kb + 4 * t;
            lo[r] = dpbusd_bcst<R>(lo[r], wl, x);
            hi[r] = dpbusd_bcst<R>(hi[r], wh, x + 16);
        }
    }
}

// An LP_W6 block's exact integer sums for 16 columns in two halves of 8 k: each starts at -32
// times its activations' sum, so it ends as the sum of q * x with q in -32..31 and |x| <= 127, at
// most 8 * 32 * 127 in magnitude: it fits in int16, as block_halves_w4's.
template <int R>
inline void block_halves_w6(const uint8_t* rec, const ActsRow* a, int kb, __m512i (&lo)[R], __m512i (&hi)[R]) {
    __m512i u[4];
    w6_quads(rec, u);
    for (int r = 0; r < R; ++r) {
        lo[r] = _mm512_set1_epi32(a[r].km32s8[kb / 8]);
        hi[r] = _mm512_set1_epi32(a[r].km32s8[kb / 8 + 1]);
        for (int t = 0; t < 2; ++t) {
            lo[r] = dpbusd_bcst<R>(lo[r], u[t], a[r].q + kb + 4 * t);
            hi[r] = dpbusd_bcst<R>(hi[r], u[t + 2], a[r].q + kb + 8 + 4 * t);
        }
    }
}

// The block's exact integer sums for 16 columns, one int32 lane each.
template <int FMT, bool ZERO8, int R>
inline void block_sums(const uint8_t* rec, const ActsRow* a, int kb, int b, __m512i (&isum)[R]) {
    if constexpr (FMT == LP_W4) {
        // Unsigned nibbles against signed activations: vpdpbusd's operand order as is, the two
        // halves in chains of their own (block_halves_w4), added.
        __m512i hi[R];
        block_halves_w4<R>(rec, a, kb, isum, hi);
        for (int r = 0; r < R; ++r) {
            isum[r] = _mm512_add_epi32(isum[r], hi[r]);
            if constexpr (ZERO8) isum[r] = _mm512_add_epi32(isum[r], _mm512_set1_epi32(-8 * a[r].sum[b]));
        }
    } else if constexpr (FMT == LP_W6) {
        // Unsigned q + 32 (0..63) against signed activations, less 32 times their sum.
        __m512i u[4];
        w6_quads(rec, u);
        for (int r = 0; r < R; ++r) {
            isum[r] = _mm512_set1_epi32(-32 * a[r].sum16[b]);
            for (int t = 0; t < 4; ++t)
                isum[r] = dpbusd_bcst<R>(isum[r], u[t], a[r].q + kb + 4 * t);
        }
    } else {
        // Signed weights: (x + 128) . w - 128 * sum(w), with the correction shared by the rows.
        const __m512i bias = _mm512_set1_epi8(char(0x80));
        __m512i corr = _mm512_setzero_si512();
        for (int r = 0; r < R; ++r) isum[r] = _mm512_setzero_si512();
        for (int t = 0; t < Fmt<FMT>::block / 4; ++t) {
            const __m512i w = _mm512_load_si512(rec + 64 * t);
            corr = _mm512_dpbusd_epi32(corr, bias, w);
            for (int r = 0; r < R; ++r)
                isum[r] = _mm512_dpbusd_epi32(isum[r], _mm512_set1_epi32(load_i32(a[r].qu + kb + 4 * t)), w);
        }
        for (int r = 0; r < R; ++r) isum[r] = _mm512_sub_epi32(isum[r], corr);
    }
}

template <int FMT, bool MIN, bool SUP>
const void* prepare(const uint8_t*, int) { return nullptr; }

// Block b's 16 scales (which = 0) or mins (1): stored, or d times the factor (an exact product).
template <int FMT, bool MIN, bool SUP>
inline __m512 scales16(const uint8_t* grp, int b, int which) {
    using L = Blocks<FMT, MIN, SUP>;
    __m512 values;
    if constexpr (L::half_d) values = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(L::halves(grp, b, which))));
    else values = _mm512_load_ps(L::floats(grp, b, which));
    if constexpr (!SUP) return values;
    const __m128i f = _mm_load_si128(reinterpret_cast<const __m128i*>(L::factors(grp, b, which)));
    return _mm512_mul_ps(values, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(f)));
}

// The super-block of block b0: its 16 columns' d (which = 0) or, with mins, dmin (1), as float32.
template <int FMT, bool MIN>
inline __m512 super_scale(const uint8_t* grp, int b0, int which) {
    using L = Blocks<FMT, MIN, true>;
    if constexpr (L::half_d) return _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(L::halves(grp, b0, which))));
    else return _mm512_load_ps(L::floats(grp, b0, which));
}

// acc + (scale * a row's kd) * ints: a super-block's integer sums into a row's float accumulator.
inline __m512 add_scaled(__m512 acc, __m512 scale, float kd, __m512i ints) {
    return _mm512_fmadd_ps(_mm512_mul_ps(scale, _mm512_set1_ps(kd)), _mm512_cvtepi32_ps(ints), acc);
}

// The min factors of the super-block of block b0, two blocks a lane: pairs[i] holds block
// b0 + 2i's in the low int16 and b0 + 2i + 1's in the high (row_mins' operand).
template <int FMT>
inline void min_factor_pairs(const uint8_t* grp, int b0, __m512i (&pairs)[Blocks<FMT, true, true>::per_super / 2]) {
    using L = Blocks<FMT, true, true>;
    const auto factors = [&](int b) {
        return _mm512_cvtepi8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(L::factors(grp, b, 1))));
    };
    const __m512i low16 = _mm512_set1_epi32(0xFFFF);
    for (int j = 0; j < L::per_super; j += 2)
        pairs[j / 2] = _mm512_or_si512(_mm512_and_si512(factors(b0 + j), low16), _mm512_slli_epi32(factors(b0 + j + 1), 16));
}

// One row's sum_j min factor_j * (sum of block j's activation q) over the super-block of block
// b0, two blocks per vpdpwssd.
template <int FMT>
inline __m512i row_mins(const __m512i (&pairs)[Blocks<FMT, true, true>::per_super / 2], const ActsRow& a, int b0) {
    const int16_t* sums = (Fmt<FMT>::block == 32 ? a.kp32 : a.kp16) + b0;
    __m512i mins = _mm512_setzero_si512();
    for (int i = 0; i < Blocks<FMT, true, true>::per_super / 2; ++i)
        mins = _mm512_dpwssd_epi32(mins, pairs[i], _mm512_set1_epi32(load_i32(sums + 2 * i)));
    return mins;
}

// A k-quant's super-blocks (FLAG_SUPER): the activations have one scale per 256 k, so each
// block's exact sum times its int8 factor adds up in int32 over the super-block, and the float
// work (d * xd times the total, and the mins' term) is once per 256 k, not per block. The rows
// come as super_view gives them (rows_of). S groups of columns, `stride` bytes apart, are read
// side by side (S > 1 for one row only: one_row_groups); group s writes dst[r] + ystep * s.
template <int FMT, bool MIN, int R, int S = 1>
void tile_super(const uint8_t* grp0, size_t stride, int nblk, const ActsRow* a, float* const* dst,
                size_t ystep = kGroup) {
    static_assert(S == 1 || R == 1, "several groups side by side for one row only");
    using L = Blocks<FMT, MIN, true>;
    constexpr int block = Fmt<FMT>::block, per = L::per_super;
    const auto group = [&](int s) { return grp0 + size_t(s) * stride; };
    // The float accumulators wait between super-blocks where the compiler puts them (registers,
    // or R adjacent lines of the stack), not in dst, whose R rows lie ldy apart: a load and a
    // store to those lines per super-block ran 16-row decode steps of the random 1B Q4_K_M file
    // 6.5% slower, 8-row 2.8%, one row 3.9%, a 512-token prompt 5% (alternated in one process;
    // a single linear in a loop, its output in cache, showed 1-2%). Why the model's steps feel
    // it more I have not pinned down; the lines' L1 set (ldy * 4 is a multiple of 4 KiB for most
    // widths) is a guess that an ldy off the multiple did not confirm.
    prefetch_dst<R>(dst);
    __m512 acc[S][R];
    for (int s = 0; s < S; ++s)
        for (int r = 0; r < R; ++r) acc[s][r] = _mm512_setzero_ps();
    for (int b0 = 0; b0 < nblk; b0 += per) {
        __m512i total[S][R];
        for (int s = 0; s < S; ++s)
            for (int r = 0; r < R; ++r) total[s][r] = _mm512_setzero_si512();
        for (int j = 0; j < per; ++j) {
            const int b = b0 + j;
            for (int s = 0; s < S; ++s) {
                const uint8_t* grp = group(s);
                const uint8_t* rec = L::quants(grp, b);
                if constexpr (R == 1) {
                    if (prefetches<R>()) prefetch_super_ahead<L>(grp, b, j, prefetch_bytes<R>());
                } else if (prefetches<R>()) {
                    prefetch_ahead<FMT>(rec);
                }
                const __m512i f =
                    _mm512_cvtepi8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(L::factors(grp, b, 0))));
                if constexpr (FMT == LP_W4 || FMT == LP_W6) {
                    // total += f * lo + f * hi as two vpdpwssd: each half fits in the low int16 of
                    // its lane and f16 holds f in the low int16, 0 above, so each is exactly the
                    // product. One instruction each instead of an add, a vpmulld (two) and an add.
                    const __m512i f16 = _mm512_and_si512(f, _mm512_set1_epi32(0xFFFF));
                    __m512i lo[R], hi[R];
                    if constexpr (FMT == LP_W4) block_halves_w4<R>(rec, a, b * block, lo, hi);
                    else block_halves_w6<R>(rec, a, b * block, lo, hi);
                    for (int r = 0; r < R; ++r)
                        total[s][r] = _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(total[s][r], lo[r], f16), hi[r], f16);
                } else {
                    __m512i isum[R];
                    block_sums<FMT, false, R>(rec, a, b * block, b, isum);
                    for (int r = 0; r < R; ++r) total[s][r] = _mm512_add_epi32(total[s][r], _mm512_mullo_epi32(isum[r], f));
                }
            }
        }
        const int sb = b0 / per;
        for (int s = 0; s < S; ++s) {
            const uint8_t* grp = group(s);
            const __m512 d = super_scale<FMT, MIN>(grp, b0, 0);
            for (int r = 0; r < R; ++r) acc[s][r] = add_scaled(acc[s][r], d, a[r].kd[sb], total[s][r]);
            if constexpr (MIN) {
                __m512i pairs[per / 2];
                min_factor_pairs<FMT>(grp, b0, pairs);
                const __m512 dmin = super_scale<FMT, MIN>(grp, b0, 1);
                for (int r = 0; r < R; ++r) acc[s][r] = add_scaled(acc[s][r], dmin, a[r].kd[sb], row_mins<FMT>(pairs, a[r], b0));
            }
        }
    }
    for (int s = 0; s < S; ++s)
        for (int r = 0; r < R; ++r) _mm512_storeu_ps(dst[r] + ystep * s, acc[s][r]);
}

// tile_super for the k-quants with half-block sums (LP_W4, LP_W6) over kRowPair = 2 * kRowTile
// rows, the rows one after another against a block's weights unpacked once into registers
// (tile_super unpacks them once per kRowTile rows, its rows' chains side by side): the unpack is
// a fixed cost per block (LP_W4 12 vector instructions against about 80 for 8 rows' sums, LP_W6
// about 20 against 48), which 16 rows share. Their totals stay in registers, their float
// accumulators wait in memory between super-blocks. Integer sums are exact in any order and the
// float work is tile_super's, so every row has tile_super's bits. The random 1B Q4_K_M file on
// the Intel Xeon (family 6 model 207), builds alternated in one process: a 512-token prompt
// 1511 -> 1427 ms (gate_up 723 -> 691, down 396 -> 346), 16-row steps 62.3 -> 53.8 ms.
constexpr int kRowPair = 2 * kRowTile;

template <int FMT, bool MIN>
void tile_super_pair(const uint8_t* grp, int nblk, const ActsRow* a, float* const* dst) {
    static_assert(FMT == LP_W4 || FMT == LP_W6, "the formats whose halves vpdpwssd multiplies");
    constexpr int R = kRowPair;
    using L = Blocks<FMT, MIN, true>;
    constexpr int block = Fmt<FMT>::block, per = L::per_super;
    prefetch_dst<R>(dst);
    alignas(64) float acc[R][kGroup] = {};
    for (int b0 = 0; b0 < nblk; b0 += per) {
        __m512i total[R];
        for (int r = 0; r < R; ++r) total[r] = _mm512_setzero_si512();
        for (int j = 0; j < per; ++j) {
            const int b = b0 + j, kb = b * block;
            const uint8_t* rec = L::quants(grp, b);
            if (prefetches<R>()) prefetch_ahead<FMT>(rec);
            const __m512i f16 = _mm512_and_si512(
                _mm512_cvtepi8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(L::factors(grp, b, 0)))),
                _mm512_set1_epi32(0xFFFF));
            // The block's weights, as block_halves_w4 and block_halves_w6 read them: u[0..H) for
            // the low half's quads, u[H..2H) for the high half's.
            constexpr int H = FMT == LP_W4 ? 4 : 2;
            __m512i u[2 * H];
            if constexpr (FMT == LP_W4) {
                for (int t = 0; t < 4; ++t) w4_nibbles(_mm512_load_si512(rec + 64 * t), u[t], u[4 + t]);
            } else {
                w6_quads(rec, u);
            }
            // Unrolled, so that the totals stay in registers: as a loop GCC 12 kept them in
            // memory, and the tile ran 5% slower than two of 8 rows.
#pragma GCC unroll 16
            for (int r = 0; r < R; ++r) {
                const int8_t* x = a[r].q + kb;
                __m512i lo, hi;
                if constexpr (FMT == LP_W4) {
                    lo = hi = _mm512_setzero_si512();
                } else {
                    lo = _mm512_set1_epi32(a[r].km32s8[kb / 8]);
                    hi = _mm512_set1_epi32(a[r].km32s8[kb / 8 + 1]);
                }
                for (int t = 0; t < H; ++t) {
                    lo = dpbusd_bcst<R>(lo, u[t], x + 4 * t);
                    hi = dpbusd_bcst<R>(hi, u[H + t], x + block / 2 + 4 * t);
                }
                total[r] = _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(total[r], lo, f16), hi, f16);
            }
        }
        const int sb = b0 / per;
        const __m512 d = super_scale<FMT, MIN>(grp, b0, 0);
        for (int r = 0; r < R; ++r) _mm512_store_ps(acc[r], add_scaled(_mm512_load_ps(acc[r]), d, a[r].kd[sb], total[r]));
        if constexpr (MIN) {
            // tile_super's mins, the pairs of factors made once for the rows.
            __m512i pairs[per / 2];
            min_factor_pairs<FMT>(grp, b0, pairs);
            const __m512 dmin = super_scale<FMT, MIN>(grp, b0, 1);
            for (int r = 0; r < R; ++r)
                _mm512_store_ps(acc[r], add_scaled(_mm512_load_ps(acc[r]), dmin, a[r].kd[sb], row_mins<FMT>(pairs, a[r], b0)));
        }
    }
    for (int r = 0; r < R; ++r) _mm512_storeu_ps(dst[r], _mm512_load_ps(acc[r]));
}

// The kRowPair-row tile of a format, or null where it has none.
template <int FMT, bool MIN, bool ZERO8, bool SUP>
constexpr PairFn pair_tile() {
    if constexpr (SUP && !ZERO8 && (FMT == LP_W4 || FMT == LP_W6)) return tile_super_pair<FMT, MIN>;
    return nullptr;
}

// The block formats (records of one block each): S groups side by side as tile_super's.
template <int FMT, bool MIN, bool ZERO8, int R, int S = 1>
void tile_blocks(const uint8_t* grp0, size_t stride, int nblk, const ActsRow* a, float* const* dst,
                 size_t ystep = kGroup) {
    static_assert(S == 1 || R == 1, "several groups side by side for one row only");
    using L = Blocks<FMT, MIN, false>;
    constexpr int block = Fmt<FMT>::block;
    prefetch_dst<R>(dst);
    __m512 acc[S][R];
    for (int s = 0; s < S; ++s)
        for (int r = 0; r < R; ++r) acc[s][r] = _mm512_setzero_ps();
    for (int b = 0; b < nblk; ++b) {
        const int kb = b * block;
        for (int s = 0; s < S; ++s) {
            const uint8_t* grp = grp0 + size_t(s) * stride;
            __m512i isum[R];
            const uint8_t* rec = L::quants(grp, b);
            if (prefetches<R>()) prefetch_ahead<FMT>(rec, prefetch_bytes<R>());
            block_sums<FMT, ZERO8, R>(rec, a, kb, b, isum);
            const __m512 scale = scales16<FMT, MIN, false>(grp, b, 0);
            for (int r = 0; r < R; ++r) {
                const __m512 sd = _mm512_mul_ps(scale, _mm512_set1_ps(a[r].d[kb / kActBlock]));
                acc[s][r] = _mm512_fmadd_ps(sd, _mm512_cvtepi32_ps(isum[r]), acc[s][r]);
            }
            if constexpr (MIN) {
                const __m512 mins = scales16<FMT, MIN, false>(grp, b, 1);
                for (int r = 0; r < R; ++r)
                    acc[s][r] = _mm512_fmadd_ps(mins, _mm512_set1_ps(min_term<FMT>(a[r], b)), acc[s][r]);
            }
        }
    }
    for (int s = 0; s < S; ++s)
        for (int r = 0; r < R; ++r) _mm512_storeu_ps(dst[r] + ystep * s, acc[s][r]);
}

template <int FMT, bool MIN, bool ZERO8, bool SUP, int R>
void tile(const uint8_t* grp, int nblk, const ActsRow* a, float* const* dst, const void*) {
    if constexpr (SUP) tile_super<FMT, MIN, R>(grp, 0, nblk, a, dst);
    else tile_blocks<FMT, MIN, ZERO8, R>(grp, 0, nblk, a, dst);
}

// One row over kStreamGroups groups of columns side by side, `stride` bytes apart, group s
// writing y[ystep * s .. ystep * s + 16).
template <int FMT, bool MIN, bool ZERO8, bool SUP>
constexpr StreamsFn one_row_groups() {
    return [](const uint8_t* grp0, size_t stride, int nblk, const ActsRow* a, float* y, size_t ystep) {
        float* const dst[1] = {y};
        if constexpr (SUP) tile_super<FMT, MIN, 1, kStreamGroups>(grp0, stride, nblk, a, dst, ystep);
        else tile_blocks<FMT, MIN, ZERO8, 1, kStreamGroups>(grp0, stride, nblk, a, dst, ystep);
    };
}

#elif defined(LP_ISA_AVX2)

// Four rows x 8 columns per pass: 4 int16 block sums and 4 float accumulators stay in registers
// with the weight chunk and its nibbles (GCC 12 spills from 5 rows on).
constexpr int kRowTile = 4;
const char* const kIsa = "avx2";
// Activations of one row block: well inside a core's L2 (1-2 MiB on the project's machines).
// Larger than the AVX-512 path's: each block unpacks every group's nibbles once (unpack_w4),
// and this path is slow enough not to feel L2's latency (64 KiB measured 2-6% slower).
constexpr size_t kRowBlockBytes = 256 * 1024;

// Keeps v in a register at this point: without it GCC reassociates the unrolled chains of
// integer adds across the rows and hoists every maddubs ahead of them, keeping them all live
// (with four rows that spilled, and ran slower than two rows).
#define LP_PIN(v) __asm__("" : "+x"(v))

// LP_W4 weights unpacked once per group when more than one row tile reads them: per half h of
// the group and block b, the 4 chunks' low and high nibbles as 8 vectors (lo0 hi0 lo1 hi1 ...)
// at unpacked[(h * nblk + b) * 8]. A thread's buffer, reused across calls.
template <bool MIN, bool SUP>
const __m256i* unpack_w4(const uint8_t* grp, int nblk) {
    struct alignas(32) Chunk { uint8_t bytes[32]; };
    thread_local std::vector<Chunk> chunks;
    if (chunks.size() < size_t(nblk) * 16) chunks.resize(size_t(nblk) * 16);
    __m256i* const buf = reinterpret_cast<__m256i*>(chunks.data());
    const __m256i mask = _mm256_set1_epi8(0x0F);
    for (int b = 0; b < nblk; ++b)
        for (int h = 0; h < 2; ++h) {
            const uint8_t* rec = Blocks<LP_W4, MIN, SUP>::quants(grp, b);
            if (h == 0) prefetch_ahead<LP_W4>(rec);
            __m256i* u = buf + (size_t(h) * nblk + b) * 8;
            for (int t = 0; t < 4; ++t) {
                const __m256i w = _mm256_load_si256(reinterpret_cast<const __m256i*>(rec + 64 * t + 32 * h));
                _mm256_store_si256(u + 2 * t, _mm256_and_si256(w, mask));
                _mm256_store_si256(u + 2 * t + 1, _mm256_and_si256(_mm256_srli_epi16(w, 4), mask));
            }
        }
    return buf;
}

template <int FMT, bool MIN, bool SUP>
const void* prepare(const uint8_t* grp, int nblk) {
    if constexpr (FMT == LP_W4) return unpack_w4<MIN, SUP>(grp, nblk);
    return nullptr;
}

// Block b's 8 scales (which = 0) or mins (1) of half h: stored, or d times the factor (exact).
template <int FMT, bool MIN, bool SUP>
inline __m256 scales8(const uint8_t* grp, int b, int which, int h) {
    using L = Blocks<FMT, MIN, SUP>;
    __m256 values;
    if constexpr (L::half_d) values = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(L::halves(grp, b, which) + 8 * h)));
    else values = _mm256_load_ps(L::floats(grp, b, which) + 8 * h);
    if constexpr (!SUP) return values;
    const __m128i f = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(L::factors(grp, b, which) + 8 * h));
    return _mm256_mul_ps(values, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(f)));
}

// The block's exact integer sums for the 8 columns of half h of the group, one int32 lane each;
// u: the block's unpacked nibbles (LP_W4) or null.
template <int FMT, bool ZERO8, int R>
inline void block_sums(const uint8_t* rec, const __m256i* u, int h, const ActsRow* a, int kb, int b,
                       __m256i (&isum)[R]) {
    const __m256i ones = _mm256_set1_epi16(1);
    if constexpr (FMT == LP_W4) {
        // maddubs pairs are at most 2 * 15 * 127 and a block adds 8 of them: int16 cannot
        // overflow, so the pairs are summed in int16 and widened once per block.
        const __m256i mask = _mm256_set1_epi8(0x0F);
        __m256i s16[R];
        for (int t = 0; t < 4; ++t) {
            __m256i lo, hi;
            if (u != nullptr) {
                lo = _mm256_load_si256(u + 2 * t);
                hi = _mm256_load_si256(u + 2 * t + 1);
            } else {
                const __m256i w = _mm256_load_si256(reinterpret_cast<const __m256i*>(rec + 64 * t + 32 * h));
                lo = _mm256_and_si256(w, mask);
                hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), mask);
            }
            for (int r = 0; r < R; ++r) {
                const int8_t* x = a[r].q + kb + 4 * t;
                const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_set1_epi32(load_i32(x))),
                                                   _mm256_maddubs_epi16(hi, _mm256_set1_epi32(load_i32(x + 16))));
                s16[r] = t == 0 ? p : _mm256_add_epi16(s16[r], p);
                LP_PIN(s16[r]);
            }
        }
        for (int r = 0; r < R; ++r) {
            isum[r] = _mm256_madd_epi16(s16[r], ones);
            if (ZERO8) isum[r] = _mm256_add_epi32(isum[r], _mm256_set1_epi32(-8 * a[r].sum[b]));
        }
    } else if constexpr (FMT == LP_W6) {
        // Unsigned q + 32 (0..63) against signed activations, less 32 times their sum; a
        // maddubs pair is at most 2 * 63 * 127, so each quad is widened on its own.
        const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x03);
        const auto at = [&](int t) { return _mm256_load_si256(reinterpret_cast<const __m256i*>(rec + 64 * t + 32 * h)); };
        const __m256i w0 = at(0), w1 = at(1), wh = at(2);
        const __m256i u[4] = {
            _mm256_or_si256(_mm256_and_si256(w0, m4), _mm256_slli_epi16(_mm256_and_si256(wh, m2), 4)),
            _mm256_or_si256(_mm256_and_si256(w1, m4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(wh, 2), m2), 4)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(w0, 4), m4),
                            _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(wh, 4), m2), 4)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(w1, 4), m4),
                            _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(wh, 6), m2), 4))};
        for (int r = 0; r < R; ++r) {
            isum[r] = _mm256_set1_epi32(-32 * a[r].sum16[b]);
            for (int t = 0; t < 4; ++t) {
                const __m256i x = _mm256_set1_epi32(load_i32(a[r].q + kb + 4 * t));
                isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(_mm256_maddubs_epi16(u[t], x), ones));
                LP_PIN(isum[r]);
            }
        }
    } else {
        // Signed x signed as maddubs(|w|, x * sign(w)): |w| <= 128 and |x| <= 127, so a pair
        // is at most 32512 and never saturates (even for w = -128).
        for (int t = 0; t < Fmt<FMT>::block / 4; ++t) {
            const __m256i w = _mm256_load_si256(reinterpret_cast<const __m256i*>(rec + 64 * t + 32 * h));
            const __m256i aw = _mm256_abs_epi8(w);
            for (int r = 0; r < R; ++r) {
                const __m256i sx = _mm256_sign_epi8(_mm256_set1_epi32(load_i32(a[r].q + kb + 4 * t)), w);
                const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx), ones);
                isum[r] = t == 0 ? p : _mm256_add_epi32(isum[r], p);
                LP_PIN(isum[r]);
            }
        }
    }
}

// Half h (8 columns) of the group: 16 ymm registers hold one half's accumulators comfortably.
template <int FMT, bool MIN, bool ZERO8, bool SUP, int R, bool UNPACKED>
void half_tile(const uint8_t* grp, const __m256i* u, int h, int nblk, const ActsRow* a, float* const* dst) {
    constexpr int block = Fmt<FMT>::block;
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    if (UNPACKED) u += size_t(h) * nblk * 8;
    for (int b = 0; b < nblk; ++b) {
        const int kb = b * block;
        __m256i isum[R];
        const uint8_t* rec = Blocks<FMT, MIN, SUP>::quants(grp, b);
        if (prefetches<R>() && h == 0 && !UNPACKED) prefetch_ahead<FMT>(rec, prefetch_bytes<R>());
        block_sums<FMT, ZERO8, R>(rec, UNPACKED ? u + 8 * b : nullptr, h, a, kb, b, isum);
        const __m256 scale = scales8<FMT, MIN, SUP>(grp, b, 0, h);
        for (int r = 0; r < R; ++r) {
            const __m256 sd = _mm256_mul_ps(scale, _mm256_set1_ps(a[r].d[kb / kActBlock]));
            acc[r] = _mm256_fmadd_ps(sd, _mm256_cvtepi32_ps(isum[r]), acc[r]);
        }
        if constexpr (MIN) {
            const __m256 mins = scales8<FMT, MIN, SUP>(grp, b, 1, h);
            for (int r = 0; r < R; ++r) acc[r] = _mm256_fmadd_ps(mins, _mm256_set1_ps(min_term<FMT>(a[r], b)), acc[r]);
        }
    }
    for (int r = 0; r < R; ++r) _mm256_storeu_ps(dst[r] + 8 * h, acc[r]);
}

// Half h of a k-quant's group (FLAG_SUPER): as the AVX-512 tile_super, 8 columns at a time.
template <int FMT, bool MIN, int R, bool UNPACKED>
void half_tile_super(const uint8_t* grp, const __m256i* u, int h, int nblk, const ActsRow* a, float* const* dst) {
    using L = Blocks<FMT, MIN, true>;
    constexpr int block = Fmt<FMT>::block, per = L::per_super;
    if (UNPACKED) u += size_t(h) * nblk * 8;
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (int b0 = 0; b0 < nblk; b0 += per) {
        __m256i total[R];
        for (int r = 0; r < R; ++r) total[r] = _mm256_setzero_si256();
        for (int j = 0; j < per; ++j) {
            const int b = b0 + j;
            const uint8_t* rec = L::quants(grp, b);
            if (prefetches<R>() && h == 0 && !UNPACKED) prefetch_ahead<FMT>(rec, prefetch_bytes<R>());
            __m256i isum[R];
            block_sums<FMT, false, R>(rec, UNPACKED ? u + 8 * b : nullptr, h, a, b * block, b, isum);
            const __m256i f = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(L::factors(grp, b, 0) + 8 * h)));
            for (int r = 0; r < R; ++r) total[r] = _mm256_add_epi32(total[r], _mm256_mullo_epi32(isum[r], f));
        }
        const int sb = b0 / per;
        __m256 d;
        if constexpr (L::half_d) d = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(L::halves(grp, b0, 0) + 8 * h)));
        else d = _mm256_load_ps(L::floats(grp, b0, 0) + 8 * h);
        for (int r = 0; r < R; ++r)
            acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(a[r].kd[sb])), _mm256_cvtepi32_ps(total[r]), acc[r]);
        if constexpr (MIN) {
            // sum_j min factor_j * (sum of the block's activation q), two blocks per pmaddwd.
            for (int r = 0; r < R; ++r) total[r] = _mm256_setzero_si256();
            for (int j = 0; j < per; j += 2) {
                const auto factors = [&](int b) {
                    return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(L::factors(grp, b, 1) + 8 * h)));
                };
                const __m256i pair = _mm256_or_si256(_mm256_and_si256(factors(b0 + j), _mm256_set1_epi32(0xFFFF)),
                                                     _mm256_slli_epi32(factors(b0 + j + 1), 16));
                for (int r = 0; r < R; ++r) {
                    const int16_t* sums = (block == 32 ? a[r].kp32 : a[r].kp16) + b0 + j;
                    total[r] = _mm256_add_epi32(total[r], _mm256_madd_epi16(pair, _mm256_set1_epi32(load_i32(sums))));
                }
            }
            const __m256 dmin = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(L::halves(grp, b0, 1) + 8 * h)));
            for (int r = 0; r < R; ++r)
                acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(dmin, _mm256_set1_ps(a[r].kd[sb])), _mm256_cvtepi32_ps(total[r]), acc[r]);
        }
    }
    for (int r = 0; r < R; ++r) _mm256_storeu_ps(dst[r] + 8 * h, acc[r]);
}

template <int FMT, bool MIN, bool ZERO8, bool SUP, int R>
void tile(const uint8_t* grp, int nblk, const ActsRow* a, float* const* dst, const void* prep) {
    const __m256i* u = static_cast<const __m256i*>(prep);
    if constexpr (SUP) {
        for (int h = 0; h < 2; ++h) {
            if (FMT == LP_W4 && u != nullptr) half_tile_super<FMT, MIN, R, true>(grp, u, h, nblk, a, dst);
            else half_tile_super<FMT, MIN, R, false>(grp, nullptr, h, nblk, a, dst);
        }
        return;
    }
    for (int h = 0; h < 2; ++h) {
        if (FMT == LP_W4 && u != nullptr) half_tile<FMT, MIN, ZERO8, SUP, R, true>(grp, u, h, nblk, a, dst);
        else half_tile<FMT, MIN, ZERO8, SUP, R, false>(grp, nullptr, h, nblk, a, dst);
    }
}

#else

constexpr int kRowTile = 1;
const char* const kIsa = "generic";
constexpr size_t kRowBlockBytes = 256 * 1024;

// The weight q of column c at offset j < block inside a record.
template <int FMT> inline int weight_q(const uint8_t* rec, int c, int j) {
    if constexpr (FMT == LP_W6) {
        const int quad = j / 4, i = j % 4;
        const int low = (rec[64 * (quad % 2) + 4 * c + i] >> (4 * (quad / 2))) & 0x0F;
        const int high = (rec[128 + 4 * c + i] >> (2 * quad)) & 0x03;
        return (low | high << 4) - 32;
    } else if constexpr (FMT == LP_W4) {
        const int quad = j / 4 % 4, i = j % 4;
        const uint8_t byte = rec[64 * quad + 4 * c + i];
        return j < 16 ? byte & 0x0F : byte >> 4;
    } else {
        return int8_t(rec[64 * (j / 4) + 4 * c + j % 4]);
    }
}

template <int FMT, bool MIN, bool SUP>
const void* prepare(const uint8_t*, int) { return nullptr; }

// Column c's scale (which = 0) or min (1) of block b: stored, or d times the factor (exact).
template <int FMT, bool MIN, bool SUP>
inline float scale_of(const uint8_t* grp, int b, int which, int c) {
    using L = Blocks<FMT, MIN, SUP>;
    const float value = L::half_d ? lp::half_to_float(L::halves(grp, b, which)[c]) : L::floats(grp, b, which)[c];
    if constexpr (!SUP) return value;
    return value * float(L::factors(grp, b, which)[c]);
}

// A k-quant's super-blocks (FLAG_SUPER), as the SIMD tile_super: exact int32 totals per 256 k
// (the same integers in any order), then the same float operations lane by lane.
template <int FMT, bool MIN>
void tile_super(const uint8_t* grp, int nblk, const ActsRow* a, float* dst) {
    using L = Blocks<FMT, MIN, true>;
    constexpr int block = Fmt<FMT>::block, per = L::per_super;
    for (int c = 0; c < kGroup; ++c) {
        float acc = 0.0f;
        for (int b0 = 0; b0 < nblk; b0 += per) {
            int32_t total = 0, min_total = 0;
            for (int b = b0; b < b0 + per; ++b) {
                const uint8_t* rec = L::quants(grp, b);
                int32_t isum = 0;  // weight_q is the signed q (Q6_K's q - 32 included)
                for (int j = 0; j < block; ++j) isum += weight_q<FMT>(rec, c, j) * a->q[b * block + j];
                total += isum * L::factors(grp, b, 0)[c];
                if (MIN) min_total += L::factors(grp, b, 1)[c] * (block == 32 ? a->kp32[b] : a->kp16[b]);
            }
            const float xd = a->kd[b0 / per];
            const float d = L::half_d ? lp::half_to_float(L::halves(grp, b0, 0)[c]) : L::floats(grp, b0, 0)[c];
            acc = std::fma(d * xd, float(total), acc);
            if (MIN) acc = std::fma(lp::half_to_float(L::halves(grp, b0, 1)[c]) * xd, float(min_total), acc);
        }
        dst[c] = acc;
    }
}

template <int FMT, bool MIN, bool ZERO8, bool SUP, int R>
void tile(const uint8_t* grp, int nblk, const ActsRow* a, float* const* dst, const void*) {
    if constexpr (SUP) {
        tile_super<FMT, MIN>(grp, nblk, a, dst[0]);
        return;
    }
    constexpr int block = Fmt<FMT>::block;
    static_assert(R == 1, "the generic path works row by row");
    float acc[kGroup] = {};
    for (int b = 0; b < nblk; ++b) {
        const int kb = b * block;
        const uint8_t* rec = Blocks<FMT, MIN, SUP>::quants(grp, b);
        const float xd = a->d[kb / kActBlock];
        for (int c = 0; c < kGroup; ++c) {
            int32_t isum = ZERO8 ? -8 * a->sum[b] : 0;
            for (int j = 0; j < block; ++j) isum += weight_q<FMT>(rec, c, j) * a->q[kb + j];
            acc[c] = std::fma(scale_of<FMT, MIN, SUP>(grp, b, 0, c) * xd, float(isum), acc[c]);
            if (MIN) acc[c] = std::fma(scale_of<FMT, MIN, SUP>(grp, b, 1, c), min_term<FMT>(*a, b), acc[c]);
        }
    }
    std::memcpy(dst[0], acc, sizeof acc);
}

#endif

#if !defined(LP_ISA_AVX512VNNI)
// Only the AVX-512 build reads groups side by side, and has tiles of kRowPair rows.
template <int FMT, bool MIN, bool ZERO8, bool SUP>
constexpr StreamsFn one_row_groups() { return nullptr; }
constexpr int kRowPair = kRowTile;
template <int FMT, bool MIN, bool ZERO8, bool SUP>
constexpr PairFn pair_tile() { return nullptr; }
#endif

// -- driver ------------------------------------------------------------------------------------

using GroupFn = void (*)(const uint8_t* grp, int nblk, const ActsRow* a, int n_rows, float* const* dst,
                        const void* prep);
// A group's weights in the form the tiles read fastest, when several row tiles read them (the
// AVX2 path's unpacked nibbles); null to read the packed records.
using PrepareFn = const void* (*)(const uint8_t* grp, int nblk);

// One group of columns for n_rows <= R rows (R = kRowTile, then down to 1).
template <int FMT, bool MIN, bool ZERO8, bool SUP, int R = kRowTile>
void group_rows(const uint8_t* grp, int nblk, const ActsRow* a, int n_rows, float* const* dst, const void* prep) {
    if (n_rows == R) {
        tile<FMT, MIN, ZERO8, SUP, R>(grp, nblk, a, dst, prep);
    } else if constexpr (R > 1) {
        group_rows<FMT, MIN, ZERO8, SUP, R - 1>(grp, nblk, a, n_rows, dst, prep);
    }
}

struct GroupKernel {
    GroupFn fn;
    PrepareFn prepare;
    size_t (*group_bytes)(int k);
    StreamsFn streams;  // one row over kStreamGroups groups side by side, or null
    PairFn pair;        // kRowPair rows, or null
};

template <int FMT, bool MIN, bool ZERO8 = false, bool SUP = false>
constexpr GroupKernel kernel() {
    return {group_rows<FMT, MIN, ZERO8, SUP>, prepare<FMT, MIN, SUP>, Blocks<FMT, MIN, SUP>::group_bytes,
            one_row_groups<FMT, MIN, ZERO8, SUP>(), pair_tile<FMT, MIN, ZERO8, SUP>()};
}

template <int FMT>
GroupKernel kernel_of(bool min, bool sup) {
    if (sup) return min ? kernel<FMT, true, false, true>() : kernel<FMT, false, false, true>();
    return min ? kernel<FMT, true>() : kernel<FMT, false>();
}

// LP_FLAG_ZERO8 comes from Q4_0 alone, LP_FLAG_SUPER from the k-quants and LP_W6 from Q6_K
// (without mins): no other combination is packed.
GroupKernel group_kernel(int format, int32_t flags) {
    const bool min = flags & LP_FLAG_MIN, zero8 = flags & LP_FLAG_ZERO8, sup = flags & LP_FLAG_SUPER;
    if ((zero8 && (sup || format != LP_W4)) || (min && format == LP_W6)) return {nullptr, nullptr, nullptr};
    switch (format) {
        case LP_W4:
            if (zero8) return min ? kernel<LP_W4, true, true>() : kernel<LP_W4, false, true>();
            return kernel_of<LP_W4>(min, sup);
        case LP_W8: return kernel_of<LP_W8>(min, sup);
        case LP_W8_32: return kernel_of<LP_W8_32>(min, sup);
        case LP_W6: return sup ? kernel<LP_W6, false, false, true>() : kernel<LP_W6, false>();
        default: return {nullptr, nullptr, nullptr};
    }
}

// Rows [r_begin, r_end) of one group of columns, in row tiles; rows[i] is row r_begin + i.
void run_group(const GroupKernel& kern, const uint8_t* grp, int nblk, const ActsRow* rows, int32_t r_begin,
               int32_t r_end, float* y, int64_t ldy, int32_t c0, int cols) {
    // y points at column c0 of row 0.
    const void* prep = r_end - r_begin > kRowTile ? kern.prepare(grp, nblk) : nullptr;
    int32_t r0 = r_begin;
    if (kern.pair != nullptr && cols == kGroup)
        for (; r_end - r0 >= kRowPair; r0 += kRowPair) {
            float* dst[kRowPair];
            for (int r = 0; r < kRowPair; ++r) dst[r] = y + (r0 + r) * ldy;
            kern.pair(grp, nblk, rows + (r0 - r_begin), dst);
        }
    for (; r0 < r_end; r0 += kRowTile) {
        const int n = std::min(kRowTile, r_end - r0);
        float partial[kRowTile][kGroup];  // a last group narrower than 16 columns
        float* dst[kRowTile];
        for (int r = 0; r < n; ++r) dst[r] = cols == kGroup ? y + (r0 + r) * ldy : partial[r];
        kern.fn(grp, nblk, rows + (r0 - r_begin), n, dst, prep);
        if (cols < kGroup)
            for (int r = 0; r < n; ++r) std::memcpy(y + (r0 + r) * ldy, partial[r], cols * sizeof(float));
    }
}

// The quantized rows [r_begin, r_end) as the tiles read them: the super-block view for the
// k-quants. Made once per row block rather than per group of columns: a group's tiles take a
// few thousand cycles, and building the rows' pointers each time cost a tenth of that.
const ActsRow* rows_of(const uint8_t* acts, size_t row_bytes, int k, bool super, int32_t r_begin, int32_t r_end) {
    thread_local std::vector<ActsRow> rows;
    rows.resize(size_t(r_end - r_begin));
    for (int32_t r = r_begin; r < r_end; ++r) {
        const ActsRow row = acts_row(acts + size_t(r) * row_bytes, k);
        rows[size_t(r - r_begin)] = super ? super_view(row) : row;
    }
    return rows.data();
}

// Why lp_qmatmul refuses w and the column range, or null if it takes them (an end past n is
// clamped to n).
const char* qmatmul_refusal(const lp_qweight* w, int32_t n_rows, int32_t col_begin, int32_t col_end) {
    if (!w || !w->data) return "a null weight";
    if (group_kernel(w->format, load_i32(w->data + LP_HEADER_FLAGS_OFFSET)).fn == nullptr) return "an unknown format";
    if (w->n < 0 || w->k <= 0 || w->k % 32 != 0) return "n or k (k must be a positive multiple of 32)";
    if ((load_i32(w->data + LP_HEADER_FLAGS_OFFSET) & LP_FLAG_SUPER) && w->k % kSuper != 0)
        return "k (super-block scales need a multiple of 256)";
    if (n_rows < 0) return "a negative row count";
    if (col_begin < 0 || col_begin > std::min(col_end, w->n)) return "a column range outside [0, n)";
    if (col_begin % kGroup != 0 || (col_end < w->n && col_end % kGroup != 0)) return "a column range off the groups";
    return nullptr;
}

}  // namespace

namespace lp {

int acts_parts(const lp_qweight* w) {
    return load_i32(w->data + LP_HEADER_FLAGS_OFFSET) & LP_FLAG_SUPER ? ACTS_SUPER : ACTS_BLOCKS;
}

void qmatmul(const lp_qweight* w, const uint8_t* acts, int32_t n_rows, float* y, int64_t ldy, int32_t col_begin,
             int32_t col_end, int32_t y_col0) {
    const int32_t flags = load_i32(w->data + LP_HEADER_FLAGS_OFFSET);
    const GroupKernel kern = group_kernel(w->format, flags);
    if (kern.fn == nullptr) return;
    const size_t stride = kern.group_bytes(w->k);
    const int nblk = w->k / (w->format == LP_W8 || w->format == LP_W6 ? 16 : 32);
    const size_t row_bytes = acts_bytes(w->k);
    col_end = std::min(col_end, w->n);
    // Row blocks outer, then columns, then row tiles: a group's weights stay in L1 while the
    // block's row tiles read them, and a block's activations stay in L1 or L2 across the groups.
    // The bytes of a row the tiles read: one of its quant arrays (k bytes) and a float or two per block.
    const size_t read_bytes = size_t(w->k) + size_t(w->k) / 4;
    // With 16-row tiles, the rows that fit are rounded up to whole ones: the rows of a block of 24
    // (k = 2048) ran as 16 + 8, and the 8-row tile unpacks its weights for half as many rows. The
    // random 1B Q4_K_M file's 512-token prompt 1.4% faster (builds alternated, both orders).
    const int32_t fit = int32_t(kRowBlockBytes / read_bytes);
    const int32_t row_block = kern.pair != nullptr ? std::max<int32_t>(kRowPair, (fit + kRowPair - 1) / kRowPair * kRowPair)
                                                   : std::max<int32_t>(kRowTile, fit / kRowTile * kRowTile);
    // The tiles ask for the lines prefetch_bytes(n_rows) ahead of the block they read, so the
    // first that many bytes of a column range would arrive one demand miss at a time: ask for them now.
    // Alone, one-row steps of the random 1B Q4_K_M file ran 1-2% faster; with linear.cpp's 2
    // column chunks a thread for a decode row, 1B 2-2.5% and 3B 4% (alternated in one process).
    if (prefetches(n_rows))
        prefetch_lines(w->data + LP_HEADER_BYTES + size_t(col_begin / kGroup) * stride, prefetch_bytes(n_rows));
    for (int32_t rb = 0; rb < n_rows; rb += row_block) {
        const int32_t rb_end = std::min(n_rows, rb + row_block);
        const ActsRow* rows = rows_of(acts, row_bytes, w->k, flags & LP_FLAG_SUPER, rb, rb_end);
        int32_t c0 = col_begin;
        // A decode row: kStreamGroups groups side by side where chosen, then the rest (and a
        // last group narrower than 16 columns) one group at a time.
        if (n_rows == 1 && one_row_streams > 1 && kern.streams != nullptr) {
            // The range's whole groups as kStreamGroups runs of q, each run read in order and
            // the runs side by side: each stream long and contiguous. Side by side groups next
            // to each other instead (each stream one group long, then the next set) ran one-row
            // steps of the random 1B Q4_K_M file 23.7 ms against 22.7, SmolLM2 5.2 against 4.8
            // (builds alternated in one process, Intel Xeon family 6 model 167); 3B the same.
            const int32_t q = (col_end - col_begin) / kGroup / kStreamGroups;
            for (int32_t i = 0; i < q; ++i, c0 += kGroup)
                kern.streams(w->data + LP_HEADER_BYTES + size_t(c0 / kGroup) * stride, stride * q, nblk, rows,
                             y + (c0 - y_col0), size_t(kGroup) * q);
            c0 = col_begin + kGroup * q * kStreamGroups;  // then the rest one group at a time
        }
        for (; c0 < col_end; c0 += kGroup)
            run_group(kern, w->data + LP_HEADER_BYTES + size_t(c0 / kGroup) * stride, nblk, rows, rb, rb_end,
                      y + (c0 - y_col0), ldy, c0, std::min(kGroup, col_end - c0));
    }
}

}  // namespace lp

extern "C" {

int32_t lp_set_one_row_prefetch(int32_t bytes) {
    const int32_t was = one_row_prefetch_bytes;
    one_row_prefetch_bytes = std::clamp<int32_t>(bytes, 0, LP_MAX_ONE_ROW_PREFETCH) / 64 * 64;
    return was;
}

int32_t lp_qmatmul(const lp_qweight* w, const uint8_t* acts, int32_t n_rows, float* y, int64_t ldy,
                   int32_t col_begin, int32_t col_end) {
    if (const char* refusal = qmatmul_refusal(w, n_rows, col_begin, col_end))
        return lp::fail(LP_ERR_ARGUMENT, "lp_qmatmul: %s (format %d, n %d, k %d, rows %d, columns [%d, %d))", refusal,
                        w ? w->format : 0, w ? w->n : 0, w ? w->k : 0, n_rows, col_begin, col_end);
    return lp::guarded([&] {
        lp::qmatmul(w, acts, n_rows, y, ldy, col_begin, col_end);
        return (int32_t)LP_OK;
    });
}

int32_t lp_set_one_row_streams(int32_t groups) {
    const int32_t was = one_row_streams;
    constexpr bool side_by_side = one_row_groups<LP_W4, false, false, false>() != nullptr;
    one_row_streams = side_by_side && groups >= kStreamGroups ? kStreamGroups : 1;
    return was;
}

int32_t lp_qweight_col_align(int32_t) { return kGroup; }

const char* lp_isa(void) { return kIsa; }

}  // extern "C"
