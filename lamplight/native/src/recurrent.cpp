#include "recurrent.h"

#include <cmath>
#include <cstring>

#include "boundary.h"
#include "pool.h"
#include "vec.h"

namespace lp {

namespace {

using std::vector;

// Per-row work in tasks of a few rows (as forward.cpp's for_rows).
template <class F>
void rows_in_tasks(int n_rows, F fn) {
    const int64_t per_task = 4;
    parallel_for((n_rows + per_task - 1) / per_task, [&](int64_t task, int) {
        int end = std::min<int>((int)(task * per_task + per_task), n_rows);
        for (int r = (int)(task * per_task); r < end; r++) fn(r);
    });
}

int64_t history_floats(const LpRecurrent& mixer) { return (int64_t)(mixer.conv_kernel - 1) * mixer.channels; }

int64_t matrix_floats(const LpRecurrent& mixer) {
    return (int64_t)mixer.n_v_heads * mixer.head_dim * mixer.head_dim;
}

// llama.cpp's softplus: x itself above 20.
float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

// x / sqrt(sum(x^2) + eps) * scale, in place (the L2 norm of llama.cpp's build).
void l2_normalise(float* x, int n, float eps, float scale) {
    float factor = 1.0f / std::sqrt(dot(x, x, n) + eps) * scale;
    for (int i = 0; i < n; i++) x[i] *= factor;
}

// The causal depthwise convolution at one row: out[c] = sum_j w[c, j] * window[j][c], the taps
// added in order j = 0..K-1 (tap K-1 is the row itself). Window entries before the run come
// from the sequence's history (zeros for a fresh sequence).
void convolve_row(const LpRecurrent& mixer, const float* proj, int64_t n_in, int first_row, int p,
                  const float* history, float* out) {
    const int K = mixer.conv_kernel, C = mixer.channels;
    const float* taps[64];
    for (int j = 0; j < K; j++) {
        int index = p - (K - 1) + j;  // within the run; negative: the history's row K-1+index
        taps[j] = index >= 0 ? proj + (int64_t)(first_row + index) * n_in
                             : (history ? history + (int64_t)(K - 1 + index) * C : nullptr);
    }
    for (int c = 0; c < C; c++) {
        const float* w = mixer.conv + (int64_t)c * K;
        float acc = w[0] * (taps[0] ? taps[0][c] : 0.0f);
        for (int j = 1; j < K; j++) acc = acc + w[j] * (taps[j] ? taps[j][c] : 0.0f);
        out[c] = acc;
    }
}

// A run's new history: the last K-1 inputs of (old history, the run's rows).
void next_history(const LpRecurrent& mixer, const float* proj, int64_t n_in, const StateRun& run,
                  const float* history, float* out) {
    const int K = mixer.conv_kernel, C = mixer.channels;
    for (int i = 0; i < K - 1; i++) {
        int index = run.n_rows - (K - 1) + i;
        float* dst = out + (int64_t)i * C;
        if (index >= 0)
            std::memcpy(dst, proj + (int64_t)(run.first_row + index) * n_in, C * sizeof(float));
        else if (history)
            std::memcpy(dst, history + (int64_t)(K - 1 + index) * C, C * sizeof(float));
        else
            std::memset(dst, 0, C * sizeof(float));
    }
}

// One v head's delta rule over a run, token by token: S <- exp(g) S; delta = beta (v - S k);
// S <- S + delta k^T; o = S q. Each value row i of S is independent of the others: decayed,
// read against k, updated and read against q in one pass.
void delta_rule(const LpRecurrent& mixer, const StateRun& run, int h, const RecurrentStep& step, float* S,
                float* inner) {
    const int d = mixer.head_dim, Hk = mixer.n_k_heads, Hv = mixer.n_v_heads, C = mixer.channels, j = h % Hk;
    for (int t = 0; t < run.n_rows; t++) {
        int64_t r = run.first_row + t;
        const float* row = step.conv.data() + r * C;
        const float *q = row + (int64_t)j * d, *k = row + (int64_t)(Hk + j) * d, *v = row + (int64_t)2 * Hk * d + (int64_t)h * d;
        float g = step.decay[r * Hv + h], beta = step.beta[r * Hv + h];
        float* o = inner + r * Hv * d + (int64_t)h * d;
        for (int i = 0; i < d; i++) {
            float* Si = S + (int64_t)i * d;
            for (int l = 0; l < d; l++) Si[l] *= g;
            float delta = (v[i] - dot(Si, k, d)) * beta;
            for (int l = 0; l < d; l++) Si[l] = Si[l] + delta * k[l];
            o[i] = dot(Si, q, d);
        }
    }
}

}  // namespace

int32_t check_recurrent(const LpRecurrent& mixer, int32_t n_embd, int li) {
    if (mixer.kind != LP_MIX_DELTANET)
        return fail(LP_ERR_MODEL, "layer %d: recurrent mixer kind %d is not one the native forward computes", li, mixer.kind);
    int64_t Hk = mixer.n_k_heads, Hv = mixer.n_v_heads, d = mixer.head_dim;
    if (Hk < 1 || Hv < 1 || Hv % Hk != 0 || d < 1 || d > LP_MAX_HEAD_DIM || mixer.conv_kernel < 1 || mixer.conv_kernel > 64 ||
        mixer.channels != 2 * Hk * d + Hv * d || !mixer.conv || !mixer.dt_bias || !mixer.a || !mixer.norm ||
        mixer.in_proj.n_out != mixer.channels + Hv * d + 2 * Hv || mixer.out.n_out != n_embd)
        return fail(LP_ERR_MODEL, "layer %d: Gated DeltaNet of %lld q/k heads, %lld v heads of %lld, kernel %d, "
                    "%d channels, in_proj %d outputs, out %d: not a consistent description", li, (long long)Hk,
                    (long long)Hv, (long long)d, mixer.conv_kernel, mixer.channels, mixer.in_proj.n_out, mixer.out.n_out);
    return LP_OK;
}

int32_t begin_step(const LpStates* states, const LpBatch& b, const vector<const LpRecurrent*>& mixers,
                   RecurrentStep& step) {
    step.states = states;
    step.runs.clear();
    if (mixers.empty()) return LP_OK;
    const int n_layers = (int)mixers.size();
    if (!states || states->n_layers != n_layers || states->n_slots < 1 || states->n_rows != b.n_rows ||
        !states->history || !states->matrix || (b.n_rows > 0 && !states->row_slots))
        return fail(LP_ERR_ARGUMENT, "the recurrent state pool (%d layers, %d slots, %d row slots) is not one for "
                    "this model (%d recurrent layers) and batch (%d rows)", states ? states->n_layers : 0,
                    states ? states->n_slots : 0, states ? states->n_rows : 0, n_layers, b.n_rows);
    for (int l = 0; l < n_layers; l++)
        if (!states->history[l] || !states->matrix[l])
            return fail(LP_ERR_ARGUMENT, "recurrent state layer %d: a null history or matrix", l);
    vector<char> seen(states->n_slots, 0);
    for (int r = 0; r < b.n_rows; r++) {
        int64_t slot = states->row_slots[r];
        if (slot < 0 || slot >= states->n_slots)
            return fail(LP_ERR_ARGUMENT, "row_slots[%d] = %lld is out of range [0, %d)", r, (long long)slot,
                        states->n_slots);
        if (r > 0 && slot == step.runs.back().slot) {
            if (b.positions[r] != b.positions[r - 1] + 1)
                return fail(LP_ERR_POSITION, "positions[%d] = %lld does not follow %lld on state slot %lld", r,
                            (long long)b.positions[r], (long long)b.positions[r - 1], (long long)slot);
            step.runs.back().n_rows++;
            continue;
        }
        if (seen[slot])
            return fail(LP_ERR_ARGUMENT, "two runs of rows on recurrent state slot %lld in one step", (long long)slot);
        seen[slot] = 1;
        step.runs.push_back({r, 1, slot, b.positions[r] == 0});
    }
    // Every buffer the step needs, before any work: an allocation failure changes no state.
    size_t n_runs = step.runs.size();
    step.history.resize(n_layers), step.matrix.resize(n_layers);
    step.written.assign(n_layers, 0);
    size_t most_channels = 0, most_inner = 0, most_heads = 0;
    for (int l = 0; l < n_layers; l++) {
        const LpRecurrent& mixer = *mixers[l];
        step.history[l].resize(n_runs * history_floats(mixer));
        step.matrix[l].resize(n_runs * matrix_floats(mixer));
        most_channels = std::max<size_t>(most_channels, mixer.channels);
        most_inner = std::max<size_t>(most_inner, (size_t)mixer.n_v_heads * mixer.head_dim);
        most_heads = std::max<size_t>(most_heads, mixer.n_v_heads);
    }
    step.conv.resize((size_t)b.n_rows * most_channels);
    step.beta.resize((size_t)b.n_rows * most_heads), step.decay.resize((size_t)b.n_rows * most_heads);
    step.run_of_row.resize(b.n_rows);
    for (size_t u = 0; u < n_runs; u++)
        for (int t = 0; t < step.runs[u].n_rows; t++) step.run_of_row[step.runs[u].first_row + t] = (int)u;
    return LP_OK;
}

void deltanet_scan(const LpRecurrent& mixer, const LpBatch& b, float eps, const float* proj, RecurrentStep& step,
                   float* inner) {
    const LpStates& states = *step.states;
    const int T = b.n_rows, C = mixer.channels, Hk = mixer.n_k_heads, Hv = mixer.n_v_heads, d = mixer.head_dim;
    const int64_t n_in = mixer.in_proj.n_out, hist = history_floats(mixer), mat = matrix_floats(mixer);
    const int l = mixer.state;
    auto old_history = [&](const StateRun& run) {
        return run.fresh ? nullptr : states.history[l] + run.slot * hist;
    };
    // Per row: conv + silu, L2-normalised q (times 1/sqrt(d)) and k, beta and the decay.
    rows_in_tasks(T, [&](int r) {
        const StateRun& run = step.runs[step.run_of_row[r]];
        float* c = step.conv.data() + (int64_t)r * C;
        convolve_row(mixer, proj, n_in, run.first_row, r - run.first_row, old_history(run), c);
        for (int i = 0; i < C; i++) c[i] = silu(c[i]);
        for (int j = 0; j < Hk; j++) {
            l2_normalise(c + (int64_t)j * d, d, eps, 1.0f / std::sqrt((float)d));
            l2_normalise(c + (int64_t)(Hk + j) * d, d, eps, 1.0f);
        }
        const float* row = proj + (int64_t)r * n_in + C + (int64_t)Hv * d;  // beta | alpha
        for (int h = 0; h < Hv; h++) {
            step.beta[(int64_t)r * Hv + h] = 1.0f / (1.0f + std::exp(-row[h]));
            step.decay[(int64_t)r * Hv + h] = std::exp(mixer.a[h] * softplus(row[Hv + h] + mixer.dt_bias[h]));
        }
    });
    // The delta rule per (run, v head), on the run's new matrix (a copy of the slot's).
    const int64_t n_runs = (int64_t)step.runs.size();
    parallel_for(n_runs * Hv, [&](int64_t task, int) {
        const StateRun& run = step.runs[task / Hv];
        int h = (int)(task % Hv);
        float* S = step.matrix[l].data() + (task / Hv) * mat + (int64_t)h * d * d;
        if (run.fresh)
            std::memset(S, 0, (size_t)d * d * sizeof(float));
        else
            std::memcpy(S, states.matrix[l] + run.slot * mat + (int64_t)h * d * d, (size_t)d * d * sizeof(float));
        delta_rule(mixer, run, h, step, S, inner);
    });
    for (int64_t u = 0; u < n_runs; u++)
        next_history(mixer, proj, n_in, step.runs[u], old_history(step.runs[u]), step.history[l].data() + u * hist);
    // o_h <- rms(o_h, norm) * silu(z_h), per row and head.
    rows_in_tasks(T, [&](int r) {
        const float* z = proj + (int64_t)r * n_in + C;
        float tmp[LP_MAX_HEAD_DIM];
        for (int h = 0; h < Hv; h++) {
            float* o = inner + ((int64_t)r * Hv + h) * d;
            rms_norm(o, mixer.norm, eps, d, tmp);
            for (int i = 0; i < d; i++) o[i] = tmp[i] * silu(z[(int64_t)h * d + i]);
        }
    });
    step.written[l] = 1;
}

void commit_states(RecurrentStep& step) {
    if (!step.states) return;
    const LpStates& states = *step.states;
    for (size_t l = 0; l < step.written.size(); l++) {
        if (!step.written[l]) continue;
        size_t hist = step.history[l].size() / std::max<size_t>(1, step.runs.size());
        size_t mat = step.matrix[l].size() / std::max<size_t>(1, step.runs.size());
        for (size_t u = 0; u < step.runs.size(); u++) {
            int64_t slot = step.runs[u].slot;
            std::memcpy(states.history[l] + slot * hist, step.history[l].data() + u * hist, hist * sizeof(float));
            std::memcpy(states.matrix[l] + slot * mat, step.matrix[l].data() + u * mat, mat * sizeof(float));
        }
    }
}

}  // namespace lp
