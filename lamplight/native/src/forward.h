// The native forward pass: a whole decoder-only transformer step in one call (hybrids too: a
// layer's token mixer is attention or a recurrent mixer of src/recurrent.h).
//
// Every row (token) of a step is computed independently of the others and in the same order,
// whatever the batch: decode tokens and prompt tokens go through the same code, so a request's
// results never depend on what shares its step, on chunk boundaries, or on whether its prefix
// was cached (the project's reproducibility rule).
#pragma once
#include <stdint.h>

#include "boundary.h"
#include "qmatmul.h"

extern "C" {

// Limits of the forward (its fixed-size arrays), mirrored by lamplight/native/abi.py.
enum {
    LP_MAX_PARTS = 4,           // weights in one fused linear (Gated DeltaNet's in_proj has four)
    LP_MAX_EXPERTS = 1024,      // experts of a mixture-of-experts layer
    LP_MAX_EXPERTS_USED = 64,   // experts one row uses
    LP_MAX_LORA_RANK = 256,
    LP_MAX_EMBD = 8192,         // n_embd
    LP_MAX_HEAD_DIM = 1024,     // head_dim_k
    LP_PROFILE_PHASES = 10      // phases lp_profile times
};

// One weight of a linear layer: packed (`dense` null, w.format one of qmatmul.h's) or dense at
// `dense`, its values as w.format says: float32 [w.n, w.k], or the fp16 or bf16 values a GGUF file
// stores (half the bytes to read; each converts exactly, so a row's bits are the float32 ones) in
// tiles: for each group of LP_DENSE_TILE_COLS columns (the last padded with zero columns), for
// each 16 k (w.k a multiple of 16), the group's columns' 16 values in column order.
enum { LP_DENSE_F32 = 0, LP_DENSE_F16 = 32, LP_DENSE_BF16 = 33, LP_DENSE_TILE_COLS = 4 };
typedef struct LpLinearPart {
    lp_qweight w;
    const void* dense;
} LpLinearPart;

// A LoRA adapter on some output columns of a linear: y[out_offset + c] += s * B (A x), with
// s = the step's scale of `adapter` times `factor` (alpha / rank).
typedef struct LpLora {
    int32_t adapter;
    int32_t rank;
    int32_t out_offset;
    int32_t n_out;
    float factor;
    int32_t reserved;
    const float* a;  // [rank, k]
    const float* b;  // [n_out, rank]
} LpLora;

// Up to LP_MAX_PARTS weights reading the same input, their outputs side by side (fused Q/K/V, gate/up).
typedef struct LpLinear {
    int32_t n_parts;
    int32_t n_out;  // sum of the parts' n
    LpLinearPart parts[LP_MAX_PARTS];
    const float* bias;  // [n_out] or null
    int32_t n_loras;
    int32_t reserved;
    const LpLora* loras;
} LpLinear;

// A mixture-of-experts feed-forward layer (llama.cpp's build_moe_ffn).
typedef struct LpExperts {
    int32_t n_expert, n_used, n_ff;  // n_ff: one expert's gate (and up) width
    int32_t gating;                  // LP_GATING_*
    int32_t normalize;               // softmax gating: renormalise the selected weights to sum 1
    int32_t activation;              // LP_ACT_SILU or LP_ACT_SWIGLU_OAI
    const float* router;             // [n_expert, n_embd] float32
    const float* router_bias;        // [n_expert] or null
    const LpLinear* gate_up;         // [n_expert], outputs gate (n_ff) | up (n_ff)
    const LpLinear* down;            // [n_expert]
    int32_t shared_n_ff;             // a shared expert every row runs (qwen35moe): its width, 0 = none
    int32_t reserved;
    const LpLinear* shared_gate_up;  // outputs gate | up (shared_n_ff each), same activation
    const LpLinear* shared_down;
    const float* shared_gate;        // [n_embd]: its output times sigmoid(shared_gate . x), or null
} LpExperts;

// A recurrent token mixer (src/recurrent.h) in place of attention.
typedef struct LpRecurrent LpRecurrent;
typedef struct LpStates LpStates;

// Gemma 4's per-layer inputs: before layer 0, per row, ple = (rms(model_proj x / sqrt(E)) per
// layer over `size`, proj_norm) + rows * sqrt(size)) / sqrt(2), x the scaled embedding and rows
// the batch's per_layer_rows; layer il's branch, after its FFN:
// x += rms(proj (act(inp_gate x) * ple_il), post_norm).
typedef struct LpPerLayerEmbedding {
    int32_t size;          // P
    int32_t reserved;
    LpLinear model_proj;   // n_embd -> n_layers * P
    const float* proj_norm;  // [P]
} LpPerLayerEmbedding;

typedef struct LpPerLayerInput {
    LpLinear inp_gate;     // n_embd -> P
    LpLinear proj;         // P -> n_embd
    const float* post_norm;  // [n_embd]
} LpPerLayerInput;

typedef struct LpLayer {
    LpLinear qkv;      // outputs: Q (n_heads * head_dim_k; with output_gate [q_h | gate_h] per head) | K | V
    LpLinear wo;
    LpLinear gate_up;  // outputs: gate (n_ff) | up (n_ff)
    LpLinear down;
    const float* attn_norm;       // or null: the branch reads the residual stream as it is (olmo2)
    const float* ffn_norm;        // or null
    const float* q_norm;          // RMS norm weights per head [head_dim_k] (or over all heads), or null
    const float* k_norm;
    const float* post_attn_norm;  // or null
    const float* post_ffn_norm;   // or null
    int32_t rope;                 // which rope table (0 or 1), -1: no rotation (NoPE layers)
    int32_t window;               // sliding window in tokens, 0 = none
    int32_t qk_norm_whole;        // 1: q_norm/k_norm normalise the whole projection (olmo2)
    int32_t reserved;
    const float* sinks;           // [n_heads] attention-sink logits (gpt-oss), or null
    const LpExperts* moe;         // a mixture of experts instead of gate_up/down, or null
    int32_t kv_layer;             // the KV pool layer its K/V live in (attention layers)
    int32_t output_gate;          // 1: attention output times sigmoid(gate) per head and dim (qwen35)
    const LpRecurrent* recurrent; // the token mixer instead of attention (qkv, wo unused), or null
    // This layer's shape where it is not the config's (gemma4; 0 = the config's): KV heads, the
    // key = value head size, the FFN width, the rotated dims of its rope table.
    int32_t n_kv_heads, head_dim, n_ff, n_rot;
    int32_t kv_flags;             // LP_KV_SHARED | LP_V_FROM_K | LP_V_NORM
    float output_scale;           // the whole residual stream times this after the layer (gemma4), 0 = none
    const LpPerLayerInput* per_layer_input;  // gemma4's per-layer input branch, or null
} LpLayer;

// kv_flags: SHARED: attends over kv_layer's K/V, written by an earlier layer (its qkv is Q only);
// V_FROM_K: V is the raw K projection (qkv is Q | K); V_NORM: V RMS-normalised without weight.
enum { LP_KV_SHARED = 1, LP_V_FROM_K = 2, LP_V_NORM = 4 };

enum { LP_ACT_SILU = 0, LP_ACT_GELU_TANH = 1, LP_ACT_SWIGLU_OAI = 2 };
// softmax: top-k of the softmax over all experts; selected: top-k of the logits, softmax over them.
enum { LP_GATING_SOFTMAX = 0, LP_GATING_SOFTMAX_SELECTED = 1 };
// quantized: blocks of 32 (lamplight/state/kv_quant.py)
enum { LP_KV_F32 = 0, LP_KV_F16 = 1, LP_KV_BF16 = 2, LP_KV_Q8_0 = 3, LP_KV_Q4_0 = 4, LP_KV_Q4_1 = 5, LP_KV_Q5_0 = 6,
       LP_KV_Q5_1 = 7, LP_KV_IQ4_NL = 8 };

typedef struct LpConfig {
    int32_t n_layers, n_embd, n_heads, n_kv_heads, head_dim_k, head_dim_v, n_ff, vocab;
    int32_t n_rot, rope_neox, activation, rope_max_pos;
    float rms_eps, attn_scale, embd_scale, final_softcap;
    float residual_scale;  // branch outputs times this before the residual add (granite: else 1)
    float logit_scale;     // logits divided by this (granite: else 1)
    float attn_softcap;    // scores become cap * tanh(scores / cap) (gemma2), 0 = none
    // Query temperature (mistral3, llama 4): q *= 1 + scale * ln(floor((pos + offset) / length) + 1)
    // after RoPE; length 0 = none.
    float qtemp_scale, qtemp_length, qtemp_offset;
    const float* rope_cos[2];  // [rope_max_pos, n_rot / 2]
    const float* rope_sin[2];
    const float* output_norm;
    LpLinear head;
    const LpPerLayerEmbedding* per_layer_embedding;  // gemma4, or null
} LpConfig;

// Every array the step reads comes with its length (the rows' arrays have n_rows entries), and
// lp_forward checks every index into them before any work: a bad one is an LP_ERR_* code.
typedef struct LpBatch {
    int32_t n_rows;
    int32_t n_logits;
    int64_t n_key_slots;          // entries of key_slots
    int32_t n_lora_scales;        // entries of lora_scales
    int32_t reserved;
    const float* embeddings;      // [n_rows, n_embd], before the model's embedding scale
    const int64_t* positions;     // [n_rows]
    const int64_t* write_slots;   // [n_rows] pool index of each row's K/V
    const int64_t* key_offsets;   // [n_rows] where the row's key slots start in key_slots
    const int64_t* key_slots;     // pool index of key position p of row r: key_slots[key_offsets[r] + p]
    const int64_t* logit_rows;    // [n_logits]
    const float* lora_scales;     // [n_lora_scales] this step's scale per adapter (null: none loaded)
    // Media rows (images), both null without them:
    const int64_t* key_ends;      // [n_rows] row r attends to key positions < key_ends[r] (null: positions[r] + 1);
                                  // a non-causal span's rows see up to its end
    const uint8_t* given_rows;    // [n_rows] 1: the row's embedding is used as given, without embd_scale
    const float* per_layer_rows;  // [n_rows, n_layers * P] per-layer token embeddings (gemma4), or null
} LpBatch;

typedef struct LpKV {
    int32_t k_type, v_type;  // LP_KV_*
    int64_t pool_tokens;     // per layer: [n_kv_heads, pool_tokens, head_dim]
    void* const* k;          // [n_layers]
    void* const* v;
    int32_t n_layers;        // entries of k and v (the model's layer count)
    int32_t reserved;
} LpKV;

// Every entry point below catches its C++ exceptions: a failure is an LP_ERR_* code (or null
// from lp_model_new), with lp_last_error saying what failed.

// The model, or null if its description is one the forward cannot run (lp_last_error says why).
void* lp_model_new(const LpConfig* config, const LpLayer* layers);
void lp_model_free(void* model);
// Logits [n_logits, vocab] for the batch's logit rows; K/V of every row written to the pool.
int32_t lp_forward(void* model, const LpBatch* batch, const LpKV* kv, float* logits);
// The same for a model with recurrent layers: their per-sequence states read from and written to
// `states` (src/recurrent.h), written only once the whole step has succeeded.
int32_t lp_forward_states(void* model, const LpBatch* batch, const LpKV* kv, const LpStates* states, float* logits);
// Instead of logits: the final-normed hidden states [n_logits, n_embd] of the logit rows (after
// output_norm, before the head), what embedding models pool. Everything else as lp_forward_states.
int32_t lp_forward_hidden(void* model, const LpBatch* batch, const LpKV* kv, const LpStates* states, float* hidden);
/* y [n_rows, lin->n_out] = x [n_rows, k] W^T (+ bias) on the pool's threads, outside any model
(the encoders' matmuls): the forward's kernels, so a row's result does not depend on the other
rows. LP_OK, or LP_ERR_* for a linear the forward would refuse (lp_last_error says why). */
int32_t lp_linear(const LpLinear* lin, const float* x, int32_t n_rows, float* y);
/* y[i] = x[i] >= identity_from ? x[i] : table[fp16 bits of x[i], rounded to nearest even] for
i < n, on the pool's threads (src/table.cpp: ggml's fp16 GELU table). table: 65536 floats. */
int32_t lp_fp16_lookup(const float* table, const float* x, int64_t n, float identity_from, float* y);
/* The encoders' attention (src/encoder_attention.cpp): for each of n_seqs sequences of n rows
(consecutive rows of q, k and v, at row strides ld_q, ld_k, ld_v floats) and each of n_heads heads
of head_dim values (a multiple of 16; head h at column h * head_dim), out = softmax(q k^T * scale) v
over all n rows of the sequence (no mask), on the pool's threads. Each (sequence, head) is computed
alone: the same bits in any batch and on every build. */
int32_t lp_attend_full(const float* q, const float* k, const float* v, int64_t ld_q, int64_t ld_k, int64_t ld_v,
                       int32_t n_seqs, int32_t n, int32_t n_heads, int32_t head_dim, float scale, float* out,
                       int64_t ld_out);
/* out[r] = LayerNorm(x[r] + residual[r]) * weight + bias for n_rows rows of n values (residual and
bias may be null; out may be x or residual), on the pool's threads (src/layer_norm.cpp). */
int32_t lp_add_layer_norm(const float* x, const float* residual, const float* weight, const float* bias, float eps,
                          int64_t n_rows, int32_t n, float* out);
// Bytes of scratch the model's steps have grown so far (it grows with the largest step: the
// rows of a step and the longest context attended to).
int64_t lp_model_scratch_bytes(void* model);
// Start (enable != 0) or stop timing the forward's phases; writes the ms accumulated so far per
// phase into out (if not null: norm, qkv, rope_kv, attention, wo, residual, gate_up, activation,
// down, head) and resets them. Returns the number of phases.
int32_t lp_profile(int32_t enable, double* out);
// Rows of a KV pool's storage, as the forward stores (store 1: `values` into `pool`) and reads
// them (store 0: `pool` into `values`); `width` values a row, rows one after another. For tests.
int32_t lp_kv_rows(int32_t type, int32_t store, void* pool, int64_t n_rows, int32_t width, float* values);
int32_t lp_set_threads(int32_t n);  // LP_OK, or fewer threads than asked (lp_get_threads says how many)
int32_t lp_get_threads(void);

// The layout of every struct and constant lamplight/native/abi.py mirrors, one line each:
// "LpBatch 80" (sizeof), "LpBatch.n_rows 0 4" (a field's offsetof and sizeof), "LP_KV_F16 1"
// (a constant). Python compares it with its ctypes declarations when it loads the library.
// Null if it could not be written (out of memory).
const char* lp_abi_layout(void);
}
