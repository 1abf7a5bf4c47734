"""Tiny random-weight GGUF files for fast tests of both architectures.

The vocabularies are real tokenizers in miniature: a byte-level GPT-2 BPE (all 256 byte
symbols plus a few merges and ChatML specials) for `llama`, and a SentencePiece vocabulary
with byte fallback for `gemma3`. Weights are seeded random numbers, quantized in the formats
the real models use, so the whole loader path runs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFWriter
from gguf.quants import quantize

from lamplight.bench.random_model import random_matrix

CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def gpt2_byte_symbols() -> list[str]:
    """GPT-2's reversible byte -> printable unicode character table, in byte order."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    table = {}
    extra = 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def _bpe_vocab() -> tuple[list[str], list[int], list[str], dict[str, int]]:
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokens = list(specials)
    types = [3, 3, 3]
    tokens += gpt2_byte_symbols()
    types += [1] * 256
    merges = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "o n", "Ġ s"]
    for merge in merges:
        tokens.append(merge.replace(" ", ""))
        types.append(1)
    ids = {"bos": 0, "eos": 2, "unk": 0, "pad": 0}
    return tokens, types, merges, ids


def _spm_vocab() -> tuple[list[str], list[float], list[int], dict[str, int]]:
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
    types = [3, 3, 3, 2, 4, 4]
    scores = [0.0] * len(tokens)
    for b in range(256):
        tokens.append(f"<0x{b:02X}>")
        types.append(6)
        scores.append(0.0)
    pieces = ["▁", "▁the", "▁a", "e", "t", "a", "o", "n", "h", "▁t", "he", "in", "er", "s", "i", "r", "l", "d"]
    for i, piece in enumerate(pieces):
        tokens.append(piece)
        types.append(1)
        scores.append(-float(i))
    ids = {"pad": 0, "eos": 1, "bos": 2, "unk": 3}
    return tokens, scores, types, ids


def _add_linear(w: GGUFWriter, rng: np.random.Generator, name: str, out_f: int, in_f: int, qtype: Q, scale: float) -> None:
    if qtype in (Q.Q4_K, Q.Q6_K):  # k-quants gguf cannot quantize: random blocks of that spread
        w.add_tensor(name, random_matrix(rng, qtype, out_f, in_f, scale), raw_dtype=qtype)
        return
    data = (rng.standard_normal((out_f, in_f)) * scale).astype(np.float32)
    if qtype == Q.F32:
        w.add_tensor(name, data)
    else:
        w.add_tensor(name, quantize(data, qtype), raw_dtype=qtype)


def _add_norm(w: GGUFWriter, rng: np.random.Generator, name: str, n: int) -> None:
    w.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32))


def write_tiny_llama(path: str | Path, seed: int = 0, n_layers: int = 2, n_ctx: int = 256, qtype: Q = Q.Q8_0,
                     n_embd: int = 64, split_max_tensors: int = 0, controls: list[str] = (),
                     keys: dict | None = None, output_qtype: Q | None = None, n_heads: int = 4,
                     n_kv: int = 2) -> Path:
    """A tiny random llama file; with `split_max_tensors`, split as llama.cpp's gguf-split does
    (PATH-00001-of-0000N.gguf ...; the first part's path is returned); `controls`: control tokens
    added at the end of the vocabulary; `keys`: more `llama.*` keys (e.g. rope scaling);
    `output_qtype`: an output head of its own of this type (else the embeddings are tied);
    `n_heads` query heads of n_embd / n_heads values sharing `n_kv` KV heads."""
    rng = np.random.default_rng(seed)
    tokens, types, merges, ids = _bpe_vocab()
    tokens, types = tokens + list(controls), types + [3] * len(controls)
    n_vocab, n_ff = len(tokens), 2 * n_embd
    head_dim = n_embd // n_heads
    w = _writer(path, "llama", n_layers, n_ctx, n_embd, n_ff, n_heads, n_kv, split_max_tensors)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(head_dim)
    w.add_vocab_size(n_vocab)
    _add_arch_keys(w, "llama", keys or {}, n_layers)
    _add_bpe_tokenizer(w, "smollm", tokens, types, merges, ids)
    _add_linear(w, rng, "token_embd.weight", n_vocab, n_embd, Q.Q8_0, 0.5)
    for i in range(n_layers):
        p = f"blk.{i}."
        _add_norm(w, rng, p + "attn_norm.weight", n_embd)
        _add_linear(w, rng, p + "attn_q.weight", n_embd, n_embd, qtype, 0.2)
        _add_linear(w, rng, p + "attn_k.weight", n_kv * head_dim, n_embd, qtype, 0.2)
        _add_linear(w, rng, p + "attn_v.weight", n_kv * head_dim, n_embd, qtype, 0.2)
        _add_linear(w, rng, p + "attn_output.weight", n_embd, n_embd, qtype, 0.2)
        _add_norm(w, rng, p + "ffn_norm.weight", n_embd)
        _add_linear(w, rng, p + "ffn_gate.weight", n_ff, n_embd, qtype, 0.2)
        _add_linear(w, rng, p + "ffn_up.weight", n_ff, n_embd, qtype, 0.2)
        _add_linear(w, rng, p + "ffn_down.weight", n_embd, n_ff, qtype, 0.2)
    _add_norm(w, rng, "output_norm.weight", n_embd)
    if output_qtype is not None:
        _add_linear(w, rng, "output.weight", n_vocab, n_embd, output_qtype, 0.5)
    _finish(w)
    if split_max_tensors:
        path = Path(path)
        return next(path.parent.glob(f"{path.stem}-00001-of-*.gguf"))
    return Path(path)


def write_tiny_gemma3(path: str | Path, seed: int = 0, n_layers: int = 6, n_ctx: int = 256, window: int = 8,
                      keys: dict | None = None) -> Path:
    """A tiny random gemma3 file (every sixth layer global); `keys`: more `gemma3.*` keys."""
    rng = np.random.default_rng(seed)
    tokens, scores, types, ids = _spm_vocab()
    n_vocab, n_embd, n_heads, n_kv, head_dim, n_ff = len(tokens), 64, 2, 1, 32, 128
    w = _writer(path, "gemma3", n_layers, n_ctx, n_embd, n_ff, n_heads, n_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(1_000_000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_sliding_window(window)
    _add_arch_keys(w, "gemma3", keys or {}, n_layers)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    _add_special_ids(w, ids)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(False)
    _add_linear(w, rng, "token_embd.weight", n_vocab, n_embd, Q.Q8_0, 0.1)
    for i in range(n_layers):
        p = f"blk.{i}."
        _add_norm(w, rng, p + "attn_norm.weight", n_embd)
        _add_linear(w, rng, p + "attn_q.weight", n_heads * head_dim, n_embd, Q.Q5_0, 0.2)
        _add_linear(w, rng, p + "attn_k.weight", n_kv * head_dim, n_embd, Q.Q5_0, 0.2)
        _add_linear(w, rng, p + "attn_v.weight", n_kv * head_dim, n_embd, Q.Q8_0, 0.2)
        _add_norm(w, rng, p + "attn_q_norm.weight", head_dim)
        _add_norm(w, rng, p + "attn_k_norm.weight", head_dim)
        _add_linear(w, rng, p + "attn_output.weight", n_embd, n_heads * head_dim, Q.Q4_K if n_embd % 256 == 0 else Q.Q8_0, 0.2)
        _add_norm(w, rng, p + "post_attention_norm.weight", n_embd)
        _add_norm(w, rng, p + "ffn_norm.weight", n_embd)
        _add_linear(w, rng, p + "ffn_gate.weight", n_ff, n_embd, Q.Q5_0, 0.2)
        _add_linear(w, rng, p + "ffn_up.weight", n_ff, n_embd, Q.Q5_0, 0.2)
        _add_linear(w, rng, p + "ffn_down.weight", n_embd, n_ff, Q.Q8_0, 0.2)
        _add_norm(w, rng, p + "post_ffw_norm.weight", n_embd)
    _add_norm(w, rng, "output_norm.weight", n_embd)
    _finish(w)
    return Path(path)


def _writer(path, arch: str, n_layers: int, n_ctx: int, n_embd: int, n_ff: int, n_heads: int, n_kv: int,
            split_max_tensors: int = 0) -> GGUFWriter:
    w = GGUFWriter(str(path), arch, split_max_tensors=split_max_tensors)
    w.add_name(f"tiny-{arch}")
    w.add_block_count(n_layers)
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_heads)
    w.add_head_count_kv(n_kv)
    return w


def _add_bpe_tokenizer(w: GGUFWriter, pre: str, tokens, types, merges, ids: dict[str, int]) -> None:
    """The byte-level BPE vocabulary of _bpe_vocab(), no BOS added, and the ChatML template."""
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    _add_special_ids(w, ids)
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML_TEMPLATE)


def _add_special_ids(w: GGUFWriter, ids: dict[str, int]) -> None:
    w.add_bos_token_id(ids["bos"])
    w.add_eos_token_id(ids["eos"])
    w.add_unk_token_id(ids["unk"])
    w.add_pad_token_id(ids["pad"])


def _finish(w: GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_tiny_lora(path: str | Path, targets: dict[str, tuple[int, int]], rank: int = 4, alpha: float = 8.0, seed: int = 0, arch: str = "llama") -> Path:
    """A LoRA adapter in llama.cpp's GGUF format for the given {weight name: (out, in)}."""
    rng = np.random.default_rng(seed)
    w = GGUFWriter(str(path), arch)
    w.add_string("general.type", "adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", alpha)
    for name, (out_f, in_f) in targets.items():
        w.add_tensor(name + ".lora_a", (rng.standard_normal((rank, in_f)) * 0.3).astype(np.float32))
        w.add_tensor(name + ".lora_b", (rng.standard_normal((out_f, rank)) * 0.3).astype(np.float32))
    _finish(w)
    return Path(path)


# -- the newer architectures ---------------------------------------------------------------------
# One writer for all of them: each entry lists what the architecture's files hold beyond a llama
# layer. Heads of 24 (with attention.key_length) where llama.cpp reads key_length, so that
# head_dim != n_embd / n_head is exercised; small windows so sliding layers matter.
TINY_ARCHS: dict[str, dict] = {
    "qwen2": {"qkv_bias": True, "output_bias": True, "tied": True},
    "qwen3": {"qk_norm": "head", "head_dim": 24},
    "qwen3moe": {"qk_norm": "head", "head_dim": 24, "moe": {"n_expert": 4, "n_used": 2}},
    "mistral3": {"keys": {"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0, "rope.scaling.original_context_length": 16,
                          "rope.scaling.yarn_beta_fast": 0.5, "rope.scaling.yarn_beta_slow": 0.05,
                          "rope.scaling.yarn_log_multiplier": 1.0, "attention.temperature_scale": 0.3}},
    "gemma2": {"post_norms": True, "head_dim": 24, "tied": True,
               "keys": {"attention.sliding_window": 5, "attn_logit_softcapping": 4.0, "final_logit_softcapping": 15.0}},
    "olmo2": {"pre_norms": False, "post_norms": True, "qk_norm": "full",
              "keys": {"attention.sliding_window": 6, "attention.sliding_window_pattern": [True, False],
                       "rope.scaling.type": "yarn", "rope.scaling.factor": 2.0, "rope.scaling.original_context_length": 64}},
    "granite": {"keys": {"embedding_scale": 2.0, "residual_scale": 0.5, "attention.scale": 0.1, "logit_scale": 3.0}},
    "phi3": {"fused": True, "keys": {"rope.dimension_count": 12}},
    "gpt-oss": {"qkv_bias": True, "wo_bias": True, "sinks": True, "head_dim": 24, "ffn_norm": "post_attention_norm",
                "moe": {"n_expert": 4, "n_used": 2, "bias": True, "qtype": Q.MXFP4},
                "keys": {"attention.sliding_window": 5, "rope.scaling.type": "yarn", "rope.scaling.factor": 4.0,
                         "rope.scaling.original_context_length": 64}},
}


def write_tiny_arch(path: str | Path, arch: str, seed: int = 0, n_layers: int = 2, n_ctx: int = 256,
                    shape: dict | None = None, keys: dict | None = None) -> Path:
    """A tiny random `arch` file (one of TINY_ARCHS) with the byte-level BPE vocabulary. `shape`
    overrides sizes (n_embd, n_heads, n_kv, n_ff, head_dim, expert_ff, n_expert, n_used) to
    build larger files of the same kind (benchmarks); `keys` adds to (or replaces) the entry's
    `arch.*` keys."""
    shape = shape or {}
    spec = dict(TINY_ARCHS[arch])
    if "moe" in spec:
        spec["moe"] = {**spec["moe"], **{k: shape[k] for k in ("n_expert", "n_used") if k in shape}}
    rng = np.random.default_rng(seed)
    tokens, types, merges, ids = _bpe_vocab()
    n_embd, n_heads, n_kv, n_ff = (shape.get(k, d) for k, d in (("n_embd", 64), ("n_heads", 4), ("n_kv", 2), ("n_ff", 128)))
    head_dim = shape.get("head_dim", spec.get("head_dim", n_embd // n_heads))
    expert_ff = shape.get("expert_ff", 32)
    w = _writer(path, arch, n_layers, n_ctx, n_embd, n_ff, n_heads, n_kv)
    if head_dim != n_embd // n_heads:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    if "moe" in spec:
        w.add_expert_count(spec["moe"]["n_expert"])
        w.add_expert_used_count(spec["moe"]["n_used"])
        w.add_expert_feed_forward_length(expert_ff)
    _add_arch_keys(w, arch, {**spec.get("keys", {}), **(keys or {})}, n_layers)
    _add_bpe_tokenizer(w, "qwen2", tokens, types, merges, ids)
    _add_linear(w, rng, "token_embd.weight", len(tokens), n_embd, Q.F32, 0.5)
    dims = {"n_embd": n_embd, "q": n_heads * head_dim, "kv": n_kv * head_dim, "head_dim": head_dim, "n_heads": n_heads,
            "n_ff": n_ff, "expert_ff": expert_ff}
    for i in range(n_layers):
        _add_tiny_layer(w, rng, f"blk.{i}.", spec, dims)
    _add_norm(w, rng, "output_norm.weight", n_embd)
    if not spec.get("tied"):
        _add_linear(w, rng, "output.weight", len(tokens), n_embd, Q.Q8_0, 0.3)
    if spec.get("output_bias"):
        _add_bias(w, rng, "output.bias", len(tokens))
    _finish(w)
    return Path(path)


def _add_arch_keys(w: GGUFWriter, arch: str, keys: dict, n_layers: int) -> None:
    for key, value in keys.items():
        if isinstance(value, list):  # a per-layer pattern, cycled over the layers
            value = [value[i % len(value)] for i in range(n_layers)]
        _add_arch_key(w, f"{arch}.{key}", value)


def _add_arch_key(w: GGUFWriter, key: str, value) -> None:
    if isinstance(value, str):
        w.add_string(key, value)
    elif isinstance(value, list):
        w.add_array(key, value)
    elif isinstance(value, float):
        w.add_float32(key, value)
    else:
        w.add_uint32(key, value)


def _add_bias(w: GGUFWriter, rng: np.random.Generator, name: str, *shape: int) -> None:
    w.add_tensor(name, (0.3 * rng.standard_normal(shape)).astype(np.float32))


def _add_tiny_layer(w: GGUFWriter, rng: np.random.Generator, p: str, spec: dict, d: dict) -> None:
    n_embd = d["n_embd"]
    if spec.get("pre_norms", True):
        _add_norm(w, rng, p + "attn_norm.weight", n_embd)
    if spec.get("fused"):
        _add_linear(w, rng, p + "attn_qkv.weight", d["q"] + 2 * d["kv"], n_embd, Q.Q8_0, 0.2)
    else:
        for name, rows, qtype in (("attn_q", d["q"], Q.Q4_0), ("attn_k", d["kv"], Q.Q8_0), ("attn_v", d["kv"], Q.F16)):
            _add_linear(w, rng, p + name + ".weight", rows, n_embd, qtype, 0.2)
            if spec.get("qkv_bias"):
                _add_bias(w, rng, p + name + ".bias", rows)
    if spec.get("qk_norm"):
        per_head = spec["qk_norm"] == "head"
        _add_norm(w, rng, p + "attn_q_norm.weight", d["head_dim"] if per_head else d["q"])
        _add_norm(w, rng, p + "attn_k_norm.weight", d["head_dim"] if per_head else d["kv"])
    _add_linear(w, rng, p + "attn_output.weight", n_embd, d["q"], Q.Q8_0, 0.2)
    if spec.get("wo_bias"):
        _add_bias(w, rng, p + "attn_output.bias", n_embd)
    if spec.get("sinks"):
        _add_bias(w, rng, p + "attn_sinks.weight", d["n_heads"])
    if spec.get("post_norms") or spec.get("ffn_norm") == "post_attention_norm":
        _add_norm(w, rng, p + "post_attention_norm.weight", n_embd)
    if spec.get("pre_norms", True) and "ffn_norm" not in spec:
        _add_norm(w, rng, p + "ffn_norm.weight", n_embd)
    if "moe" in spec:
        _add_tiny_experts(w, rng, p, spec["moe"], n_embd, d["expert_ff"])
    elif spec.get("fused"):
        _add_linear(w, rng, p + "ffn_up.weight", 2 * d["n_ff"], n_embd, Q.Q4_1, 0.2)
    else:
        _add_linear(w, rng, p + "ffn_gate.weight", d["n_ff"], n_embd, Q.Q4_0, 0.2)
        _add_linear(w, rng, p + "ffn_up.weight", d["n_ff"], n_embd, Q.Q8_0, 0.2)
    if "moe" not in spec:
        _add_linear(w, rng, p + "ffn_down.weight", n_embd, d["n_ff"], Q.Q8_0, 0.2)
    if spec.get("post_norms"):
        _add_norm(w, rng, p + "post_ffw_norm.weight", n_embd)


def _add_tiny_experts(w: GGUFWriter, rng: np.random.Generator, p: str, moe: dict, n_embd: int, n_ff: int = 32) -> None:
    n_expert, qtype = moe["n_expert"], moe.get("qtype", Q.Q8_0)
    _add_linear(w, rng, p + "ffn_gate_inp.weight", n_expert, n_embd, Q.F32, 0.5)
    if moe.get("bias"):
        _add_bias(w, rng, p + "ffn_gate_inp.bias", n_expert)
    for name, out_f, in_f in (("ffn_gate_exps", n_ff, n_embd), ("ffn_up_exps", n_ff, n_embd), ("ffn_down_exps", n_embd, n_ff)):
        data = (rng.standard_normal((n_expert, out_f, in_f)) * 0.3).astype(np.float32)
        w.add_tensor(p + name + ".weight", quantize(data, qtype), raw_dtype=qtype)
        if moe.get("bias"):
            _add_bias(w, rng, p + name + ".bias", n_expert, out_f)


def write_tiny_llama_with_controls(path: str | Path, controls: list[str], seed: int = 0, n_layers: int = 2,
                                   n_ctx: int = 256, n_embd: int = 64) -> Path:
    """write_tiny_llama's model with `controls` added at the end of its vocabulary as control
    tokens (e.g. Gemma 4's `<|channel>` and `<channel|>`): ids 267, 268, ..."""
    return write_tiny_llama(path, seed, n_layers, n_ctx, n_embd=n_embd, controls=controls)
