// Linear layers over packed and dense weights (forward.h's LpLinear), for the forward and for
// lp_linear (forward.h: the encoders' matmuls, outside any model).
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>

#include "forward.h"
#include "pool.h"

namespace lp {

template <class T>
T* grow(std::vector<T>& v, size_t n) {
    if (v.size() < n) v.resize(n);
    return v.data();
}

// Per-row work in tasks of a few rows.
template <class F>
void for_rows(int n_rows, F fn) {
    const int64_t per_task = 4;
    parallel_for((n_rows + per_task - 1) / per_task, [&](int64_t task, int thread) {
        int end = std::min<int>((int)(task * per_task + per_task), n_rows);
        for (int r = (int)(task * per_task); r < end; r++) fn(r, thread);
    });
}

// Room for n_rows quantized rows of width k.
uint8_t* acts_for(std::vector<uint8_t>& acts, int n_rows, int k);
// The parts of an activation row (qmatmul.h's lp::ACTS_*) the linear's packed weights read; 0
// when every part is dense.
int acts_parts(const LpLinear& lin);
// Quantize row r of x [.., k] into its place in acts (sized by acts_for): the parts `parts`
// asks for (acts_parts of the linear that reads them).
void quantize_row(const float* x, int k, int r, uint8_t* acts, int parts);

// y [n_rows, lin.n_out] = x [n_rows, k] W^T (+ bias), columns split into tasks over the pool.
// `quantized`: acts already holds x's quantized rows (the phase before wrote them row by row).
// `lora_scales`: the step's scale of each adapter (null: no LoRA deltas).
void linear(const LpLinear& lin, const float* x, int n_rows, float* y, std::vector<uint8_t>& acts,
            bool quantized = false, const float* lora_scales = nullptr);

// A gated feed-forward's activation over n columns: a[i] = act(gate[i]) * up[i].
using GatedActivation = std::function<void(const float* gate, const float* up, int n, float* a)>;

// Whether gated_linear takes a step of n_rows through gate_up (gate columns [0, n_ff), up
// [n_ff, 2 n_ff)) feeding `down`: prompt-sized steps, packed weights without bias or LoRA, whole
// super-blocks of columns, and a down that reads only quantized activations.
bool gated_fuses(const LpLinear& gate_up, const LpLinear& down, int n_ff, int n_rows);
// down's quantized input (the `parts` acts_parts(down) names) straight from gate_up's quantized
// input acts_in: act = activate(gate, up), block by block of rows and columns, so neither the
// gate_up output [n_rows, 2 n_ff] (32 MiB for a 512-token prompt of a 1B model) nor the
// activation's float rows go through memory. The same bits as linear, the activation row by
// row, then quantize_row: every step is per element or per super-block. `scratch`: one buffer a
// thread. 512-token prompts of the random Q4_K_M files on Zen 5, builds alternated in one
// process in both orders: 1B 0.4-1.1% faster, 3B 0.5% (the fused gate_up runs slower by about
// what the activation pass cost); a server's resident memory after such prompts 50 MiB lower
// (the gate_up and activation buffers are never grown).
void gated_linear(const LpLinear& gate_up, int n_ff, int n_rows, const uint8_t* acts_in, int parts,
                  uint8_t* acts_out, std::vector<std::vector<float>>& scratch, const GatedActivation& activate);

// A linear reading `k` inputs and writing `n_out` outputs: its parts and LoRA adapters add up
// and stay within the forward's limits. Raises n_adapters to its adapters' largest index + 1.
int32_t check_linear(const LpLinear& lin, const char* name, int64_t k, int64_t n_out, int32_t& n_adapters);

}  // namespace lp
