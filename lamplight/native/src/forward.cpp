#include "forward.h"

#include <algorithm>
#include <type_traits>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "attention.h"
#include "kv_rows.h"
#include "linear.h"
#include "pool.h"
#include "recurrent.h"
#include "vec.h"
#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace {

using lp::acts_for;
using lp::check_linear;
using lp::dot;
using lp::exp_approx;
using lp::for_rows;
using lp::grow;
using lp::linear;
using lp::acts_parts;
using lp::quantize_row;
using lp::load_kv;
using lp::store_kv;
using lp::rms_norm;
using lp::silu;
using std::vector;

inline float gelu_tanh(float x) {
    const float c = 0.7978845608028654f;  // sqrt(2 / pi)
    float t = 1.0f - 2.0f / (exp_approx(2.0f * c * (x + 0.044715f * x * x * x)) + 1.0f);  // tanh
    return 0.5f * x * (1.0f + t);
}


// ---------------------------------------------------------------------------------------------
// Optional wall-clock time per phase (lp_profile), to show where a step's time goes.

enum Phase { P_NORM, P_QKV, P_ROPE_KV, P_ATTENTION, P_WO, P_RESIDUAL, P_GATE_UP, P_ACTIVATION, P_DOWN, P_HEAD, P_COUNT };
static_assert((int)P_COUNT == (int)LP_PROFILE_PHASES, "forward.h's LP_PROFILE_PHASES (and abi.PROFILE_PHASES) name every phase");
bool profiling = false;
double phase_ms[P_COUNT] = {0};

struct PhaseTimer {
    std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
    void lap(Phase phase) {
        if (!profiling) return;
        auto now = std::chrono::steady_clock::now();
        phase_ms[phase] += std::chrono::duration<double, std::milli>(now - start).count();
        start = now;
    }
};

// ---------------------------------------------------------------------------------------------

// The rows of a prompt chunk share their sequence's keys: where the pool is not read in place
// (KV types other than fp16, the generic build), converted once per chunk and KV head (phase
// one), then read by every row (phase two). Converting is exact, so a row's result is the same
// as if it had converted its keys itself (as single-row chunks do). On the AVX-512 builds
// (lp::scores_transposed) the keys of an fp16 pool's chunk are instead transposed once per KV head
// (lp::transpose_keys, the same bits) for its rows' scores, and the values read in place.
struct SharedKeys {
    int first_row = 0, n_rows = 0;
    int64_t lo = 0, hi = 0;  // key positions converted: [lo, hi)
    // Into Model::shared_kv, per KV head (dk + dv) * (hi - lo) floats; transposed, into
    // Model::shared_kt, per KV head lp::transposed_keys(hi - lo, dk) values.
    size_t offset = 0;
};

struct Model {
    LpConfig cfg;
    vector<LpLayer> layers;
    // Scratch, grown as needed (one forward at a time: the engine thread).
    vector<float> h, x, qkv, attn, gate, out, gate_up, act, logits_in;
    vector<uint8_t> acts;
    vector<uint8_t> ffn_acts;             // the fused FFN's down input (lp::gated_linear)
    vector<vector<float>> ffn_scratch;    // and its blocks, one buffer a thread
    vector<vector<float>> thread_scratch;
    vector<float> shared_kv;     // converted keys of multi-row chunks (attention)
    vector<uint16_t> shared_kt;  // or their keys transposed (lp::scores_transposed)
    vector<SharedKeys> shared;
    vector<int> chunk_of;
    vector<std::pair<int, int>> attention_tasks;  // (first row, rows) of each attention task
    // Mixture of experts: each row's experts and weights, the rows of each expert, outputs.
    vector<int> moe_selected;
    vector<float> moe_weights, moe_outputs, moe_x, moe_gate_up, moe_act, moe_y;
    vector<vector<int>> moe_rows;
    int32_t n_adapters = 0;  // the largest LoRA adapter index + 1: a step's lora_scales need as many
    int32_t n_kv_layers = 0;  // the KV pool's layers (those of the attention layers that own K/V)
    vector<LpConfig> layer_cfg;          // per layer: the config with the layer's own shape (LpLayer.n_kv_heads...)
    vector<float> ple, ple_gate;         // gemma4's per-layer inputs [T, n_layers * P], its branch's gate
    vector<const LpRecurrent*> mixers;  // the recurrent layers, by state index
    lp::RecurrentStep recurrent;        // this step's runs and new recurrent states
};


// The config as one layer sees it: its own KV heads, head size, FFN width and rotated dims.
const LpConfig& config_of(const Model& m, const LpLayer& layer) { return m.layer_cfg[&layer - m.layers.data()]; }

LpConfig layer_config(const LpConfig& c, const LpLayer& layer) {
    LpConfig own = c;
    if (layer.n_kv_heads) own.n_kv_heads = layer.n_kv_heads;
    if (layer.head_dim) own.head_dim_k = own.head_dim_v = layer.head_dim;
    if (layer.n_ff) own.n_ff = layer.n_ff;
    if (layer.n_rot) own.n_rot = layer.n_rot;
    return own;
}

void rope(float* x, const float* cos, const float* sin, int n_rot, bool neox) {
    int half = n_rot / 2;
    for (int i = 0; i < half; i++) {
        int ia = neox ? i : 2 * i, ib = neox ? i + half : 2 * i + 1;
        float a = x[ia], b = x[ib], c = cos[i], s = sin[i];
        x[ia] = a * c - b * s;
        x[ib] = a * s + b * c;
    }
}

// RMS norm of a row's heads in place: each head alone, or (`whole`) all of them as one vector.
void norm_heads(float* x, const float* weight, bool whole, int n_heads, int d, float eps) {
    if (!weight) return;
    thread_local vector<float> tmp;
    tmp.resize(whole ? (size_t)n_heads * d : (size_t)d);
    int span = whole ? n_heads * d : d;
    for (int h = 0; h < (whole ? 1 : n_heads); h++) {
        rms_norm(x + h * d, weight, eps, span, tmp.data());
        std::memcpy(x + h * d, tmp.data(), span * sizeof(float));
    }
}

// Q rows interleaved per head as [q_h | gate_h] (qwen35): the gates to `gate`, the row made
// [q | k | v] as the other layers' rows.
void split_output_gate(const LpConfig& c, float* row, int n_qkv, float* gate) {
    int dk = c.head_dim_k, n_q = c.n_heads * dk;
    thread_local vector<float> q;
    q.resize(n_q);
    for (int h = 0; h < c.n_heads; h++) {
        std::memcpy(q.data() + h * dk, row + 2 * h * dk, dk * sizeof(float));
        std::memcpy(gate + h * dk, row + 2 * h * dk + dk, dk * sizeof(float));
    }
    std::memcpy(row, q.data(), n_q * sizeof(float));
    std::memmove(row + n_q, row + 2 * n_q, (n_qkv - 2 * n_q) * sizeof(float));
}

// Q/K norms, rotary embedding, and K/V into the pool, for one row.
void prepare_row(const Model& m, const LpLayer& layer, int layer_index, const LpBatch& b, const LpKV& kv, int r, float* row) {
    const LpConfig& c = config_of(m, layer);
    int dk = c.head_dim_k, dv = c.head_dim_v;
    bool own_kv = !(layer.kv_flags & LP_KV_SHARED);
    float* q = row;
    float* k = row + c.n_heads * dk;
    const float* v = k + c.n_kv_heads * dk;
    thread_local vector<float> values;
    if (own_kv && (layer.kv_flags & (LP_V_FROM_K | LP_V_NORM))) {  // V from the raw K, and/or normed
        const float* raw = layer.kv_flags & LP_V_FROM_K ? k : v;  // k before its norm and rope
        values.assign(raw, raw + c.n_kv_heads * dv);
        if (layer.kv_flags & LP_V_NORM)
            for (int h = 0; h < c.n_kv_heads; h++) {
                float* vh = values.data() + h * dv;
                float scale = 1.0f / std::sqrt(dot(vh, vh, dv) / (float)dv + c.rms_eps);
                for (int i = 0; i < dv; i++) vh[i] *= scale;
            }
        v = values.data();
    }
    norm_heads(q, layer.q_norm, layer.qk_norm_whole, c.n_heads, dk, c.rms_eps);
    if (own_kv) norm_heads(k, layer.k_norm, layer.qk_norm_whole, c.n_kv_heads, dk, c.rms_eps);
    int64_t pos = b.positions[r];
    bool rotate = layer.rope >= 0;  // -1: a NoPE layer
    const float* cos = rotate ? c.rope_cos[layer.rope] + pos * (c.n_rot / 2) : nullptr;
    const float* sin = rotate ? c.rope_sin[layer.rope] + pos * (c.n_rot / 2) : nullptr;
    for (int h = 0; h < c.n_heads && rotate; h++) rope(q + h * dk, cos, sin, c.n_rot, c.rope_neox);
    if (c.qtemp_length > 0.0f) {
        double steps = std::floor(((double)pos + c.qtemp_offset) / c.qtemp_length);
        float factor = (float)(std::log(steps + 1.0) * c.qtemp_scale + 1.0);
        for (int i = 0; i < c.n_heads * dk; i++) q[i] *= factor;
    }
    if (!own_kv) return;
    for (int h = 0; h < c.n_kv_heads && rotate; h++) rope(k + h * dk, cos, sin, c.n_rot, c.rope_neox);
    int64_t slot = b.write_slots[r];
    for (int h = 0; h < c.n_kv_heads; h++) {
        store_kv(kv.k[layer_index], kv.k_type, ((int64_t)h * kv.pool_tokens + slot) * dk, dk, k + h * dk);
        store_kv(kv.v[layer_index], kv.v_type, ((int64_t)h * kv.pool_tokens + slot) * dv, dv, v + h * dv);
    }
}

// ---------------------------------------------------------------------------------------------
// Attention over a step's rows: tasks of (row, KV head) running attention.cpp's kernels.

// The keys and values a row attends to, as float32 rows: [first, pos] of its sequence.
struct KeyRange {
    int64_t first, n;
};

// One past the last key position row r attends to: itself (causal), or its non-causal span's end.
inline int64_t key_end(const LpBatch& b, int r) { return b.key_ends ? b.key_ends[r] : b.positions[r] + 1; }

KeyRange key_range(const LpLayer& layer, const LpBatch& b, int r) {
    int64_t pos = b.positions[r];
    int64_t first = layer.window > 0 ? std::max<int64_t>(0, pos - layer.window + 1) : 0;
    return {first, key_end(b, r) - first};
}

// Whether row r is the only row of its chunk (consecutive rows share one key list): a decode row.
bool alone_in_chunk(const LpBatch& b, int r) {
    return (r == 0 || b.key_offsets[r - 1] != b.key_offsets[r]) &&
           (r + 1 == b.n_rows || b.key_offsets[r + 1] != b.key_offsets[r]);
}

// The fewest rows of a chunk for which the AVX-512 builds transpose its keys once
// (transpose_keys) for the rows to score against; a shorter chunk's rows read the pool in place
// as decode rows do (the same bits either way). Transposing costs a pass over every key, which
// a few rows do not win back: steps of one sequence's n-row chunk (a speculative verification)
// on an Intel Xeon (family 6 model 167), in place against transposed, SmolLM2 at context 608:
// 2 rows 7.1 ms against 9.0, 8 rows 11.2 against 12.8, 16 rows 18.8 against 19.2, 25 rows 28.0
// against 27.3; at context 2000: 2 rows 9.7 against 14.8, 16 rows 34.7 against 35.3, 24 rows
// 50.1 against 47.4; random 1B Q4_K_M at 608: 2 rows 32.0 against 34.7, 16 rows the same. Those
// rows prefetch their keys as a decode row does (2-4% of such steps).
constexpr int kTransposeMinRows = 16;
// The same where a chunk's rows attend in place together with 8-key score blocks
// (lp::chunk_rows_score_in_eights: groups under 4 query heads a KV head). Shared, those rows
// beat the transposed keys further: SmolLM2 (3 a group), Intel Xeon (family 6 model 207), in
// place against transposed, attention per step at context 800: 16 rows 10.9 against 13.3 ms, 24
// rows 16.2 against 18.1, 32 rows 21.5 against 22.9; prompts at context 64: 64 rows 5.6 against
// 6.1, 256 rows 38.8 against 37.6. The random 1B file (4 a group, 4-key blocks) stays at 16: 24
// rows at context 600 28.1 in place against 25.1 transposed, 64 rows 50.9 against 44.6.
constexpr int kTransposeMinRowsInEights = 128;

void attention(Model& m, const LpLayer& layer, int li, const LpBatch& b, const LpKV& kv, const float* qkv, int n_qkv,
               float* attn) {
    const LpConfig& c = config_of(m, layer);
    int T = b.n_rows, H = c.n_kv_heads, dk = c.head_dim_k, dv = c.head_dim_v, group = c.n_heads / H;
    int64_t n_attn = (int64_t)c.n_heads * dv;
    // fp16 pools (the default) are read in place by every row; other types are converted.
    bool in_place = lp::reads_fp16_in_place && kv.k_type == LP_KV_F16 && kv.v_type == LP_KV_F16;
    // Chunks of several rows (consecutive rows with one key list) get shared converted keys, or
    // over an fp16 pool on the AVX-512 builds, shared transposed keys.
    const bool transposed = in_place && lp::scores_transposed;
    const int transpose_min_rows = lp::chunk_rows_score_in_eights(group) ? kTransposeMinRowsInEights : kTransposeMinRows;
    vector<SharedKeys>& shared = m.shared;
    vector<int>& chunk_of = m.chunk_of;
    shared.clear();
    chunk_of.assign(T, -1);
    size_t total = 0;
    for (int r = 0; r < T && (!in_place || transposed);) {
        int end = r + 1;
        while (end < T && b.key_offsets[end] == b.key_offsets[r]) end++;
        if (end - r > 1 && (!transposed || end - r >= transpose_min_rows)) {
            SharedKeys sk;
            sk.first_row = r, sk.n_rows = end - r;
            sk.lo = INT64_MAX, sk.hi = 0;
            for (int i = r; i < end; i++) {
                KeyRange kr = key_range(layer, b, i);
                sk.lo = std::min(sk.lo, kr.first), sk.hi = std::max(sk.hi, kr.first + kr.n);
                chunk_of[i] = (int)shared.size();
            }
            sk.offset = total;
            total += transposed ? lp::transposed_keys(sk.hi - sk.lo, dk) * H : (size_t)(sk.hi - sk.lo) * (dk + dv) * H;
            shared.push_back(sk);
        }
        r = end;
    }
    float* buffer = grow(m.shared_kv, transposed ? 0 : total);
    uint16_t* kt_buffer = grow(m.shared_kt, transposed ? total : 0);
    auto keys_of = [&](const SharedKeys& sk, int g) { return buffer + sk.offset + (size_t)g * (sk.hi - sk.lo) * (dk + dv); };
    auto kt_of = [&](const SharedKeys& sk, int g) {
        return kt_buffer + sk.offset + (size_t)g * lp::transposed_keys(sk.hi - sk.lo, dk);
    };
    const auto head_rows = [&](const void* pool, int g, int d) {
        return (const uint16_t*)pool + (int64_t)g * kv.pool_tokens * d;  // an fp16 pool's KV head g
    };
    lp::parallel_for((int64_t)shared.size() * H, [&](int64_t task, int) {
        const SharedKeys& sk = shared[task / H];
        int g = (int)(task % H);
        int64_t n = sk.hi - sk.lo;
        const int64_t* slots = b.key_slots + b.key_offsets[sk.first_row] + sk.lo;
        if (transposed) {
            lp::transpose_keys(head_rows(kv.k[li], g, dk), slots, n, dk, kt_of(sk, g));
            return;
        }
        float* keys = keys_of(sk, g);
        lp::load_rows(kv.k[li], kv.k_type, (int64_t)g * kv.pool_tokens * dk, slots, n, dk, keys);
        lp::load_rows(kv.v[li], kv.v_type, (int64_t)g * kv.pool_tokens * dv, slots, n, dv, keys + n * dk);
    });
    // Two buffers a thread; the pool can grow between steps (lp_set_threads), so compare with both.
    const size_t scratch_buffers = 2 * (size_t)lp::pool_threads();
    if (m.thread_scratch.size() < scratch_buffers) m.thread_scratch.resize(scratch_buffers);
    // Tasks of rows: a row alone, or up to lp::chunk_rows_together rows of a chunk read in place
    // (too short to transpose), which share the reads of their keys and values.
    vector<std::pair<int, int>>& tasks = m.attention_tasks;
    tasks.clear();
    // Rows of a transposed chunk likewise share its key vectors, up to lp::transposed_rows_together:
    // SmolLM2's 512-token prompt's attention 57-58 ms against 66-69 a row at a time, the random
    // 1B Q4_K_M file's 97-98 against 104-108 (Intel Xeon family 6 model 207, two runners of each
    // build alternated in one process).
    const int together = in_place && lp::attends_chunk_rows_together ? lp::chunk_rows_together(group) : 1;
    const int together_transposed = transposed ? lp::transposed_rows_together(group) : 1;
    for (int r = 0; r < T;) {
        int count = 1;
        const int most = chunk_of[r] < 0 ? together : together_transposed;
        if (most > 1) {
            const int64_t first = key_range(layer, b, r).first;
            while (count < most && r + count < T && b.key_offsets[r + count] == b.key_offsets[r] &&
                   chunk_of[r + count] == chunk_of[r] && key_range(layer, b, r + count).first == first)
                count++;
        }
        tasks.emplace_back(r, count);
        r += count;
    }
    const auto one_row = [&](int r, int g, int thread) {
        KeyRange kr = key_range(layer, b, r);
        const float* q = qkv + (int64_t)r * n_qkv + (int64_t)g * group * dk;
        float* out = attn + r * n_attn + (int64_t)g * group * dv;
        const float* sinks = layer.sinks ? layer.sinks + (int64_t)g * group : nullptr;
        vector<float>& scratch = m.thread_scratch[2 * thread];
        const int64_t* slots = b.key_slots + b.key_offsets[r] + kr.first;
        if (chunk_of[r] >= 0) {
            const SharedKeys& sk = shared[chunk_of[r]];
            int64_t skip = kr.first - sk.lo;
            if (transposed) {  // attend_rows_transposed runs on every build where `transposed` holds
                lp::attend_rows_transposed(c, q, kt_of(sk, g), skip, kr.n, head_rows(kv.v[li], g, dv), slots, sinks,
                                           out, scratch);
                return;
            }
            const float* keys = keys_of(sk, g);
            const float* values = keys + (sk.hi - sk.lo) * dk;
            lp::attend_rows(c, q, keys + skip * dk, values + skip * dv, kr.n, sinks, out, scratch);
            return;
        }
        if (in_place && lp::attend_rows_in_place(c, q, head_rows(kv.k[li], g, dk), head_rows(kv.v[li], g, dv), slots,
                                                 kr.n, sinks, out, scratch, transposed || alone_in_chunk(b, r)))
            return;
        float* keys = grow(m.thread_scratch[2 * thread + 1], (size_t)kr.n * (dk + dv));
        lp::load_rows(kv.k[li], kv.k_type, (int64_t)g * kv.pool_tokens * dk, slots, kr.n, dk, keys);
        lp::load_rows(kv.v[li], kv.v_type, (int64_t)g * kv.pool_tokens * dv, slots, kr.n, dv, keys + kr.n * dk);
        lp::attend_rows(c, q, keys, keys + kr.n * dk, kr.n, sinks, out, scratch);
    };
    lp::parallel_for((int64_t)tasks.size() * H, [&](int64_t task, int thread) {
        const auto [first_row, count] = tasks[task / H];
        const int g = (int)(task % H);
        if (count > 1) {
            const float* qs[8];  // lp::chunk_rows_together and transposed_rows_together are at most 8
            float* outs[8];
            int64_t ns[8];
            for (int i = 0; i < count; i++) {
                const int r = first_row + i;
                qs[i] = qkv + (int64_t)r * n_qkv + (int64_t)g * group * dk;
                outs[i] = attn + r * n_attn + (int64_t)g * group * dv;
                ns[i] = key_range(layer, b, r).n;
            }
            const int64_t first = key_range(layer, b, first_row).first;
            const int64_t* slots = b.key_slots + b.key_offsets[first_row] + first;
            const lp::LpChunkRows rows{&c, count, qs, ns, outs, layer.sinks ? layer.sinks + (int64_t)g * group : nullptr,
                                       transposed};
            if (chunk_of[first_row] >= 0) {
                const SharedKeys& sk = shared[chunk_of[first_row]];
                if (lp::attend_chunk_rows_transposed(rows, kt_of(sk, g), first - sk.lo, head_rows(kv.v[li], g, dv), slots,
                                                     m.thread_scratch[2 * thread]))
                    return;
            } else if (lp::attend_chunk_rows_in_place(rows, head_rows(kv.k[li], g, dk), head_rows(kv.v[li], g, dv),
                                                      slots, m.thread_scratch[2 * thread])) {
                return;
            }
        }
        for (int r = first_row; r < first_row + count; r++) one_row(r, g, thread);
    });
}


// -- mixture of experts ----------------------------------------------------------------------

inline float swiglu_oai(float gate, float up) {  // gpt-oss: clamped, x sigmoid(1.702 x) (up + 1)
    gate = std::min(gate, 7.0f);
    up = std::min(std::max(up, -7.0f), 7.0f);
    return gate / (1.0f + exp_approx(-1.702f * gate)) * (up + 1.0f);
}

float gated(int activation, float gate, float up) {
    if (activation == LP_ACT_SWIGLU_OAI) return swiglu_oai(gate, up);
    if (activation == LP_ACT_GELU_TANH) return gelu_tanh(gate) * up;
    return silu(gate) * up;
}

// The k largest of values[0..n) (ties: the lower index first), into chosen[0..k).
void top_k(const float* values, int n, int k, int* chosen) {
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < n; e++) {
            bool taken = false;
            for (int i = 0; i < j; i++) taken |= chosen[i] == e;
            if (!taken && (best < 0 || values[e] > values[best])) best = e;
        }
        chosen[j] = best;
    }
}

// One row's experts and weights (llama.cpp's gating), from the router's float32 logits.
void route(const LpExperts& ex, const float* x, int E, int* chosen, float* weights) {
    float logits[LP_MAX_EXPERTS];
    for (int e = 0; e < ex.n_expert; e++)
        logits[e] = dot(x, ex.router + (int64_t)e * E, E) + (ex.router_bias ? ex.router_bias[e] : 0.0f);
    int k = ex.n_used;
    if (ex.gating == LP_GATING_SOFTMAX_SELECTED) {
        top_k(logits, ex.n_expert, k, chosen);
        float mx = logits[chosen[0]], sum = 0.0f;
        for (int j = 0; j < k; j++) sum += weights[j] = std::exp(logits[chosen[j]] - mx);
        for (int j = 0; j < k; j++) weights[j] /= sum;
        return;
    }
    float mx = -INFINITY, sum = 0.0f;
    for (int e = 0; e < ex.n_expert; e++) mx = std::max(mx, logits[e]);
    for (int e = 0; e < ex.n_expert; e++) sum += logits[e] = std::exp(logits[e] - mx);
    for (int e = 0; e < ex.n_expert; e++) logits[e] /= sum;
    top_k(logits, ex.n_expert, k, chosen);
    float total = 0.0f;
    for (int j = 0; j < k; j++) total += weights[j] = logits[chosen[j]];
    if (ex.normalize)
        for (int j = 0; j < k; j++) weights[j] /= total;
}

// out [T, E] += the shared expert's output on every row, times sigmoid(shared_gate . x).
void shared_expert(Model& m, const LpExperts& ex, int T, const float* x, float* out) {
    int E = m.cfg.n_embd, F = ex.shared_n_ff;
    float* gu = grow(m.moe_gate_up, (size_t)T * 2 * F);
    linear(*ex.shared_gate_up, x, T, gu, m.acts);
    float* act = grow(m.moe_act, (size_t)T * F);
    for_rows(T, [&](int r, int) {
        const float* g = gu + (int64_t)r * 2 * F;
        for (int f = 0; f < F; f++) act[(int64_t)r * F + f] = gated(ex.activation, g[f], g[F + f]);
    });
    float* y = grow(m.moe_y, (size_t)T * E);
    linear(*ex.shared_down, act, T, y, m.acts);
    for_rows(T, [&](int r, int) {
        const float* xr = x + (int64_t)r * E;
        float scale = ex.shared_gate ? lp::sigmoid(dot(xr, ex.shared_gate, E)) : 1.0f;
        float* o = out + (int64_t)r * E;
        for (int i = 0; i < E; i++) o[i] += y[(int64_t)r * E + i] * scale;
    });
}

// out [T, E] = each row's selected experts' outputs, weighted, summed in ascending expert order.
// Each expert runs once on the rows that chose it; its matmuls are row-invariant, so a row's
// result never depends on which other rows chose the same experts.
void moe_forward(Model& m, const LpExperts& ex, const LpBatch& b, const float* x, float* out) {
    const LpConfig& c = m.cfg;
    int T = b.n_rows, E = c.n_embd, K = ex.n_used, F = ex.n_ff;
    int* chosen = grow(m.moe_selected, (size_t)T * K);
    float* weights = grow(m.moe_weights, (size_t)T * K);
    for_rows(T, [&](int r, int) { route(ex, x + (int64_t)r * E, E, chosen + r * K, weights + r * K); });
    m.moe_rows.resize(ex.n_expert);
    for (auto& rows : m.moe_rows) rows.clear();
    for (int i = 0; i < T * K; i++) m.moe_rows[chosen[i]].push_back(i);
    float* outputs = grow(m.moe_outputs, (size_t)T * K * E);
    for (int e = 0; e < ex.n_expert; e++) {
        const vector<int>& rows = m.moe_rows[e];
        int n = (int)rows.size();
        if (!n) continue;
        float* xe = grow(m.moe_x, (size_t)n * E);
        for (int i = 0; i < n; i++) std::memcpy(xe + (int64_t)i * E, x + (int64_t)(rows[i] / K) * E, E * sizeof(float));
        float* gu = grow(m.moe_gate_up, (size_t)n * 2 * F);
        linear(ex.gate_up[e], xe, n, gu, m.acts);
        float* act = grow(m.moe_act, (size_t)n * F);
        for_rows(n, [&](int i, int) {
            for (int f = 0; f < F; f++) act[(int64_t)i * F + f] = gated(ex.activation, gu[(int64_t)i * 2 * F + f], gu[(int64_t)i * 2 * F + F + f]);
        });
        float* y = grow(m.moe_y, (size_t)n * E);
        linear(ex.down[e], act, n, y, m.acts);
        for (int i = 0; i < n; i++) std::memcpy(outputs + (int64_t)rows[i] * E, y + (int64_t)i * E, E * sizeof(float));
    }
    for_rows(T, [&](int r, int) {
        int order[LP_MAX_EXPERTS_USED];
        for (int j = 0; j < K; j++) order[j] = j;
        std::sort(order, order + K, [&](int a, int b2) { return chosen[r * K + a] < chosen[r * K + b2]; });
        float* o = out + (int64_t)r * E;
        std::memset(o, 0, E * sizeof(float));
        for (int j = 0; j < K; j++) {
            const float* y = outputs + ((int64_t)r * K + order[j]) * E;
            float w = weights[r * K + order[j]];
            for (int i = 0; i < E; i++) o[i] += y[i] * w;
        }
    });
    if (ex.shared_n_ff) shared_expert(m, ex, T, x, out);
}

// h += o (times the residual scale), through the layer's post-norm first if it has one.
void add_residual(float* hr, const float* o, const float* post_norm, const LpConfig& c) {
    int E = c.n_embd;
    float tmp[LP_MAX_EMBD];
    if (post_norm) {
        rms_norm(o, post_norm, c.rms_eps, E, tmp);
        o = tmp;
    }
    if (c.residual_scale != 1.0f)
        for (int i = 0; i < E; i++) hr[i] += o[i] * c.residual_scale;
    else
        for (int i = 0; i < E; i++) hr[i] += o[i];
}

// The branch input: the normed residual stream, or the stream itself without a norm (olmo2).
void branch_input(const float* hr, const float* norm, const LpConfig& c, float* x) {
    if (norm)
        rms_norm(hr, norm, c.rms_eps, c.n_embd, x);
    else
        std::memcpy(x, hr, c.n_embd * sizeof(float));
}

// The attention branch: out [T, E] from the normed (and quantized) rows x.
void attention_branch(Model& m, const LpLayer& layer, const LpBatch& b, const LpKV& kv, const float* x, float* out,
                      PhaseTimer& timer) {
    const LpConfig& c = config_of(m, layer);
    int T = b.n_rows, n_qkv = layer.qkv.n_out, n_attn = c.n_heads * c.head_dim_v, n_q = c.n_heads * c.head_dim_k;
    float* qkv = grow(m.qkv, (size_t)T * n_qkv);
    float* attn = grow(m.attn, (size_t)T * n_attn);
    float* gate = layer.output_gate ? grow(m.gate, (size_t)T * n_q) : nullptr;
    linear(layer.qkv, x, T, qkv, m.acts, true, b.lora_scales);
    timer.lap(P_QKV);
    for_rows(T, [&](int r, int) {
        float* row = qkv + (int64_t)r * n_qkv;
        if (gate) split_output_gate(c, row, n_qkv, gate + (int64_t)r * n_q);
        prepare_row(m, layer, layer.kv_layer, b, kv, r, row);
    });
    timer.lap(P_ROPE_KV);
    attention(m, layer, layer.kv_layer, b, kv, qkv, n_qkv, attn);
    if (gate)
        for_rows(T, [&](int r, int) {
            float* a = attn + (int64_t)r * n_attn;
            const float* g = gate + (int64_t)r * n_q;
            for (int i = 0; i < n_attn; i++) a[i] *= lp::sigmoid(g[i]);
        });
    timer.lap(P_ATTENTION);
    linear(layer.wo, attn, T, out, m.acts, false, b.lora_scales);
    timer.lap(P_WO);
}

// A recurrent branch (src/recurrent.h): in_proj, the per-sequence scan, out.
void recurrent_branch(Model& m, const LpRecurrent& mixer, const LpBatch& b, const float* x, float* out,
                      PhaseTimer& timer) {
    int T = b.n_rows;
    float* proj = grow(m.qkv, (size_t)T * mixer.in_proj.n_out);
    float* inner = grow(m.attn, (size_t)T * mixer.inner);
    linear(mixer.in_proj, x, T, proj, m.acts, true, b.lora_scales);
    timer.lap(P_QKV);
    lp::recurrent_scan(mixer, b, m.cfg.rms_eps, proj, m.recurrent, inner);
    timer.lap(P_ATTENTION);
    linear(mixer.out, inner, T, out, m.acts, false, b.lora_scales);
    timer.lap(P_WO);
}

// One decoder layer. `pending`: the previous layer, whose MLP output (in m.out) is added to the
// residual stream in this layer's first phase (one parallel phase fewer per layer).
void layer_forward(Model& m, int li, const LpBatch& b, const LpKV& kv, const LpLayer* pending) {
    const LpConfig& c = m.layer_cfg[li];
    const LpLayer& layer = m.layers[li];
    int T = b.n_rows, E = c.n_embd, F = c.n_ff;
    float *h = m.h.data(), *x = m.x.data();
    float* out = grow(m.out, (size_t)T * E);

    PhaseTimer timer;
    // Each phase quantizes its rows for the linear that reads them next (only the parts of a
    // row its weights read): qkv or the recurrent in_proj, gate_up (an MoE's experts quantize
    // their own rows), down.
    const int attn_parts = acts_parts(layer.recurrent ? layer.recurrent->in_proj : layer.qkv);
    const int ffn_parts = layer.moe ? 0 : acts_parts(layer.gate_up);
    uint8_t* acts = acts_for(m.acts, T, E);
    for_rows(T, [&](int r, int) {
        float* hr = h + (int64_t)r * E;
        if (pending) add_residual(hr, out + (int64_t)r * E, pending->post_ffn_norm, c);
        branch_input(hr, layer.attn_norm, c, x + (int64_t)r * E);
        quantize_row(x, E, r, acts, attn_parts);
    });
    timer.lap(P_NORM);
    if (layer.recurrent)
        recurrent_branch(m, *layer.recurrent, b, x, out, timer);
    else
        attention_branch(m, layer, b, kv, x, out, timer);
    acts = acts_for(m.acts, T, E);
    for_rows(T, [&](int r, int) {
        float* hr = h + (int64_t)r * E;
        add_residual(hr, out + (int64_t)r * E, layer.post_attn_norm, c);
        branch_input(hr, layer.ffn_norm, c, x + (int64_t)r * E);
        quantize_row(x, E, r, acts, ffn_parts);
    });
    timer.lap(P_RESIDUAL);
    if (layer.moe) {
        moe_forward(m, *layer.moe, b, x, out);
        timer.lap(P_DOWN);
        return;
    }
    const int down_parts = acts_parts(layer.down);
    const auto activate = [&](const float* gate, const float* up, int n, float* a) {
        if (c.activation == LP_ACT_GELU_TANH)
            for (int i = 0; i < n; i++) a[i] = gelu_tanh(gate[i]) * up[i];
        else
            for (int i = 0; i < n; i++) a[i] = silu(gate[i]) * up[i];
    };
    if (lp::gated_fuses(layer.gate_up, layer.down, F, T)) {
        lp::gated_linear(layer.gate_up, F, T, m.acts.data(), down_parts, acts_for(m.ffn_acts, T, F), m.ffn_scratch,
                         activate);
        timer.lap(P_GATE_UP);
        linear(layer.down, nullptr, T, out, m.ffn_acts, true, b.lora_scales);
        timer.lap(P_DOWN);
        return;
    }
    float* gu = grow(m.gate_up, (size_t)T * 2 * F);
    float* act = grow(m.act, (size_t)T * F);
    linear(layer.gate_up, x, T, gu, m.acts, true, b.lora_scales);
    timer.lap(P_GATE_UP);
    acts = acts_for(m.acts, T, F);
    for_rows(T, [&](int r, int) {
        const float* g = gu + (int64_t)r * 2 * F;
        activate(g, g + F, F, act + (int64_t)r * F);
        quantize_row(act, F, r, acts, down_parts);
    });
    timer.lap(P_ACTIVATION);
    linear(layer.down, act, T, out, m.acts, true, b.lora_scales);
    timer.lap(P_DOWN);
}

// Gemma 4's per-layer inputs [T, n_layers * P], from the scaled embeddings (in m.h) and the
// batch's per-layer token rows.
void per_layer_inputs(Model& m, const LpBatch& b) {
    const LpConfig& c = m.cfg;
    const LpPerLayerEmbedding& pe = *c.per_layer_embedding;
    int T = b.n_rows, E = c.n_embd, P = pe.size, L = c.n_layers;
    float* ple = grow(m.ple, (size_t)T * L * P);
    linear(pe.model_proj, m.h.data(), T, ple, m.acts);
    const float proj_scale = 1.0f / std::sqrt((float)E), row_scale = std::sqrt((float)P), half = 1.0f / std::sqrt(2.0f);
    for_rows(T, [&](int r, int) {
        float projected[LP_MAX_EMBD];
        for (int il = 0; il < L; il++) {
            float* p = ple + ((int64_t)r * L + il) * P;
            const float* rows = b.per_layer_rows + ((int64_t)r * L + il) * P;
            for (int i = 0; i < P; i++) p[i] *= proj_scale;
            rms_norm(p, pe.proj_norm, c.rms_eps, P, projected);
            for (int i = 0; i < P; i++) p[i] = (projected[i] + rows[i] * row_scale) * half;
        }
    });
}

// Layers with a per-layer input or an output scale add their FFN output themselves (the others
// leave it to the next layer's first phase).
bool finishes_itself(const LpLayer& layer) { return layer.per_layer_input || layer.output_scale != 0.0f; }

// The FFN's residual add, then x += rms(proj (act(inp_gate x) * ple_il), post_norm), then
// x *= output_scale.
void finish_layer(Model& m, int li, const LpBatch& b) {
    const LpConfig& c = m.layer_cfg[li];
    const LpLayer& layer = m.layers[li];
    int T = b.n_rows, E = c.n_embd, L = c.n_layers;
    float *h = m.h.data(), *out = m.out.data();
    for_rows(T, [&](int r, int) { add_residual(h + (int64_t)r * E, out + (int64_t)r * E, layer.post_ffn_norm, c); });
    if (layer.per_layer_input) {
        const LpPerLayerInput& pli = *layer.per_layer_input;
        int P = pli.inp_gate.n_out;
        float* gate = grow(m.ple_gate, (size_t)T * P);
        linear(pli.inp_gate, h, T, gate, m.acts, false, b.lora_scales);
        for_rows(T, [&](int r, int) {
            const float* ple = m.ple.data() + ((int64_t)r * L + li) * P;
            for (int i = 0; i < P; i++) gate[(int64_t)r * P + i] = gated(c.activation, gate[(int64_t)r * P + i], ple[i]);
        });
        linear(pli.proj, gate, T, out, m.acts, false, b.lora_scales);
        for_rows(T, [&](int r, int) {
            float normed[LP_MAX_EMBD];
            rms_norm(out + (int64_t)r * E, pli.post_norm, c.rms_eps, E, normed);
            for (int i = 0; i < E; i++) h[(int64_t)r * E + i] += normed[i];
        });
    }
    if (layer.output_scale != 0.0f)
        for_rows(T, [&](int r, int) {
            for (int i = 0; i < E; i++) h[(int64_t)r * E + i] *= layer.output_scale;
        });
}

// The logit rows' last residual add and final norm into normed [n_logits, E] (quantized into
// m.acts for the head unless `for_head` is false).
void final_norm(Model& m, const LpBatch& b, float* normed, bool for_head) {
    const LpConfig& c = m.cfg;
    const int E = c.n_embd;
    const LpLayer& last = m.layers[c.n_layers - 1];
    const bool last_pending = !finishes_itself(last);
    float* h = m.h.data();
    uint8_t* acts = for_head ? acts_for(m.acts, b.n_logits, E) : nullptr;
    const int head_parts = for_head ? acts_parts(c.head) : 0;
    for_rows(b.n_logits, [&](int i, int) {
        float* hr = h + b.logit_rows[i] * E;
        if (last_pending) add_residual(hr, m.out.data() + b.logit_rows[i] * E, last.post_ffn_norm, c);
        rms_norm(hr, c.output_norm, c.rms_eps, E, normed + (int64_t)i * E);
        if (for_head) quantize_row(normed, E, i, acts, head_parts);
    });
}

// The step itself, once its batch is checked: logits [n_logits, vocab], or with `hidden` the
// logit rows' final-normed hidden states [n_logits, n_embd] instead (no head: embeddings).
void forward(Model& m, const LpBatch& b, const LpKV& kv, float* logits, bool hidden) {
    const LpConfig& c = m.cfg;
    int T = b.n_rows, E = c.n_embd;
    float* h = grow(m.h, (size_t)T * E);
    grow(m.x, (size_t)T * E);
    for_rows(T, [&](int r, int) {
        float scale = b.given_rows && b.given_rows[r] ? 1.0f : c.embd_scale;  // image rows are used as they are
        for (int i = 0; i < E; i++) h[(int64_t)r * E + i] = b.embeddings[(int64_t)r * E + i] * scale;
    });
    if (c.per_layer_embedding) per_layer_inputs(m, b);
    for (int li = 0; li < c.n_layers; li++) {
        const LpLayer* previous = li > 0 ? &m.layers[li - 1] : nullptr;
        layer_forward(m, li, b, kv, previous && !finishes_itself(*previous) ? previous : nullptr);
        if (finishes_itself(m.layers[li])) finish_layer(m, li, b);
    }
    PhaseTimer timer;
    // Only the logit rows need the last layer's output and the final norm.
    if (hidden) {
        final_norm(m, b, logits, false);  // `logits` holds the hidden states here
        timer.lap(P_HEAD);
        lp::commit_states(m.recurrent);
        return;
    }
    float* normed = grow(m.logits_in, (size_t)b.n_logits * E);
    final_norm(m, b, normed, true);
    linear(c.head, normed, b.n_logits, logits, m.acts, true, b.lora_scales);
    if (c.logit_scale != 1.0f || c.final_softcap > 0.0f)
        for_rows(b.n_logits, [&](int i, int) {
            float* row = logits + (int64_t)i * c.vocab;
            if (c.logit_scale != 1.0f)
                for (int j = 0; j < c.vocab; j++) row[j] /= c.logit_scale;
            if (c.final_softcap > 0.0f)
                for (int j = 0; j < c.vocab; j++) row[j] = std::tanh(row[j] / c.final_softcap) * c.final_softcap;
        });
    timer.lap(P_HEAD);
    lp::commit_states(m.recurrent);  // the step succeeded: its sequences' new recurrent states
}

// -- checks at the C boundary -----------------------------------------------------------------
// The caller's data is checked before it is used: a description or an index the forward would
// read or write out of bounds with is an LP_ERR_* code and a message (lp_last_error), never a
// stray access. The model once, in lp_model_new; each step's indices in lp_forward (integer
// compares over the rows and the key slots they read, next to a step's matmuls: nothing).

int32_t check_experts(const LpExperts& ex, const LpConfig& c, int li, int32_t& n_adapters) {
    if (ex.n_expert < 1 || ex.n_expert > LP_MAX_EXPERTS || ex.n_used < 1 || ex.n_used > ex.n_expert ||
        ex.n_used > LP_MAX_EXPERTS_USED || ex.n_ff < 1 || !ex.router || !ex.gate_up || !ex.down)
        return lp::fail(LP_ERR_MODEL, "layer %d: %d experts (up to %d), %d used (up to %d), width %d", li, ex.n_expert,
                        LP_MAX_EXPERTS, ex.n_used, LP_MAX_EXPERTS_USED, ex.n_ff);
    char name[64];
    for (int e = 0; e < ex.n_expert; e++) {
        std::snprintf(name, sizeof name, "layer %d expert %d gate_up", li, e);
        if (int32_t rc = check_linear(ex.gate_up[e], name, c.n_embd, 2 * (int64_t)ex.n_ff, n_adapters)) return rc;
        std::snprintf(name, sizeof name, "layer %d expert %d down", li, e);
        if (int32_t rc = check_linear(ex.down[e], name, ex.n_ff, c.n_embd, n_adapters)) return rc;
    }
    if (!ex.shared_n_ff) return LP_OK;
    if (ex.shared_n_ff < 0 || !ex.shared_gate_up || !ex.shared_down)
        return lp::fail(LP_ERR_MODEL, "layer %d: a shared expert of width %d without its weights", li, ex.shared_n_ff);
    std::snprintf(name, sizeof name, "layer %d shared expert gate_up", li);
    if (int32_t rc = check_linear(*ex.shared_gate_up, name, c.n_embd, 2 * (int64_t)ex.shared_n_ff, n_adapters)) return rc;
    std::snprintf(name, sizeof name, "layer %d shared expert down", li);
    return check_linear(*ex.shared_down, name, ex.shared_n_ff, c.n_embd, n_adapters);
}

// The token mixer: attention (Q/K/V, output) or a recurrent mixer (in_proj, out).
int32_t check_mixer(const LpLayer& layer, const LpConfig& c, int li, int32_t& n_adapters) {
    int64_t dk = c.head_dim_k, dv = c.head_dim_v, E = c.n_embd;
    char name[64];
    if (layer.recurrent) {
        const LpRecurrent& mixer = *layer.recurrent;
        std::snprintf(name, sizeof name, "layer %d in_proj", li);
        if (int32_t rc = check_linear(mixer.in_proj, name, E, mixer.in_proj.n_out, n_adapters)) return rc;
        std::snprintf(name, sizeof name, "layer %d out", li);
        if (int32_t rc = check_linear(mixer.out, name, mixer.inner, E, n_adapters))
            return rc;
        return lp::check_recurrent(mixer, c.n_embd, li);
    }
    bool rope_ok = layer.rope == -1 || (layer.rope >= 0 && layer.rope <= 1 && c.rope_cos[layer.rope] && c.rope_sin[layer.rope]);
    if (!rope_ok || layer.window < 0 ||
        layer.kv_layer < 0 || (layer.output_gate && dk != dv))
        return lp::fail(LP_ERR_MODEL, "layer %d: rope table %d (0 or 1, both tables set; -1 none), window %d, KV layer %d, "
                        "output gate %d (head sizes %lld/%lld)", li, layer.rope, layer.window, layer.kv_layer,
                        layer.output_gate, (long long)dk, (long long)dv);
    std::snprintf(name, sizeof name, "layer %d qkv", li);
    int64_t n_q = c.n_heads * (layer.output_gate ? 2 : 1) * dk;
    int64_t n_qkv = layer.kv_flags & LP_KV_SHARED ? n_q
                    : n_q + c.n_kv_heads * dk + (layer.kv_flags & LP_V_FROM_K ? 0 : c.n_kv_heads * dv);
    if (int32_t rc = check_linear(layer.qkv, name, E, n_qkv, n_adapters)) return rc;
    std::snprintf(name, sizeof name, "layer %d wo", li);
    return check_linear(layer.wo, name, c.n_heads * dv, E, n_adapters);
}

// A layer's own shape (its view of the config) and its per-layer input branch.
int32_t check_layer_extras(const LpLayer& layer, const LpConfig& c, int li, int32_t& n_adapters) {
    if (layer.n_kv_heads < 0 || layer.head_dim < 0 || layer.n_ff < 0 || layer.n_rot < 0 || c.n_kv_heads < 1 ||
        c.n_heads % c.n_kv_heads != 0 || c.head_dim_k % 8 != 0 || c.head_dim_k > LP_MAX_HEAD_DIM ||
        c.n_rot > c.head_dim_k || c.n_rot % 2 != 0 || layer.kv_flags < 0 || layer.kv_flags > 7)
        return lp::fail(LP_ERR_MODEL, "layer %d: %d KV heads of %d (a multiple of 8 up to %d), %d rotated, KV flags %d", li,
                        c.n_kv_heads, c.head_dim_k, LP_MAX_HEAD_DIM, c.n_rot, layer.kv_flags);
    if (!layer.per_layer_input) return LP_OK;
    const LpPerLayerInput& pli = *layer.per_layer_input;
    const LpPerLayerEmbedding* pe = c.per_layer_embedding;
    char name[64];
    if (!pe || !pli.post_norm || pli.inp_gate.n_out != pe->size)
        return lp::fail(LP_ERR_MODEL, "layer %d: a per-layer input branch without the model's per-layer embedding", li);
    std::snprintf(name, sizeof name, "layer %d inp_gate", li);
    if (int32_t rc = check_linear(pli.inp_gate, name, c.n_embd, pe->size, n_adapters)) return rc;
    std::snprintf(name, sizeof name, "layer %d proj", li);
    return check_linear(pli.proj, name, pe->size, c.n_embd, n_adapters);
}

int32_t check_layer(const LpLayer& layer, const LpConfig& c, int li, int32_t& n_adapters) {
    int64_t E = c.n_embd;
    char name[64];
    if (int32_t rc = check_layer_extras(layer, c, li, n_adapters)) return rc;
    if (int32_t rc = check_mixer(layer, c, li, n_adapters)) return rc;
    if (layer.moe) return check_experts(*layer.moe, c, li, n_adapters);
    std::snprintf(name, sizeof name, "layer %d gate_up", li);
    if (int32_t rc = check_linear(layer.gate_up, name, E, 2 * (int64_t)c.n_ff, n_adapters)) return rc;
    std::snprintf(name, sizeof name, "layer %d down", li);
    return check_linear(layer.down, name, c.n_ff, E, n_adapters);
}

// The KV pool's layer count and the recurrent layers by state index (each index once, 0..n-1).
int32_t index_state_layers(Model& m) {
    m.n_kv_layers = 0;
    m.mixers.clear();
    for (const LpLayer& layer : m.layers) {
        if (!layer.recurrent) {
            m.n_kv_layers = std::max(m.n_kv_layers, layer.kv_layer + 1);
            continue;
        }
        int32_t index = layer.recurrent->state;
        if (index < 0 || index >= m.cfg.n_layers)
            return lp::fail(LP_ERR_MODEL, "recurrent state index %d is out of range", index);
        if ((int)m.mixers.size() <= index) m.mixers.resize(index + 1, nullptr);
        if (m.mixers[index]) return lp::fail(LP_ERR_MODEL, "two recurrent layers on state index %d", index);
        m.mixers[index] = layer.recurrent;
    }
    for (size_t i = 0; i < m.mixers.size(); i++)
        if (!m.mixers[i]) return lp::fail(LP_ERR_MODEL, "no recurrent layer on state index %zu", i);
    return LP_OK;
}

// The whole description; sets m.n_adapters, m.n_kv_layers and m.mixers.
int32_t check_model(Model& m) {
    const LpConfig& c = m.cfg;
    if (c.n_layers < 1 || c.n_embd < 1 || c.n_heads < 1 || c.n_kv_heads < 1 || c.n_heads % c.n_kv_heads != 0 ||
        c.head_dim_k < 1 || c.head_dim_v < 1 || c.n_ff < 0 || c.vocab < 1 || c.n_rot < 0 || c.n_rot % 2 != 0 ||
        c.n_rot > c.head_dim_k || c.rope_max_pos < 0 || !c.output_norm)
        return lp::fail(LP_ERR_MODEL, "config: %d layers, width %d, %d heads over %d KV heads, head sizes %d/%d, "
                        "%d rotated, vocabulary %d", c.n_layers, c.n_embd, c.n_heads, c.n_kv_heads, c.head_dim_k,
                        c.head_dim_v, c.n_rot, c.vocab);
    m.n_adapters = 0;
    for (int li = 0; li < c.n_layers; li++)
        if (int32_t rc = check_layer(m.layers[li], m.layer_cfg[li], li, m.n_adapters)) return rc;
    if (const LpPerLayerEmbedding* pe = c.per_layer_embedding) {
        if (pe->size < 1 || pe->size > LP_MAX_EMBD || !pe->proj_norm)
            return lp::fail(LP_ERR_MODEL, "per-layer embedding of size %d", pe->size);
        if (int32_t rc = check_linear(pe->model_proj, "per-layer model_proj", c.n_embd, (int64_t)c.n_layers * pe->size, m.n_adapters))
            return rc;
    }
    if (int32_t rc = index_state_layers(m)) return rc;
    return check_linear(c.head, "head", c.n_embd, c.vocab, m.n_adapters);
}

int32_t check_pool(const LpKV& kv, int32_t n_kv_layers) {
    if (kv.n_layers != n_kv_layers || !kv.k || !kv.v || kv.pool_tokens < 0 || !lp::kv_type_known(kv.k_type) || !lp::kv_type_known(kv.v_type))
        return lp::fail(LP_ERR_ARGUMENT, "the KV pool (%d layers, %lld tokens, types %d/%d) is not one for this model "
                        "(%d KV layers)", kv.n_layers, (long long)kv.pool_tokens, kv.k_type, kv.v_type, n_kv_layers);
    return LP_OK;
}

int32_t check_counts(const Model& m, const LpBatch& b) {
    if (b.n_rows < 0 || b.n_logits < 0 || b.n_key_slots < 0 || b.n_lora_scales < 0)
        return lp::fail(LP_ERR_ARGUMENT, "negative counts in the batch (rows %d, logits %d, key slots %lld, LoRA scales %d)",
                        b.n_rows, b.n_logits, (long long)b.n_key_slots, b.n_lora_scales);
    bool rows = b.n_rows > 0;
    if ((rows && (!b.embeddings || !b.positions || !b.write_slots || !b.key_offsets)) ||
        (rows && m.cfg.per_layer_embedding && !b.per_layer_rows) ||
        (b.n_key_slots > 0 && !b.key_slots) || (b.n_logits > 0 && !b.logit_rows) ||
        (b.n_lora_scales > 0 && !b.lora_scales))
        return lp::fail(LP_ERR_ARGUMENT, "a null array in a batch of %d rows", b.n_rows);
    // Adapter indices are the model's (checked once): a step's scales must cover the largest.
    if (b.lora_scales && m.n_adapters > b.n_lora_scales)
        return lp::fail(LP_ERR_LORA_ADAPTER, "LoRA adapter %d is out of range: lora_scales holds %d", m.n_adapters - 1,
                        b.n_lora_scales);
    return LP_OK;
}

// Every index the step reads from the batch's arrays: positions (RoPE tables), write slots and
// key slots (the pool), key offsets (key_slots), logit rows (the rows).
int32_t check_batch(const Model& m, const LpBatch& b, const LpKV& kv) {
    const LpConfig& c = m.cfg;
    if (int32_t rc = check_pool(kv, m.n_kv_layers)) return rc;
    if (int32_t rc = check_counts(m, b)) return rc;
    const int T = b.n_rows;
    int64_t run_max = -1;  // the largest position among the rows sharing one key list so far
    for (int r = 0; r < T; r++) {
        int64_t pos = b.positions[r];
        if (pos < 0 || pos >= c.rope_max_pos)
            return lp::fail(LP_ERR_POSITION, "positions[%d] = %lld is out of range [0, %d)", r, (long long)pos,
                            c.rope_max_pos);
        if (b.write_slots[r] < 0 || b.write_slots[r] >= kv.pool_tokens)
            return lp::fail(LP_ERR_WRITE_SLOT, "write_slots[%d] = %lld is out of range [0, %lld)", r,
                            (long long)b.write_slots[r], (long long)kv.pool_tokens);
        if (b.key_ends && b.key_ends[r] <= pos)
            return lp::fail(LP_ERR_POSITION, "key_ends[%d] = %lld does not reach past its position %lld", r,
                            (long long)b.key_ends[r], (long long)pos);
        run_max = std::max(run_max, key_end(b, r) - 1);
        if (r + 1 < T && b.key_offsets[r + 1] == b.key_offsets[r]) continue;
        // The run's rows read key_slots[offset + p] for p <= run_max (fewer with a window).
        int64_t offset = b.key_offsets[r];
        if (offset < 0 || offset > b.n_key_slots - 1 - run_max)
            return lp::fail(LP_ERR_KEY_OFFSET, "key_offsets[%d] = %lld is out of range: position %lld reads key_slots[%lld] "
                            "of [0, %lld)", r, (long long)offset, (long long)run_max, (long long)(offset + run_max),
                            (long long)b.n_key_slots);
        for (int64_t p = 0; p <= run_max; p++) {
            int64_t slot = b.key_slots[offset + p];
            if (slot < 0 || slot >= kv.pool_tokens)
                return lp::fail(LP_ERR_KEY_SLOT, "key_slots[%lld] = %lld (row %d, position %lld) is out of range [0, %lld)",
                                (long long)(offset + p), (long long)slot, r, (long long)p, (long long)kv.pool_tokens);
        }
        run_max = -1;
    }
    for (int i = 0; i < b.n_logits; i++)
        if (b.logit_rows[i] < 0 || b.logit_rows[i] >= T)
            return lp::fail(LP_ERR_LOGIT_ROW, "logit_rows[%d] = %lld is out of range [0, %d)", i, (long long)b.logit_rows[i], T);
    return LP_OK;
}

}  // namespace

extern "C" {

void* lp_model_new(const LpConfig* config, const LpLayer* layers) {
    if (!config || !layers || config->n_layers < 1) {
        lp::fail(LP_ERR_MODEL, "lp_model_new: no config or no layers");
        return nullptr;
    }
    Model* m = nullptr;
    int32_t rc = lp::guarded([&] {
        m = new Model();
        m->cfg = *config;
        m->layers.assign(layers, layers + config->n_layers);
        for (const LpLayer& layer : m->layers) m->layer_cfg.push_back(layer_config(m->cfg, layer));
        return check_model(*m);
    });
    if (rc == LP_OK) return m;
    delete m;
    return nullptr;
}

void lp_model_free(void* model) { delete (Model*)model; }

int32_t lp_forward(void* model, const LpBatch* batch, const LpKV* kv, float* logits) {
    return lp_forward_states(model, batch, kv, nullptr, logits);
}

namespace {

// lp_forward_states and lp_forward_hidden: `out` is the logits or (hidden) the hidden states.
int32_t run_step(void* model, const LpBatch* batch, const LpKV* kv, const LpStates* states, float* out, bool hidden) {
    if (!model || !batch || !kv || (!out && batch->n_logits > 0))
        return lp::fail(LP_ERR_ARGUMENT, "lp_forward: a null model, batch, KV pool or output");
    Model& m = *(Model*)model;
    const LpConfig& c = m.cfg;
    if (c.n_embd > LP_MAX_EMBD || c.head_dim_k > LP_MAX_HEAD_DIM || c.head_dim_k % 8 != 0)
        return lp::fail(LP_ERR_UNSUPPORTED, "width %d (up to %d) or key head size %d (a multiple of 8 up to %d)",
                        c.n_embd, LP_MAX_EMBD, c.head_dim_k, LP_MAX_HEAD_DIM);
    if (int32_t rc = check_batch(m, *batch, *kv)) return rc;
    int32_t rc = lp::guarded([&] {
        if (int32_t rc = lp::begin_step(states, *batch, m.mixers, m.recurrent)) return rc;
        forward(m, *batch, *kv, out, hidden);
        return (int32_t)LP_OK;
    });
    lp::pool_park();  // after a failure too: the workers sleep rather than spin
    return rc;
}

}  // namespace

int32_t lp_forward_states(void* model, const LpBatch* batch, const LpKV* kv, const LpStates* states, float* logits) {
    return run_step(model, batch, kv, states, logits, false);
}

int32_t lp_forward_hidden(void* model, const LpBatch* batch, const LpKV* kv, const LpStates* states, float* hidden) {
    return run_step(model, batch, kv, states, hidden, true);
}

int32_t lp_kv_rows(int32_t type, int32_t store, void* pool, int64_t n_rows, int32_t width, float* values) {
    if (!pool || !values || n_rows < 0 || width <= 0 || !lp::kv_type_known(type) || (lp::kv_quantized(type) && width % lp::KV_QBLOCK))
        return lp::fail(LP_ERR_ARGUMENT, "lp_kv_rows: type %d, %lld rows of width %d", type, (long long)n_rows, width);
    for (int64_t r = 0; r < n_rows; r++) {
        if (store) store_kv(pool, type, r * width, width, values + r * width);
        else load_kv(pool, type, r * width, width, values + r * width);
    }
    return LP_OK;
}

int64_t lp_model_scratch_bytes(void* model) {
    const Model& m = *(const Model*)model;
    size_t floats = m.h.capacity() + m.x.capacity() + m.qkv.capacity() + m.attn.capacity() + m.out.capacity() +
                    m.gate_up.capacity() + m.act.capacity() + m.logits_in.capacity() + m.shared_kv.capacity();
    for (const auto& v : m.thread_scratch) floats += v.capacity();
    const lp::RecurrentStep& r = m.recurrent;
    floats += m.gate.capacity() + r.conv.capacity() + r.beta.capacity() + r.decay.capacity();
    for (const auto& v : r.history) floats += v.capacity();
    for (const auto& v : r.matrix) floats += v.capacity();
    return (int64_t)(floats * sizeof(float) + m.acts.capacity());
}

int32_t lp_profile(int32_t enable, double* out) {
    for (int i = 0; i < P_COUNT; i++) {
        if (out) out[i] = phase_ms[i];
        phase_ms[i] = 0;
    }
    profiling = enable != 0;
    return P_COUNT;
}

int32_t lp_set_threads(int32_t n) {
    return lp::guarded([&] {
        lp::pool_set_threads(n);
        return (int32_t)LP_OK;
    });
}

int32_t lp_get_threads(void) { return lp::pool_threads(); }
}
