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

// One state matrix per head: DeltaNet [d_v, d_k], Mamba2 [P, N]; none for the short conv.
int64_t head_matrix_floats(const LpRecurrent& mixer) {
    if (mixer.kind == LP_MIX_DELTANET) return (int64_t)mixer.head_dim * mixer.head_dim;
    if (mixer.kind == LP_MIX_MAMBA2) return (int64_t)mixer.inner / mixer.n_heads * mixer.head_dim;
    return 0;
}

int64_t matrix_floats(const LpRecurrent& mixer) { return head_matrix_floats(mixer) * (mixer.kind == LP_MIX_SHORTCONV ? 0 : mixer.n_heads); }

// llama.cpp's softplus: x itself above 20.
float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

// x / sqrt(sum(x^2) + eps) * scale, in place (the L2 norm of llama.cpp's build).
void l2_normalise(float* x, int n, float eps, float scale) {
    float factor = 1.0f / std::sqrt(dot(x, x, n) + eps) * scale;
    for (int i = 0; i < n; i++) x[i] *= factor;
}

// Where a mixer's convolution reads its inputs: row r's are src[r * stride ..][0..channels).
struct ConvInput {
    const float* src;
    int64_t stride;
};

// The causal depthwise convolution at one row: out[c] = sum_j w[c, j] * window[j][c], the taps
// added in order j = 0..K-1 (tap K-1 is the row itself). Window entries before the run come
// from the sequence's history (zeros for a fresh sequence).
void convolve_row(const LpRecurrent& mixer, ConvInput in, int first_row, int p, const float* history, float* out) {
    const int K = mixer.conv_kernel, C = mixer.channels;
    const float* taps[64];
    for (int j = 0; j < K; j++) {
        int index = p - (K - 1) + j;  // within the run; negative: the history's row K-1+index
        taps[j] = index >= 0 ? in.src + (int64_t)(first_row + index) * in.stride
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
void next_history(const LpRecurrent& mixer, ConvInput in, const StateRun& run, const float* history, float* out) {
    const int K = mixer.conv_kernel, C = mixer.channels;
    for (int i = 0; i < K - 1; i++) {
        int index = run.n_rows - (K - 1) + i;
        float* dst = out + (int64_t)i * C;
        if (index >= 0)
            std::memcpy(dst, in.src + (int64_t)(run.first_row + index) * in.stride, C * sizeof(float));
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
    const int d = mixer.head_dim, Hk = mixer.n_groups, Hv = mixer.n_heads, C = mixer.channels, j = h % Hk;
    for (int t = 0; t < run.n_rows; t++) {
        int64_t r = run.first_row + t;
        const float* row = step.conv.data() + r * C;
        const float *q = row + (int64_t)j * d, *k = row + (int64_t)(Hk + j) * d, *v = row + (int64_t)2 * Hk * d + (int64_t)h * d;
        float g = step.decay[r * Hv + h], beta = step.beta[r * Hv + h];
        float* o = inner + r * mixer.inner + (int64_t)h * d;
        for (int i = 0; i < d; i++) {
            float* Si = S + (int64_t)i * d;
            for (int l = 0; l < d; l++) Si[l] *= g;
            float delta = (v[i] - dot(Si, k, d)) * beta;
            for (int l = 0; l < d; l++) Si[l] = Si[l] + delta * k[l];
            o[i] = dot(Si, q, d);
        }
    }
}

// One Mamba2 head over a run, token by token: S <- exp(dt A) S + (dt x) B^T; y = S C + D x.
void ssm_scan(const LpRecurrent& mixer, const StateRun& run, int h, const RecurrentStep& step, float* S, float* inner) {
    const int nh = mixer.n_heads, N = mixer.head_dim, P = mixer.inner / nh, C = mixer.channels;
    const int g = h / (nh / mixer.n_groups);
    for (int t = 0; t < run.n_rows; t++) {
        int64_t r = run.first_row + t;
        const float* row = step.conv.data() + r * C;
        const float *x = row + (int64_t)h * P, *B = row + mixer.inner + (int64_t)g * N;
        const float* Cm = row + mixer.inner + (int64_t)mixer.n_groups * N + (int64_t)g * N;
        float dt = step.beta[r * nh + h], decay = step.decay[r * nh + h];
        float* y = inner + r * mixer.inner + (int64_t)h * P;
        for (int p = 0; p < P; p++) {
            float* Sp = S + (int64_t)p * N;
            float x_dt = x[p] * dt;
            for (int n = 0; n < N; n++) Sp[n] = Sp[n] * decay + x_dt * B[n];
            y[p] = dot(Sp, Cm, N) + mixer.d[h] * x[p];
        }
    }
}

// The per-row work before the scan: conv inputs, the convolution and what each kind does to it.
void prepare_rows(const LpRecurrent& mixer, const float* proj, int64_t n_in, ConvInput in, float eps,
                  RecurrentStep& step, int T, float* inner) {
    const LpStates& states = *step.states;
    const int C = mixer.channels, H = mixer.n_heads, d = mixer.head_dim;
    const int64_t hist = history_floats(mixer);
    if (mixer.kind == LP_MIX_SHORTCONV)  // u = B * X is what the conv (and its history) sees: every row's first
        rows_in_tasks(T, [&](int r) {
            const float* row = proj + (int64_t)r * n_in;
            float* u = step.conv_in.data() + (int64_t)r * C;
            for (int i = 0; i < C; i++) u[i] = row[i] * row[2 * C + i];
        });
    rows_in_tasks(T, [&](int r) {
        const StateRun& run = step.runs[step.run_of_row[r]];
        const float* history = run.fresh ? nullptr : states.history[mixer.state] + run.slot * hist;
        const float* row = proj + (int64_t)r * n_in;
        float* c = step.conv.data() + (int64_t)r * C;
        convolve_row(mixer, in, run.first_row, r - run.first_row, history, c);
        if (mixer.kind == LP_MIX_SHORTCONV) {  // y = C * conv(B * X)
            float* o = inner + (int64_t)r * mixer.inner;
            for (int i = 0; i < C; i++) o[i] = row[C + i] * c[i];
            return;
        }
        if (mixer.kind == LP_MIX_DELTANET) {
            for (int i = 0; i < C; i++) c[i] = silu(c[i]);
            for (int j = 0; j < mixer.n_groups; j++) {
                l2_normalise(c + (int64_t)j * d, d, eps, 1.0f / std::sqrt((float)d));
                l2_normalise(c + (int64_t)(mixer.n_groups + j) * d, d, eps, 1.0f);
            }
            const float* ba = row + C + (int64_t)H * d;  // beta | alpha
            for (int h = 0; h < H; h++) {
                step.beta[(int64_t)r * H + h] = 1.0f / (1.0f + std::exp(-ba[h]));
                step.decay[(int64_t)r * H + h] = std::exp(mixer.a[h] * softplus(ba[H + h] + mixer.dt_bias[h]));
            }
            return;
        }
        for (int i = 0; i < C; i++) c[i] = silu(c[i] + mixer.conv_bias[i]);  // Mamba2
        const float* dt = row + mixer.inner + C;
        for (int h = 0; h < H; h++) {
            float step_size = softplus(dt[h] + mixer.dt_bias[h]);
            step.beta[(int64_t)r * H + h] = step_size;
            step.decay[(int64_t)r * H + h] = std::exp(step_size * mixer.a[h]);
        }
    });
}

// After the scan, per row: DeltaNet rms(o_h, norm) * silu(z_h) per head; Mamba2 y * silu(z),
// then RMSNorm per group.
void finish_rows(const LpRecurrent& mixer, const float* proj, int64_t n_in, float eps, int T, float* inner) {
    rows_in_tasks(T, [&](int r) {
        float* o = inner + (int64_t)r * mixer.inner;
        float tmp[LP_MAX_EMBD];
        if (mixer.kind == LP_MIX_DELTANET) {
            const float* z = proj + (int64_t)r * n_in + mixer.channels;
            int d = mixer.head_dim;
            for (int h = 0; h < mixer.n_heads; h++) {
                rms_norm(o + (int64_t)h * d, mixer.norm, eps, d, tmp);
                for (int i = 0; i < d; i++) o[(int64_t)h * d + i] = tmp[i] * silu(z[(int64_t)h * d + i]);
            }
        } else if (mixer.kind == LP_MIX_MAMBA2) {
            const float* z = proj + (int64_t)r * n_in;
            for (int i = 0; i < mixer.inner; i++) o[i] = o[i] * silu(z[i]);
            int width = mixer.inner / mixer.n_groups;
            for (int g = 0; g < mixer.n_groups; g++) {
                rms_norm(o + (int64_t)g * width, mixer.norm + (int64_t)g * width, eps, width, tmp);
                std::memcpy(o + (int64_t)g * width, tmp, width * sizeof(float));
            }
        }
    });
}

}  // namespace

int32_t check_recurrent(const LpRecurrent& mixer, int32_t n_embd, int li) {
    const int64_t G = mixer.n_groups, H = mixer.n_heads, d = mixer.head_dim, C = mixer.channels, D = mixer.inner;
    bool ok = mixer.conv && mixer.conv_kernel >= 1 && mixer.conv_kernel <= 64 && mixer.out.n_out == n_embd &&
              D >= 1 && D <= LP_MAX_EMBD;
    if (mixer.kind == LP_MIX_DELTANET)
        ok = ok && G >= 1 && H >= 1 && H % G == 0 && d >= 1 && d <= LP_MAX_HEAD_DIM && C == 2 * G * d + H * d &&
             D == H * d && mixer.in_proj.n_out == C + H * d + 2 * H && mixer.dt_bias && mixer.a && mixer.norm;
    else if (mixer.kind == LP_MIX_SHORTCONV)
        ok = ok && C == n_embd && D == n_embd && mixer.in_proj.n_out == 3 * C;
    else if (mixer.kind == LP_MIX_MAMBA2)
        ok = ok && G >= 1 && H >= 1 && H % G == 0 && D % H == 0 && D % G == 0 && d >= 1 && C == D + 2 * G * d &&
             mixer.in_proj.n_out == D + C + H && mixer.conv_bias && mixer.dt_bias && mixer.a && mixer.d && mixer.norm;
    else
        return fail(LP_ERR_MODEL, "layer %d: recurrent mixer kind %d is not one the native forward computes", li, mixer.kind);
    if (!ok)
        return fail(LP_ERR_MODEL, "layer %d: recurrent mixer kind %d of %lld groups, %lld heads of %lld, kernel %d, "
                    "%lld channels, inner %lld, in_proj %d outputs, out %d: not a consistent description", li, mixer.kind,
                    (long long)G, (long long)H, (long long)d, mixer.conv_kernel, (long long)C, (long long)D,
                    mixer.in_proj.n_out, mixer.out.n_out);
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
        if (!states->history[l] || (matrix_floats(*mixers[l]) > 0 && !states->matrix[l]))
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
    size_t most_channels = 0, most_heads = 0;
    for (int l = 0; l < n_layers; l++) {
        const LpRecurrent& mixer = *mixers[l];
        step.history[l].resize(n_runs * history_floats(mixer));
        step.matrix[l].resize(n_runs * matrix_floats(mixer));
        most_channels = std::max<size_t>(most_channels, mixer.channels);
        most_heads = std::max<size_t>(most_heads, mixer.n_heads);
    }
    step.conv.resize((size_t)b.n_rows * most_channels), step.conv_in.resize((size_t)b.n_rows * most_channels);
    step.beta.resize((size_t)b.n_rows * most_heads), step.decay.resize((size_t)b.n_rows * most_heads);
    step.run_of_row.resize(b.n_rows);
    for (size_t u = 0; u < n_runs; u++)
        for (int t = 0; t < step.runs[u].n_rows; t++) step.run_of_row[step.runs[u].first_row + t] = (int)u;
    return LP_OK;
}

void recurrent_scan(const LpRecurrent& mixer, const LpBatch& b, float eps, const float* proj, RecurrentStep& step,
                    float* inner) {
    const LpStates& states = *step.states;
    const int T = b.n_rows, l = mixer.state;
    const int64_t n_in = mixer.in_proj.n_out, hist = history_floats(mixer);
    // DeltaNet convolves the first channels of proj, Mamba2 the xBC after z, the short conv B * X.
    ConvInput in = mixer.kind == LP_MIX_SHORTCONV ? ConvInput{step.conv_in.data(), mixer.channels}
                 : ConvInput{proj + (mixer.kind == LP_MIX_MAMBA2 ? mixer.inner : 0), n_in};
    prepare_rows(mixer, proj, n_in, in, eps, step, T, inner);
    const int64_t n_runs = (int64_t)step.runs.size(), per_head = head_matrix_floats(mixer);
    if (per_head > 0) {
        // The recurrence per (run, head), on the run's new matrix (a copy of the slot's).
        const int H = mixer.n_heads;
        parallel_for(n_runs * H, [&](int64_t task, int) {
            const StateRun& run = step.runs[task / H];
            int h = (int)(task % H);
            float* S = step.matrix[l].data() + task * per_head;
            if (run.fresh)
                std::memset(S, 0, (size_t)per_head * sizeof(float));
            else
                std::memcpy(S, states.matrix[l] + (run.slot * H + h) * per_head, (size_t)per_head * sizeof(float));
            if (mixer.kind == LP_MIX_DELTANET)
                delta_rule(mixer, run, h, step, S, inner);
            else
                ssm_scan(mixer, run, h, step, S, inner);
        });
    }
    for (int64_t u = 0; u < n_runs; u++) {
        const StateRun& run = step.runs[u];
        next_history(mixer, in, run, run.fresh ? nullptr : states.history[l] + run.slot * hist,
                     step.history[l].data() + u * hist);
    }
    finish_rows(mixer, proj, n_in, eps, T, inner);
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
            if (mat) std::memcpy(states.matrix[l] + slot * mat, step.matrix[l].data() + u * mat, mat * sizeof(float));
        }
    }
}

}  // namespace lp
