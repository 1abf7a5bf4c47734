"""ctypes mirrors of the structs in src/forward.h and src/qmatmul.h (field for field)."""

from __future__ import annotations

import ctypes
from ctypes import POINTER, c_char_p, c_float, c_int32, c_int64, c_size_t, c_void_p

LP_ACT_SILU, LP_ACT_GELU_TANH, LP_ACT_SWIGLU_OAI = 0, 1, 2
LP_GATING_SOFTMAX, LP_GATING_SOFTMAX_SELECTED = 0, 1
MAX_EXPERTS, MAX_EXPERTS_USED = 1024, 64
LP_KV_F32, LP_KV_F16, LP_KV_BF16 = 0, 1, 2
MAX_PARTS = 3
PROFILE_PHASES = ("norm", "qkv", "rope_kv", "attention", "wo", "residual", "gate_up", "activation", "down", "head")


class QWeight(ctypes.Structure):
    _fields_ = [("format", c_int32), ("n", c_int32), ("k", c_int32), ("reserved", c_int32), ("data", c_void_p)]


class LinearPart(ctypes.Structure):
    _fields_ = [("w", QWeight), ("dense", c_void_p)]


class Lora(ctypes.Structure):
    _fields_ = [("adapter", c_int32), ("rank", c_int32), ("out_offset", c_int32), ("n_out", c_int32),
                ("factor", c_float), ("reserved", c_int32), ("a", c_void_p), ("b", c_void_p)]


MAX_LORA_RANK = 256


class Linear(ctypes.Structure):
    _fields_ = [("n_parts", c_int32), ("n_out", c_int32), ("parts", LinearPart * MAX_PARTS), ("bias", c_void_p),
                ("n_loras", c_int32), ("reserved", c_int32), ("loras", POINTER(Lora))]


class Experts(ctypes.Structure):
    _fields_ = [
        ("n_expert", c_int32), ("n_used", c_int32), ("n_ff", c_int32), ("gating", c_int32),
        ("normalize", c_int32), ("activation", c_int32),
        ("router", c_void_p), ("router_bias", c_void_p), ("gate_up", POINTER(Linear)), ("down", POINTER(Linear)),
    ]


class Layer(ctypes.Structure):
    _fields_ = [
        ("qkv", Linear), ("wo", Linear), ("gate_up", Linear), ("down", Linear),
        ("attn_norm", c_void_p), ("ffn_norm", c_void_p), ("q_norm", c_void_p), ("k_norm", c_void_p),
        ("post_attn_norm", c_void_p), ("post_ffn_norm", c_void_p),
        ("rope", c_int32), ("window", c_int32), ("qk_norm_whole", c_int32), ("reserved", c_int32),
        ("sinks", c_void_p), ("moe", POINTER(Experts)),
    ]


class Config(ctypes.Structure):
    _fields_ = [
        ("n_layers", c_int32), ("n_embd", c_int32), ("n_heads", c_int32), ("n_kv_heads", c_int32),
        ("head_dim_k", c_int32), ("head_dim_v", c_int32), ("n_ff", c_int32), ("vocab", c_int32),
        ("n_rot", c_int32), ("rope_neox", c_int32), ("activation", c_int32), ("rope_max_pos", c_int32),
        ("rms_eps", c_float), ("attn_scale", c_float), ("embd_scale", c_float), ("final_softcap", c_float),
        ("residual_scale", c_float), ("logit_scale", c_float), ("attn_softcap", c_float),
        ("qtemp_scale", c_float), ("qtemp_length", c_float), ("qtemp_offset", c_float),
        ("rope_cos", c_void_p * 2), ("rope_sin", c_void_p * 2),
        ("output_norm", c_void_p), ("head", Linear),
    ]


class Batch(ctypes.Structure):
    _fields_ = [
        ("n_rows", c_int32), ("n_logits", c_int32),
        ("embeddings", c_void_p), ("positions", c_void_p), ("write_slots", c_void_p),
        ("key_offsets", c_void_p), ("key_slots", c_void_p), ("logit_rows", c_void_p), ("lora_scales", c_void_p),
    ]


class KV(ctypes.Structure):
    _fields_ = [("k_type", c_int32), ("v_type", c_int32), ("pool_tokens", c_int64),
                ("k", POINTER(c_void_p)), ("v", POINTER(c_void_p))]


def declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Set argument and result types of the library's functions."""
    lib.lp_model_new.argtypes = [POINTER(Config), POINTER(Layer)]
    lib.lp_model_new.restype = c_void_p
    lib.lp_model_free.argtypes = [c_void_p]
    lib.lp_model_free.restype = None
    lib.lp_forward.argtypes = [c_void_p, POINTER(Batch), POINTER(KV), c_void_p]
    lib.lp_forward.restype = c_int32
    lib.lp_model_scratch_bytes.argtypes = [c_void_p]
    lib.lp_model_scratch_bytes.restype = c_int64
    lib.lp_profile.argtypes = [c_int32, POINTER(ctypes.c_double)]
    lib.lp_profile.restype = c_int32
    lib.lp_set_threads.argtypes = [c_int32]
    lib.lp_set_threads.restype = None
    lib.lp_get_threads.argtypes = []
    lib.lp_get_threads.restype = c_int32
    lib.lp_isa.argtypes = []
    lib.lp_isa.restype = c_char_p
    lib.lp_qacts_row_bytes.argtypes = [c_int32]
    lib.lp_qacts_row_bytes.restype = c_size_t
    return lib
