// The recurrent token mixers of the hybrid architectures on the native path: Gated DeltaNet
// (qwen35, qwen35moe) for now; shared/reference/archs2/README.md has the formulas, and
// lamplight/models/recurrent.py computes the same on PyTorch.
//
// Each recurrent layer keeps a per-sequence state in the caller's pool (the engine's
// RecurrentPool tensors, pointed to by LpStates): the last K-1 inputs of its causal convolution
// and one matrix per head. A step's rows come in runs, one per sequence (consecutive rows of one
// state slot, in position order); a run reads its slot at its start (zeros when it starts at
// position 0), and its new state goes to scratch, copied into the pool only once the whole step
// has succeeded (commit_states), so a failed step leaves every state as it was.
//
// Reproducibility: the recurrence runs token by token with the same operations for a prompt
// run and a decode step, the convolution adds its taps in one fixed order, and every other
// operation is per row: the state after position p is bit-identical whatever the chunking,
// and a sequence's rows compute the same bits whatever shares the step.
#pragma once
#include <stdint.h>

#include <vector>

#include "forward.h"

extern "C" {

enum { LP_MIX_DELTANET = 1, LP_MIX_SHORTCONV = 2, LP_MIX_MAMBA2 = 3 };

// Gated DeltaNet: in_proj = q|k|v (channels) | z (Hv d) | beta (Hv) | alpha (Hv); the conv (then
//   silu) over q|k|v; v head h reads q/k head h % Hk; one [d, d] delta-rule matrix per v head.
// Short conv (lfm2): in_proj = B | C | X (n_embd each); y = C * conv(B * X), no activation.
// Mamba2: in_proj = z (inner) | xBC (channels = inner + 2 G N) | dt (heads); conv + bias, silu;
//   head h reads B/C group h / (heads / G); one [inner / heads, N] state per head, D skip,
//   y * silu(z) then RMSNorm per group.
struct LpRecurrent {
    int32_t kind;         // LP_MIX_*
    int32_t state;        // which of LpStates' layers holds its state
    int32_t n_groups;     // DeltaNet: q/k heads (Hk); Mamba2: B/C groups (G); short conv: unused
    int32_t n_heads;      // DeltaNet: v heads (Hv); Mamba2: SSM heads; short conv: unused
    int32_t head_dim;     // DeltaNet: d (of q, k and v); Mamba2: d_state (N); short conv: unused
    int32_t conv_kernel;  // K
    int32_t channels;     // the convolution's channels
    int32_t inner;        // out's inputs: DeltaNet Hv d, short conv n_embd, Mamba2 inner
    LpLinear in_proj;
    LpLinear out;         // inner -> n_embd
    const float* conv;       // [channels, K], tap K-1 on the current token
    const float* conv_bias;  // [channels] (Mamba2) or null
    const float* dt_bias;    // [heads] (DeltaNet, Mamba2)
    const float* a;          // [heads], stored -exp(A_log)
    const float* d;          // [heads] D skip (Mamba2) or null
    const float* norm;       // DeltaNet [d] shared by the heads; Mamba2 [inner] (G groups)
};

// The recurrent layers' state pool, one entry per recurrent layer (in layer order).
struct LpStates {
    int32_t n_layers;           // entries of history and matrix
    int32_t n_slots;            // sequences the pool holds
    int32_t n_rows;             // entries of row_slots (the batch's rows)
    int32_t reserved;
    const int64_t* row_slots;   // [n_rows] the state slot of each row's sequence
    float* const* history;      // per layer: [n_slots, K-1, channels] float32
    float* const* matrix;       // per layer: [n_slots, heads, rows, cols] float32, null for short conv
};
}

namespace lp {

// Consecutive rows of one sequence in a step.
struct StateRun {
    int first_row, n_rows;
    int64_t slot;
    bool fresh;  // starts at position 0: the state starts from zeros
};

// One step's recurrent work: its runs, and the new states waiting for commit_states.
struct RecurrentStep {
    const LpStates* states = nullptr;
    std::vector<StateRun> runs;
    std::vector<int> run_of_row;                      // [rows] index into runs
    std::vector<std::vector<float>> history, matrix;  // per state layer: [runs, ...]
    std::vector<char> written;                        // per state layer: computed this step
    std::vector<float> conv, conv_in;                 // [rows, channels]: after the conv; its inputs (short conv)
    std::vector<float> beta, decay;                   // [rows, heads]: DeltaNet's beta or Mamba2's dt; the decay
};

// Checks a recurrent layer's description against the model width (LP_OK or an LP_ERR_MODEL code).
int32_t check_recurrent(const LpRecurrent& mixer, int32_t n_embd, int li);
// Checks the pool and the rows' slots, splits the rows into runs and sizes every buffer the step
// needs (LP_OK or an LP_ERR_* code). `mixers`: the model's recurrent layers by state index.
int32_t begin_step(const LpStates* states, const LpBatch& b, const std::vector<const LpRecurrent*>& mixers,
                   RecurrentStep& step);
// inner [rows, mixer.inner] from proj [rows, in_proj outputs]: the convolution, the scan, the
// output gate and norm.
void recurrent_scan(const LpRecurrent& mixer, const LpBatch& b, float eps, const float* proj, RecurrentStep& step,
                    float* inner);
// Copies every layer's new states into the pool: the step succeeded.
void commit_states(RecurrentStep& step);

}  // namespace lp
