// lp_abi_layout: the layout of every struct and constant lamplight/native/abi.py mirrors, for its
// start-up check (a ctypes declaration out of step with these headers would read and write the
// wrong bytes with no error at all). One line per entry, compared by name on the Python side:
//   "LpBatch 80"            sizeof
//   "LpBatch.n_rows 0 4"    offsetof and sizeof of a field (Python names its fields alike)
//   "LP_KV_F16 1"           a constant
// A struct or field added on one side and not the other is reported too, so a field added to a
// header needs its line here (the struct's size alone would catch it, without naming it).
#include <cstddef>
#include <string>

#include "forward.h"
#include "recurrent.h"

namespace {

struct Layout {
    std::string text;
    void add(const char* name, long long value) { text += std::string(name) + " " + std::to_string(value) + "\n"; }
    void add(const char* name, size_t offset, size_t size) {
        text += std::string(name) + " " + std::to_string(offset) + " " + std::to_string(size) + "\n";
    }
};

#define LP_STRUCT(T) out.add(#T, (long long)sizeof(T))
#define LP_FIELD(T, f) out.add(#T "." #f, offsetof(T, f), sizeof(((T*)nullptr)->f))
#define LP_CONST(c) out.add(#c, (long long)(c))

std::string describe() {
    Layout out;
    LP_STRUCT(lp_qweight);
    LP_FIELD(lp_qweight, format), LP_FIELD(lp_qweight, n), LP_FIELD(lp_qweight, k), LP_FIELD(lp_qweight, reserved);
    LP_FIELD(lp_qweight, data);

    LP_STRUCT(LpLinearPart);
    LP_FIELD(LpLinearPart, w), LP_FIELD(LpLinearPart, dense);

    LP_STRUCT(LpLora);
    LP_FIELD(LpLora, adapter), LP_FIELD(LpLora, rank), LP_FIELD(LpLora, out_offset), LP_FIELD(LpLora, n_out);
    LP_FIELD(LpLora, factor), LP_FIELD(LpLora, reserved), LP_FIELD(LpLora, a), LP_FIELD(LpLora, b);

    LP_STRUCT(LpLinear);
    LP_FIELD(LpLinear, n_parts), LP_FIELD(LpLinear, n_out), LP_FIELD(LpLinear, parts), LP_FIELD(LpLinear, bias);
    LP_FIELD(LpLinear, n_loras), LP_FIELD(LpLinear, reserved), LP_FIELD(LpLinear, loras);

    LP_STRUCT(LpExperts);
    LP_FIELD(LpExperts, n_expert), LP_FIELD(LpExperts, n_used), LP_FIELD(LpExperts, n_ff);
    LP_FIELD(LpExperts, gating), LP_FIELD(LpExperts, normalize), LP_FIELD(LpExperts, activation);
    LP_FIELD(LpExperts, router), LP_FIELD(LpExperts, router_bias), LP_FIELD(LpExperts, gate_up);
    LP_FIELD(LpExperts, down), LP_FIELD(LpExperts, shared_n_ff), LP_FIELD(LpExperts, reserved);
    LP_FIELD(LpExperts, shared_gate_up), LP_FIELD(LpExperts, shared_down), LP_FIELD(LpExperts, shared_gate);

    LP_STRUCT(LpLayer);
    LP_FIELD(LpLayer, qkv), LP_FIELD(LpLayer, wo), LP_FIELD(LpLayer, gate_up), LP_FIELD(LpLayer, down);
    LP_FIELD(LpLayer, attn_norm), LP_FIELD(LpLayer, ffn_norm), LP_FIELD(LpLayer, q_norm), LP_FIELD(LpLayer, k_norm);
    LP_FIELD(LpLayer, post_attn_norm), LP_FIELD(LpLayer, post_ffn_norm);
    LP_FIELD(LpLayer, rope), LP_FIELD(LpLayer, window), LP_FIELD(LpLayer, qk_norm_whole), LP_FIELD(LpLayer, reserved);
    LP_FIELD(LpLayer, sinks), LP_FIELD(LpLayer, moe), LP_FIELD(LpLayer, kv_layer), LP_FIELD(LpLayer, output_gate);
    LP_FIELD(LpLayer, recurrent), LP_FIELD(LpLayer, n_kv_heads), LP_FIELD(LpLayer, head_dim), LP_FIELD(LpLayer, n_ff);
    LP_FIELD(LpLayer, n_rot), LP_FIELD(LpLayer, kv_flags), LP_FIELD(LpLayer, output_scale);
    LP_FIELD(LpLayer, per_layer_input);

    LP_STRUCT(LpPerLayerEmbedding);
    LP_FIELD(LpPerLayerEmbedding, size), LP_FIELD(LpPerLayerEmbedding, reserved);
    LP_FIELD(LpPerLayerEmbedding, model_proj), LP_FIELD(LpPerLayerEmbedding, proj_norm);

    LP_STRUCT(LpPerLayerInput);
    LP_FIELD(LpPerLayerInput, inp_gate), LP_FIELD(LpPerLayerInput, proj), LP_FIELD(LpPerLayerInput, post_norm);

    LP_STRUCT(LpRecurrent);
    LP_FIELD(LpRecurrent, kind), LP_FIELD(LpRecurrent, state), LP_FIELD(LpRecurrent, n_groups);
    LP_FIELD(LpRecurrent, n_heads), LP_FIELD(LpRecurrent, head_dim), LP_FIELD(LpRecurrent, conv_kernel);
    LP_FIELD(LpRecurrent, channels), LP_FIELD(LpRecurrent, inner), LP_FIELD(LpRecurrent, in_proj);
    LP_FIELD(LpRecurrent, out), LP_FIELD(LpRecurrent, conv), LP_FIELD(LpRecurrent, conv_bias);
    LP_FIELD(LpRecurrent, dt_bias), LP_FIELD(LpRecurrent, a), LP_FIELD(LpRecurrent, d), LP_FIELD(LpRecurrent, norm);

    LP_STRUCT(LpStates);
    LP_FIELD(LpStates, n_layers), LP_FIELD(LpStates, n_slots), LP_FIELD(LpStates, n_rows), LP_FIELD(LpStates, reserved);
    LP_FIELD(LpStates, row_slots), LP_FIELD(LpStates, history), LP_FIELD(LpStates, matrix);

    LP_STRUCT(LpConfig);
    LP_FIELD(LpConfig, n_layers), LP_FIELD(LpConfig, n_embd), LP_FIELD(LpConfig, n_heads);
    LP_FIELD(LpConfig, n_kv_heads), LP_FIELD(LpConfig, head_dim_k), LP_FIELD(LpConfig, head_dim_v);
    LP_FIELD(LpConfig, n_ff), LP_FIELD(LpConfig, vocab), LP_FIELD(LpConfig, n_rot), LP_FIELD(LpConfig, rope_neox);
    LP_FIELD(LpConfig, activation), LP_FIELD(LpConfig, rope_max_pos), LP_FIELD(LpConfig, rms_eps);
    LP_FIELD(LpConfig, attn_scale), LP_FIELD(LpConfig, embd_scale), LP_FIELD(LpConfig, final_softcap);
    LP_FIELD(LpConfig, residual_scale), LP_FIELD(LpConfig, logit_scale), LP_FIELD(LpConfig, attn_softcap);
    LP_FIELD(LpConfig, qtemp_scale), LP_FIELD(LpConfig, qtemp_length), LP_FIELD(LpConfig, qtemp_offset);
    LP_FIELD(LpConfig, rope_cos), LP_FIELD(LpConfig, rope_sin), LP_FIELD(LpConfig, output_norm);
    LP_FIELD(LpConfig, head), LP_FIELD(LpConfig, per_layer_embedding);

    LP_STRUCT(LpBatch);
    LP_FIELD(LpBatch, n_rows), LP_FIELD(LpBatch, n_logits), LP_FIELD(LpBatch, n_key_slots);
    LP_FIELD(LpBatch, n_lora_scales), LP_FIELD(LpBatch, reserved), LP_FIELD(LpBatch, embeddings);
    LP_FIELD(LpBatch, positions), LP_FIELD(LpBatch, write_slots), LP_FIELD(LpBatch, key_offsets);
    LP_FIELD(LpBatch, key_slots), LP_FIELD(LpBatch, logit_rows), LP_FIELD(LpBatch, lora_scales);
    LP_FIELD(LpBatch, key_ends), LP_FIELD(LpBatch, given_rows), LP_FIELD(LpBatch, per_layer_rows);

    LP_STRUCT(LpKV);
    LP_FIELD(LpKV, k_type), LP_FIELD(LpKV, v_type), LP_FIELD(LpKV, pool_tokens), LP_FIELD(LpKV, k), LP_FIELD(LpKV, v);
    LP_FIELD(LpKV, n_layers), LP_FIELD(LpKV, reserved);

    LP_CONST(LP_ACT_SILU), LP_CONST(LP_ACT_GELU_TANH), LP_CONST(LP_ACT_SWIGLU_OAI);
    LP_CONST(LP_GATING_SOFTMAX), LP_CONST(LP_GATING_SOFTMAX_SELECTED);
    LP_CONST(LP_KV_F32), LP_CONST(LP_KV_F16), LP_CONST(LP_KV_BF16), LP_CONST(LP_KV_Q8_0), LP_CONST(LP_KV_Q4_0),
        LP_CONST(LP_KV_Q4_1), LP_CONST(LP_KV_Q5_0), LP_CONST(LP_KV_Q5_1), LP_CONST(LP_KV_IQ4_NL),
        LP_CONST(LP_DENSE_F32), LP_CONST(LP_DENSE_F16), LP_CONST(LP_DENSE_BF16), LP_CONST(LP_DENSE_TILE_COLS);
    LP_CONST(LP_KV_SHARED), LP_CONST(LP_V_FROM_K), LP_CONST(LP_V_NORM);
    LP_CONST(LP_MIX_DELTANET), LP_CONST(LP_MIX_SHORTCONV), LP_CONST(LP_MIX_MAMBA2);
    LP_CONST(LP_MAX_PARTS), LP_CONST(LP_MAX_EXPERTS), LP_CONST(LP_MAX_EXPERTS_USED), LP_CONST(LP_MAX_LORA_RANK);
    LP_CONST(LP_MAX_EMBD), LP_CONST(LP_MAX_HEAD_DIM), LP_CONST(LP_PROFILE_PHASES);
    LP_CONST(LP_W4), LP_CONST(LP_W8), LP_CONST(LP_W8_32), LP_CONST(LP_W6), LP_CONST(LP_FLAG_MIN), LP_CONST(LP_FLAG_ZERO8),
        LP_CONST(LP_FLAG_SUPER);
    LP_CONST(LP_HEADER_BYTES), LP_CONST(LP_HEADER_FLAGS_OFFSET), LP_CONST(LP_COL_GROUP);
    LP_CONST(LP_OK), LP_CONST(LP_ERR_UNSUPPORTED), LP_CONST(LP_ERR_POSITION), LP_CONST(LP_ERR_WRITE_SLOT);
    LP_CONST(LP_ERR_KEY_OFFSET), LP_CONST(LP_ERR_KEY_SLOT), LP_CONST(LP_ERR_LOGIT_ROW), LP_CONST(LP_ERR_LORA_ADAPTER);
    LP_CONST(LP_ERR_ARGUMENT), LP_CONST(LP_ERR_MODEL), LP_CONST(LP_ERR_NO_MEMORY), LP_CONST(LP_ERR_INTERNAL);
    return out.text;
}

}  // namespace

extern "C" const char* lp_abi_layout(void) {
    try {
        static const std::string text = describe();
        return text.c_str();
    } catch (...) {  // out of memory: the next call tries again
        return nullptr;
    }
}
