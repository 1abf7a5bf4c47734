"""ctypes mirrors of the structs and constants in src/forward.h, src/qmatmul.h and
src/boundary.h (field for field, under the C names), and the check that they match the library.

`check_layout(lib)` compares them with what the library says of itself (`lp_abi_layout`: every
struct's size, every field's offset and size, every constant) when it is loaded; a mismatch
raises LayoutMismatch naming the struct and field, and lamplight runs on PyTorch's kernels rather
than read and write the wrong bytes. `error(lib, rc)` turns a failed call's code into an
exception with the library's message (which array, row and value).
"""

from __future__ import annotations

import ctypes
from ctypes import POINTER, c_char_p, c_float, c_int32, c_int64, c_size_t, c_void_p

LP_ACT_SILU, LP_ACT_GELU_TANH, LP_ACT_SWIGLU_OAI = 0, 1, 2
LP_GATING_SOFTMAX, LP_GATING_SOFTMAX_SELECTED = 0, 1
MAX_EXPERTS, MAX_EXPERTS_USED = 1024, 64
LP_KV_F32, LP_KV_F16, LP_KV_BF16, LP_KV_Q8_0, LP_KV_Q4_0, LP_KV_Q4_1, LP_KV_Q5_0, LP_KV_Q5_1, LP_KV_IQ4_NL = range(9)
LP_KV_SHARED, LP_V_FROM_K, LP_V_NORM = 1, 2, 4  # LpLayer.kv_flags
MAX_PARTS = 4
LP_MIX_DELTANET, LP_MIX_SHORTCONV, LP_MIX_MAMBA2 = 1, 2, 3  # LpRecurrent.kind (src/recurrent.h)
MAX_EMBD, MAX_HEAD_DIM = 8192, 1024
PROFILE_PHASES = ("norm", "qkv", "rope_kv", "attention", "wo", "residual", "gate_up", "activation", "down", "head")

# Return codes (src/boundary.h).
LP_OK = 0
LP_ERR_UNSUPPORTED = 1  # shapes the native forward does not handle (NativeUnsupported)
LP_ERR_POSITION, LP_ERR_WRITE_SLOT, LP_ERR_KEY_OFFSET, LP_ERR_KEY_SLOT = 2, 3, 4, 5
LP_ERR_LOGIT_ROW, LP_ERR_LORA_ADAPTER, LP_ERR_ARGUMENT, LP_ERR_MODEL = 6, 7, 8, 9
LP_ERR_NO_MEMORY, LP_ERR_INTERNAL = 10, 11


class QWeight(ctypes.Structure):
    _fields_ = [("format", c_int32), ("n", c_int32), ("k", c_int32), ("reserved", c_int32), ("data", c_void_p)]


DENSE_F32, DENSE_F16, DENSE_BF16 = 0, 32, 33  # LinearPart.w.format of a dense part (forward.h)
DENSE_TILE_COLS, DENSE_TILE_K = 4, 16  # how fp16/bf16 dense values are laid out (forward.h)


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
        ("shared_n_ff", c_int32), ("reserved", c_int32), ("shared_gate_up", POINTER(Linear)),
        ("shared_down", POINTER(Linear)), ("shared_gate", c_void_p),
    ]


class Layer(ctypes.Structure):
    _fields_ = [
        ("qkv", Linear), ("wo", Linear), ("gate_up", Linear), ("down", Linear),
        ("attn_norm", c_void_p), ("ffn_norm", c_void_p), ("q_norm", c_void_p), ("k_norm", c_void_p),
        ("post_attn_norm", c_void_p), ("post_ffn_norm", c_void_p),
        ("rope", c_int32), ("window", c_int32), ("qk_norm_whole", c_int32), ("reserved", c_int32),
        ("sinks", c_void_p), ("moe", POINTER(Experts)),
        ("kv_layer", c_int32), ("output_gate", c_int32), ("recurrent", c_void_p),
        ("n_kv_heads", c_int32), ("head_dim", c_int32), ("n_ff", c_int32), ("n_rot", c_int32),
        ("kv_flags", c_int32), ("output_scale", c_float), ("per_layer_input", c_void_p),
    ]


class PerLayerEmbedding(ctypes.Structure):
    _fields_ = [("size", c_int32), ("reserved", c_int32), ("model_proj", Linear), ("proj_norm", c_void_p)]


class PerLayerInput(ctypes.Structure):
    _fields_ = [("inp_gate", Linear), ("proj", Linear), ("post_norm", c_void_p)]


class Recurrent(ctypes.Structure):
    _fields_ = [
        ("kind", c_int32), ("state", c_int32), ("n_groups", c_int32), ("n_heads", c_int32),
        ("head_dim", c_int32), ("conv_kernel", c_int32), ("channels", c_int32), ("inner", c_int32),
        ("in_proj", Linear), ("out", Linear),
        ("conv", c_void_p), ("conv_bias", c_void_p), ("dt_bias", c_void_p), ("a", c_void_p), ("d", c_void_p),
        ("norm", c_void_p),
    ]


class States(ctypes.Structure):
    _fields_ = [("n_layers", c_int32), ("n_slots", c_int32), ("n_rows", c_int32), ("reserved", c_int32),
                ("row_slots", c_void_p), ("history", POINTER(c_void_p)), ("matrix", POINTER(c_void_p))]


class Config(ctypes.Structure):
    _fields_ = [
        ("n_layers", c_int32), ("n_embd", c_int32), ("n_heads", c_int32), ("n_kv_heads", c_int32),
        ("head_dim_k", c_int32), ("head_dim_v", c_int32), ("n_ff", c_int32), ("vocab", c_int32),
        ("n_rot", c_int32), ("rope_neox", c_int32), ("activation", c_int32), ("rope_max_pos", c_int32),
        ("rms_eps", c_float), ("attn_scale", c_float), ("embd_scale", c_float), ("final_softcap", c_float),
        ("residual_scale", c_float), ("logit_scale", c_float), ("attn_softcap", c_float),
        ("qtemp_scale", c_float), ("qtemp_length", c_float), ("qtemp_offset", c_float),
        ("rope_cos", c_void_p * 2), ("rope_sin", c_void_p * 2),
        ("output_norm", c_void_p), ("head", Linear), ("per_layer_embedding", c_void_p),
    ]


class Batch(ctypes.Structure):
    _fields_ = [
        ("n_rows", c_int32), ("n_logits", c_int32), ("n_key_slots", c_int64), ("n_lora_scales", c_int32),
        ("reserved", c_int32), ("embeddings", c_void_p), ("positions", c_void_p), ("write_slots", c_void_p),
        ("key_offsets", c_void_p), ("key_slots", c_void_p), ("logit_rows", c_void_p), ("lora_scales", c_void_p),
        ("key_ends", c_void_p), ("given_rows", c_void_p), ("per_layer_rows", c_void_p),
    ]


class KV(ctypes.Structure):
    _fields_ = [("k_type", c_int32), ("v_type", c_int32), ("pool_tokens", c_int64),
                ("k", POINTER(c_void_p)), ("v", POINTER(c_void_p)), ("n_layers", c_int32), ("reserved", c_int32)]


# The C name of each mirror (what lp_abi_layout calls it).
STRUCTS: dict[str, type[ctypes.Structure]] = {
    "lp_qweight": QWeight, "LpLinearPart": LinearPart, "LpLora": Lora, "LpLinear": Linear, "LpExperts": Experts,
    "LpLayer": Layer, "LpConfig": Config, "LpBatch": Batch, "LpKV": KV, "LpRecurrent": Recurrent,
    "LpStates": States, "LpPerLayerEmbedding": PerLayerEmbedding, "LpPerLayerInput": PerLayerInput,
}


def constants() -> dict[str, int]:
    """The constants both sides write, under their C names (the packed formats are pack.py's)."""
    from . import pack

    return {
        "LP_ACT_SILU": LP_ACT_SILU, "LP_ACT_GELU_TANH": LP_ACT_GELU_TANH, "LP_ACT_SWIGLU_OAI": LP_ACT_SWIGLU_OAI,
        "LP_GATING_SOFTMAX": LP_GATING_SOFTMAX, "LP_GATING_SOFTMAX_SELECTED": LP_GATING_SOFTMAX_SELECTED,
        "LP_KV_F32": LP_KV_F32, "LP_KV_F16": LP_KV_F16, "LP_KV_BF16": LP_KV_BF16, "LP_KV_Q8_0": LP_KV_Q8_0,
        "LP_KV_Q4_0": LP_KV_Q4_0, "LP_KV_Q4_1": LP_KV_Q4_1, "LP_KV_Q5_0": LP_KV_Q5_0, "LP_KV_Q5_1": LP_KV_Q5_1,
        "LP_KV_IQ4_NL": LP_KV_IQ4_NL, "LP_MIX_DELTANET": LP_MIX_DELTANET,
        "LP_DENSE_F32": DENSE_F32, "LP_DENSE_F16": DENSE_F16, "LP_DENSE_BF16": DENSE_BF16,
        "LP_DENSE_TILE_COLS": DENSE_TILE_COLS,
        "LP_KV_SHARED": LP_KV_SHARED, "LP_V_FROM_K": LP_V_FROM_K, "LP_V_NORM": LP_V_NORM,
        "LP_MIX_SHORTCONV": LP_MIX_SHORTCONV, "LP_MIX_MAMBA2": LP_MIX_MAMBA2,
        "LP_MAX_PARTS": MAX_PARTS, "LP_MAX_EXPERTS": MAX_EXPERTS, "LP_MAX_EXPERTS_USED": MAX_EXPERTS_USED,
        "LP_MAX_LORA_RANK": MAX_LORA_RANK, "LP_MAX_EMBD": MAX_EMBD, "LP_MAX_HEAD_DIM": MAX_HEAD_DIM,
        "LP_PROFILE_PHASES": len(PROFILE_PHASES),
        "LP_W4": pack.W4, "LP_W8": pack.W8, "LP_W8_32": pack.W8_32, "LP_W6": pack.W6,
        "LP_FLAG_MIN": pack.FLAG_MIN, "LP_FLAG_ZERO8": pack.FLAG_ZERO8, "LP_FLAG_SUPER": pack.FLAG_SUPER,
        "LP_HEADER_BYTES": pack.HEADER_BYTES, "LP_HEADER_FLAGS_OFFSET": pack.FLAGS_OFFSET, "LP_COL_GROUP": pack.GROUP,
        **{name: value for name, value in globals().items() if name == "LP_OK" or name.startswith("LP_ERR_")},
    }


Layout = dict[str, tuple[int, ...]]


class LayoutMismatch(RuntimeError):
    """The library's structs or constants are not the ones declared here."""


def python_layout(structs: dict[str, type[ctypes.Structure]] | None = None,
                  consts: dict[str, int] | None = None) -> Layout:
    """The layout the ctypes declarations give, in lp_abi_layout's terms: struct -> (sizeof,),
    struct.field -> (offset, size), constant -> (value,)."""
    layout: Layout = {}
    for c_name, struct in (STRUCTS if structs is None else structs).items():
        layout[c_name] = (ctypes.sizeof(struct),)
        for name, *_ in struct._fields_:
            field = getattr(struct, name)
            layout[f"{c_name}.{name}"] = (field.offset, field.size)
    layout.update((name, (value,)) for name, value in (constants() if consts is None else consts).items())
    return layout


def library_layout(lib: ctypes.CDLL) -> Layout:
    text = lib.lp_abi_layout()
    if text is None:
        raise LayoutMismatch("the native library could not describe its layout (lp_abi_layout: out of memory)")
    entries = (line.split() for line in text.decode().splitlines() if line.strip())
    return {name: tuple(int(v) for v in values) for name, *values in entries}


def _where(name: str) -> str:
    """'LpBatch field n_rows', 'struct LpBatch' or 'constant LP_KV_F16'."""
    struct, _, field = name.partition(".")
    if field:
        return f"{struct} field {field}"
    return f"constant {name}" if name.startswith("LP_") else f"struct {name}"


def _values(name: str, values: tuple[int, ...]) -> str:
    if "." in name:
        return f"offset {values[0]}, size {values[1]}"
    return f"value {values[0]}" if name.startswith("LP_") else f"size {values[0]}"


def layout_mismatches(library: Layout, python: Layout) -> list[str]:
    """Each entry the two layouts disagree on, as a sentence naming the struct and field."""
    names = [*library, *(n for n in python if n not in library)]
    # Fields and constants first, structs' sizes last: the first problem names the field.
    names.sort(key=lambda name: "." not in name and not name.startswith("LP_"))
    problems = []
    for name in names:
        ours, theirs = python.get(name), library.get(name)
        if ours == theirs:
            continue
        if ours is None:
            problems.append(f"{_where(name)} ({_values(name, theirs)}) is in the library, not declared in abi.py")
        elif theirs is None:
            problems.append(f"{_where(name)} ({_values(name, ours)}) is declared in abi.py, not in the library")
        else:
            problems.append(f"{_where(name)}: {_values(name, theirs)} in the library, {_values(name, ours)} in abi.py")
    return problems


def check_layout(lib: ctypes.CDLL, python: Layout | None = None) -> None:
    """Raise LayoutMismatch (its first line naming the first struct and field that differ) unless
    the library's layout is the declared one."""
    problems = layout_mismatches(library_layout(lib), python_layout() if python is None else python)
    if problems:
        more = f" (and {len(problems) - 1} more below)" if len(problems) > 1 else ""
        raise LayoutMismatch(f"the native library {lib._name} does not match lamplight/native/abi.py: "
                             f"{problems[0]}{more}\n" + "\n".join(problems[1:]))


def last_error(lib: ctypes.CDLL) -> tuple[int, str]:
    """The code and message of this thread's last failed call into the library."""
    message = c_char_p()
    code = lib.lp_last_error(ctypes.byref(message))
    return code, (message.value or b"").decode(errors="replace")


def error(lib: ctypes.CDLL, rc: int, what: str = "native forward") -> Exception:
    """The exception for a call that returned rc (not LP_OK): ValueError for arrays, indices and
    descriptions out of range, MemoryError, or RuntimeError for another C++ exception."""
    code, message = last_error(lib)
    text = f"{what}: {message if code == rc else f'error {rc}'}"
    if rc == LP_ERR_NO_MEMORY:
        return MemoryError(text)
    if LP_ERR_UNSUPPORTED <= rc <= LP_ERR_MODEL:
        return ValueError(text)
    return RuntimeError(text)


class NativeUnsupported(ValueError):
    """This model (or one of its tensors) has no native path; PyTorch's kernels serve it."""


def _refusal_check(lib: ctypes.CDLL):
    """errcheck of lp_model_new: null means the library refused the model (a description it
    cannot run: NativeUnsupported, so the loader falls back to PyTorch's kernels) or ran out of
    memory."""
    def check(result, func, args):
        if not result:
            exc = error(lib, last_error(lib)[0], "the native library refused the model")
            raise NativeUnsupported(str(exc)) if type(exc) is ValueError else exc
        return result
    return check


def declare_matmul(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Argument and result types of the matmul's functions (src/qmatmul.h), which every build has."""
    lib.lp_qacts_row_bytes.argtypes = [c_int32]
    lib.lp_qacts_row_bytes.restype = c_size_t
    lib.lp_quantize_rows.argtypes = [c_void_p, c_int64, c_int32, c_int32, c_void_p]
    lib.lp_quantize_rows.restype = None
    lib.lp_qmatmul.argtypes = [POINTER(QWeight), c_void_p, c_int32, c_void_p, c_int64, c_int32, c_int32]
    lib.lp_qmatmul.restype = c_int32  # LP_OK or LP_ERR_ARGUMENT (void before lp_abi_layout existed)
    lib.lp_qweight_col_align.argtypes = [c_int32]
    lib.lp_qweight_col_align.restype = c_int32
    lib.lp_isa.argtypes = []
    lib.lp_isa.restype = c_char_p
    return lib


def declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Set argument and result types of the library's functions."""
    declare_matmul(lib)
    lib.lp_model_new.argtypes = [POINTER(Config), POINTER(Layer)]
    lib.lp_model_new.restype = c_void_p
    lib.lp_model_new.errcheck = _refusal_check(lib)
    lib.lp_model_free.argtypes = [c_void_p]
    lib.lp_model_free.restype = None
    lib.lp_forward.argtypes = [c_void_p, POINTER(Batch), POINTER(KV), c_void_p]
    lib.lp_forward.restype = c_int32
    lib.lp_forward_states.argtypes = [c_void_p, POINTER(Batch), POINTER(KV), POINTER(States), c_void_p]
    lib.lp_forward_states.restype = c_int32
    lib.lp_forward_hidden.argtypes = [c_void_p, POINTER(Batch), POINTER(KV), POINTER(States), c_void_p]
    lib.lp_forward_hidden.restype = c_int32
    lib.lp_linear.argtypes = [POINTER(Linear), c_void_p, c_int32, c_void_p]
    lib.lp_linear.restype = c_int32
    lib.lp_fp16_lookup.argtypes = [c_void_p, c_void_p, c_int64, ctypes.c_float, c_void_p]
    lib.lp_fp16_lookup.restype = c_int32
    lib.lp_attend_full.argtypes = [c_void_p, c_void_p, c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                   c_int32, c_int32, c_int32, c_int32, ctypes.c_float, c_void_p, ctypes.c_int64]
    lib.lp_attend_full.restype = c_int32
    lib.lp_add_layer_norm.argtypes = [c_void_p, c_void_p, c_void_p, c_void_p, ctypes.c_float, ctypes.c_int64, c_int32,
                                      c_void_p]
    lib.lp_add_layer_norm.restype = c_int32
    lib.lp_model_scratch_bytes.argtypes = [c_void_p]
    lib.lp_model_scratch_bytes.restype = c_int64
    lib.lp_profile.argtypes = [c_int32, POINTER(ctypes.c_double)]
    lib.lp_profile.restype = c_int32
    lib.lp_kv_rows.argtypes = [c_int32, c_int32, ctypes.c_void_p, ctypes.c_int64, c_int32, ctypes.c_void_p]
    lib.lp_kv_rows.restype = c_int32
    lib.lp_dequantize_rows.argtypes = [c_int32, c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, c_void_p,
                                       ctypes.c_int64, c_void_p]
    lib.lp_dequantize_rows.restype = c_int32
    lib.lp_read_bandwidth.argtypes = [ctypes.c_int64, c_int32]
    lib.lp_read_bandwidth.restype = ctypes.c_double  # GB/s, or -1 (lp_last_error says why)
    lib.lp_set_one_row_prefetch.argtypes = [c_int32]
    lib.lp_set_one_row_prefetch.restype = c_int32  # the previous distance (bytes)
    lib.lp_set_one_row_streams.argtypes = [c_int32]
    lib.lp_set_one_row_streams.restype = c_int32  # the previous number of groups side by side
    lib.lp_set_threads.argtypes = [c_int32]
    lib.lp_set_threads.restype = c_int32  # LP_OK, or fewer threads started (lp_get_threads says how many)
    lib.lp_get_threads.argtypes = []
    lib.lp_get_threads.restype = c_int32
    lib.lp_last_error.argtypes = [POINTER(c_char_p)]
    lib.lp_last_error.restype = c_int32
    lib.lp_abi_layout.argtypes = []
    lib.lp_abi_layout.restype = c_char_p
    lib.lp_selftest_throw.argtypes = [c_int32, c_int32]
    lib.lp_selftest_throw.restype = c_int32
    return lib
