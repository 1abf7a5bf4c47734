"""A loaded model's weights handed to the native forward pass (src/forward.cpp).

`NativeModel(model, lib)` describes a `CausalLM` (llama or gemma3) to the C++ side once: the
packed weights (lamplight.native.pack, exact repacks of the GGUF blocks), norms, RoPE tables.
Calling it runs one step: every row through the same native code, K/V written to the engine's
paged pool, logits for the batch's logit rows.
"""

from __future__ import annotations

import ctypes
import itertools

import numpy as np
import torch

from ..gguf.quant import dequantize, dequantize_rows
from ..models.base import CausalLM
from ..models.batch import ForwardBatch
from ..models.decoder import Decoder, gelu_tanh_fp16_table
from ..gguf.file import TensorInfo
from ..models.moe import MoEFeedForward, silu_glu, swiglu_oai
from . import abi
from .abi import NativeUnsupported

# The configurable decoder's gate/up combinations the native forward computes. ggml's fp16 GELU
# table (gemma2) is computed exactly instead of looked up: within fp16 rounding of it.
_ACTIVATIONS = {silu_glu: abi.LP_ACT_SILU, gelu_tanh_fp16_table: abi.LP_ACT_GELU_TANH,
                swiglu_oai: abi.LP_ACT_SWIGLU_OAI}

KV_TYPES = {torch.float32: abi.LP_KV_F32, torch.float16: abi.LP_KV_F16, torch.bfloat16: abi.LP_KV_BF16}


def _ptr(t) -> int | None:
    if t is None:
        return None
    if isinstance(t, np.ndarray):
        return t.ctypes.data
    return t.data_ptr()


class NativeModel:
    def __init__(self, model: CausalLM, lib: ctypes.CDLL, packed: bool = True):
        self.model = model
        self.lib = lib
        self.packed = packed
        self._packed: dict[tuple[str, ...], list] = {}  # packed parts by weight names (kept across rebuilds)
        self._kv_desc: tuple[object, abi.KV] | None = None  # (the pool, its description)
        self.handle = None
        self.rebuild()
        lib.lp_set_threads(torch.get_num_threads())  # -t sets torch's count before loading
        self.threads = lib.lp_get_threads()
        self.kinds = sorted({self._kind(p) for p in self._parts()})

    def rebuild(self) -> None:
        """Describe the model to the C side again (after LoRA adapters were attached to its
        layers); packed weights are reused."""
        self._keep: list = []  # every array the C side points into
        config = self._describe_config(self.model)
        n_layers = self.model.config.n_layers
        layers = (abi.Layer * n_layers)(*(self._describe_layer(self.model, i) for i in range(n_layers)))
        if self.handle:
            self.lib.lp_model_free(self.handle)
        self._config, self._layers = config, layers
        self.handle = self.lib.lp_model_new(ctypes.byref(config), layers)
        self._has_loras = any(lin.n_loras for layer in layers for lin in (layer.qkv, layer.wo, layer.gate_up, layer.down))

    def describe(self) -> str:
        """The kernel set, for the start-up log and /props: e.g. 'native avx512vnni (w4, w8_32; 2 threads)'."""
        return f"native {self.lib.lp_isa().decode()} ({', '.join(self.kinds)}; {self.threads} threads)"

    def weight_bytes(self) -> int:
        """Bytes of the weights the native forward reads (packed, plus dense norms and tables)."""
        return sum(t.nbytes if isinstance(t, np.ndarray) else t.numel() * t.element_size()
                   for t in self._keep if isinstance(t, (np.ndarray, torch.Tensor)))

    def scratch_bytes(self) -> int:
        """Bytes of the forward's working buffers so far (they grow with the largest step)."""
        return self.lib.lp_model_scratch_bytes(self.handle)

    def __del__(self):
        handle = getattr(self, "handle", None)
        if handle:
            self.lib.lp_model_free(handle)

    # -- description -----------------------------------------------------------------------------

    def _hold(self, t: torch.Tensor | np.ndarray) -> int:
        if isinstance(t, torch.Tensor):
            t = t.detach().float().contiguous()
        self._keep.append(t)
        return _ptr(t)

    def _linear(self, members, bias: torch.Tensor | None = None) -> abi.Linear:
        """One native linear over `members` (QuantLinears reading the same input)."""
        infos = [m.info for m in members]
        lin = abi.Linear()
        names = tuple(i.name for i in infos)
        if names not in self._packed:
            self._packed[names] = _pack_groups(infos) if self.packed else [([i], None) for i in infos]
        groups = self._packed[names]
        if len(groups) > abi.MAX_PARTS:
            raise NativeUnsupported(f"more than {abi.MAX_PARTS} weights in one fused linear")
        lin.n_parts = len(groups)
        lin.n_out = sum(i.shape[0] for i in infos)
        for part, (group_infos, packed) in zip(lin.parts, groups):
            if packed is not None:
                part.w.format, part.w.n, part.w.k = packed.format, packed.n, packed.k
                part.w.data = self._hold(packed.data)
            else:
                weight = torch.cat([dequantize(i) for i in group_infos])
                part.w.format, part.w.n, part.w.k = 0, weight.shape[0], weight.shape[1]
                part.dense = self._hold(weight)
        lin.bias = self._hold(bias) if bias is not None else None
        self._attach_loras(lin, members)
        return lin

    def _attach_loras(self, lin: abi.Linear, members) -> None:
        """The members' LoRA adapters (QuantLinear.loras) as native deltas on their columns."""
        loras, offset = [], 0
        for member in members:
            for index, a, b, factor in getattr(member, "loras", ()):
                if a.shape[0] > abi.MAX_LORA_RANK:
                    raise NativeUnsupported(f"LoRA rank {a.shape[0]} is above {abi.MAX_LORA_RANK}")
                loras.append(abi.Lora(index, a.shape[0], offset, member.info.shape[0], factor, 0,
                                      self._hold(a), self._hold(b)))
            offset += member.info.shape[0]
        if loras:
            array = (abi.Lora * len(loras))(*loras)
            self._keep.append(array)
            lin.n_loras, lin.loras = len(loras), ctypes.cast(array, ctypes.POINTER(abi.Lora))

    def _parts(self):
        for layer in self._layers:
            for lin in (layer.qkv, layer.wo, layer.gate_up, layer.down):
                yield from lin.parts[: lin.n_parts]
        yield from self._config.head.parts[: self._config.head.n_parts]

    @staticmethod
    def _kind(part: abi.LinearPart) -> str:
        return {0: "f32", 1: "w4", 2: "w8", 3: "w8_32"}.get(part.w.format, f"format{part.w.format}")

    def _describe_config(self, model: CausalLM) -> abi.Config:
        cfg = model.config
        if cfg.head_dim_k % 8 or cfg.head_dim_v % 8 or cfg.n_embd > 8192:
            raise NativeUnsupported(f"head sizes {cfg.head_dim_k}/{cfg.head_dim_v} or width {cfg.n_embd}")
        c = abi.Config()
        c.n_layers, c.n_embd, c.n_heads, c.n_kv_heads = cfg.n_layers, cfg.n_embd, cfg.n_heads, cfg.n_kv_heads
        c.head_dim_k, c.head_dim_v, c.n_ff, c.vocab = cfg.head_dim_k, cfg.head_dim_v, cfg.n_ff, cfg.vocab_size
        c.rms_eps, c.attn_scale = cfg.rms_eps, model.scale
        c.embd_scale = c.residual_scale = c.logit_scale = 1.0
        head_bias = None
        if isinstance(model, Decoder):
            ropes, head_bias = self._decoder_config(model, c)
        elif cfg.architecture == "llama":
            ropes, c.activation = [model.rope], abi.LP_ACT_SILU
        elif cfg.architecture == "gemma3":
            ropes = [model.rope_local, model.rope_global]
            c.activation, c.embd_scale = abi.LP_ACT_GELU_TANH, model.embd_scale
            c.final_softcap = float(model.softcap or 0.0)
        else:
            raise NativeUnsupported(f"no native forward for architecture {cfg.architecture}")
        c.n_rot, c.rope_neox, c.rope_max_pos = ropes[0].n_rot, int(ropes[0].neox), ropes[0].cos.shape[0]
        for i, rope in enumerate(ropes):
            # YaRN's magnitude scales the rotated values: folded into the tables (as `angles` does).
            magnitude = getattr(rope, "magnitude", 1.0)
            cos, sin = (rope.cos, rope.sin) if magnitude == 1.0 else (rope.cos * magnitude, rope.sin * magnitude)
            c.rope_cos[i], c.rope_sin[i] = self._hold(cos), self._hold(sin)
        c.output_norm = self._hold(model.output_norm.weight)
        c.head = self._linear([model.output] if model.output is not None else [_TiedHead(model)], head_bias)
        return c

    def _decoder_config(self, model, c: abi.Config) -> tuple[list, torch.Tensor | None]:
        """The configurable decoder's options (lamplight.models.decoder), where the native
        forward computes them; NativeUnsupported names what it does not."""
        opts = model.opts
        activations = {opts.activation} | {b.ffn.activation for b in model.blocks if isinstance(b.ffn, MoEFeedForward)}
        unknown = [a.__name__ for a in activations if a not in _ACTIVATIONS]
        if unknown:
            raise NativeUnsupported(f"the activation {', '.join(unknown)}")
        if model.rope.neox != model.rope_sliding.neox or model.rope.n_rot != model.rope_sliding.n_rot:
            raise NativeUnsupported("two rope layouts")
        c.activation, c.embd_scale = _ACTIVATIONS[opts.activation], opts.embd_scale
        c.residual_scale, c.logit_scale = opts.residual_scale, opts.logit_scale
        c.final_softcap = float(opts.final_softcap or 0.0)
        c.attn_softcap = float(opts.attn_softcap or 0.0)
        if opts.query_temperature is not None:
            t = opts.query_temperature
            c.qtemp_scale, c.qtemp_length, c.qtemp_offset = t.scale, float(t.length), t.offset
        return [model.rope, model.rope_sliding], model.output_bias

    def _describe_layer(self, model: CausalLM, i: int) -> abi.Layer:
        if isinstance(model, Decoder):
            return self._decoder_layer(model, i)
        blk = model.blocks[i]
        layer = abi.Layer()
        layer.qkv = self._linear(list(blk.qkv.members))
        layer.wo = self._linear([blk.wo])
        layer.gate_up = self._linear(list(blk.gate_up.members))
        layer.down = self._linear([blk.down])
        layer.attn_norm = self._hold(blk.attn_norm.weight)
        layer.ffn_norm = self._hold(blk.ffn_norm.weight)
        if model.config.architecture == "gemma3":
            layer.q_norm, layer.k_norm = self._hold(blk.q_norm.weight), self._hold(blk.k_norm.weight)
            layer.post_attn_norm = self._hold(blk.post_attn_norm.weight)
            layer.post_ffn_norm = self._hold(blk.post_ffn_norm.weight)
            layer.rope = int(blk.is_global)
            layer.window = 0 if blk.is_global else model.window
        return layer

    def _decoder_layer(self, model, i: int) -> abi.Layer:
        blk = model.blocks[i]
        attn, ffn = blk.attn, blk.ffn
        layer = abi.Layer()
        layer.qkv = self._linear(list(attn.qkv.members), attn.qkv_bias)
        layer.wo = self._linear([attn.wo], attn.wo_bias)
        if isinstance(ffn, MoEFeedForward):
            layer.moe = self._experts(ffn)
        else:
            layer.gate_up = self._linear(list(ffn.gate_up.members))
            layer.down = self._linear([ffn.down])
        if attn.shaping is not None and attn.shaping.sinks is not None:
            layer.sinks = self._hold(attn.shaping.sinks)
        norm = lambda module: self._hold(module.weight) if module is not None else None  # noqa: E731
        layer.attn_norm, layer.ffn_norm = norm(blk.attn_norm), norm(blk.ffn_norm)
        layer.post_attn_norm, layer.post_ffn_norm = norm(blk.post_attn_norm), norm(blk.post_ffn_norm)
        qk_norms = [n for n in (attn.q_norm, attn.k_norm) if n is not None]
        layer.q_norm = norm(attn.q_norm.norm) if attn.q_norm is not None else None
        layer.k_norm = norm(attn.k_norm.norm) if attn.k_norm is not None else None
        layer.qk_norm_whole = int(any(not n.per_head for n in qk_norms))
        layer.rope = int(attn.rope is not model.rope)
        layer.window = attn.window or 0
        return layer

    def _experts(self, ffn: MoEFeedForward):
        """A mixture-of-experts layer: the router in float32, each expert packed on its own."""
        n_expert = ffn.gate.n_expert
        if n_expert > abi.MAX_EXPERTS or ffn.n_used > abi.MAX_EXPERTS_USED:
            raise NativeUnsupported(f"{n_expert} experts, {ffn.n_used} used")
        ex = abi.Experts()
        ex.n_expert, ex.n_used, ex.n_ff = n_expert, ffn.n_used, ffn.gate.out_features
        ex.gating = abi.LP_GATING_SOFTMAX_SELECTED if ffn.gating == "softmax_selected" else abi.LP_GATING_SOFTMAX
        ex.normalize, ex.activation = int(ffn.normalize), _ACTIVATIONS[ffn.activation]
        ex.router = self._hold(dequantize(ffn.router.info))
        ex.router_bias = self._hold(ffn.router_bias) if ffn.router_bias is not None else None
        gate_up, down = (abi.Linear * n_expert)(), (abi.Linear * n_expert)()
        for e in range(n_expert):
            gate_up[e] = self._linear([_Expert(ffn.gate, e), _Expert(ffn.up, e)], _joint_expert_bias(ffn, e))
            down[e] = self._linear([_Expert(ffn.down, e)], _expert_bias(ffn.down, e))
        self._keep += [gate_up, down, ex]
        ex.gate_up = ctypes.cast(gate_up, ctypes.POINTER(abi.Linear))
        ex.down = ctypes.cast(down, ctypes.POINTER(abi.Linear))
        return ctypes.pointer(ex)

    # -- one step --------------------------------------------------------------------------------

    def _kv(self, kv) -> abi.KV:
        """The pool's description for the C side, made once per pool (an engine keeps one)."""
        if self._kv_desc is None or self._kv_desc[0] is not kv:
            n = len(kv.k)
            desc = abi.KV()
            desc.k_type, desc.v_type = KV_TYPES[kv.k[0].dtype], KV_TYPES[kv.v[0].dtype]
            desc.pool_tokens = kv.k[0].shape[1]
            desc.n_layers = n  # the C side checks the pool has the model's layers
            desc._k = (ctypes.c_void_p * n)(*(t.data_ptr() for t in kv.k))
            desc._v = (ctypes.c_void_p * n)(*(t.data_ptr() for t in kv.v))
            desc.k = ctypes.cast(desc._k, ctypes.POINTER(ctypes.c_void_p))
            desc.v = ctypes.cast(desc._v, ctypes.POINTER(ctypes.c_void_p))
            self._kv_desc = (kv, desc)
        return self._kv_desc[1]

    def embeddings(self, token_ids: torch.Tensor) -> torch.Tensor:
        return dequantize_rows(self.model.token_embd_info, token_ids.numpy())

    def __call__(self, batch: ForwardBatch, kv) -> torch.Tensor:
        if batch.embedding_overrides is not None:
            raise NativeUnsupported("embedding overrides have no native path")
        embd = self.embeddings(batch.token_ids)
        key_offsets, key_slots = key_table(batch)
        positions = batch.positions.contiguous()
        write_slots = batch.kv_write_slots.contiguous()
        logit_rows = batch.logit_rows.contiguous()
        n_rows = embd.shape[0]
        # The C side reads int64 [n_rows] arrays and float32 embeddings [n_rows, n_embd]: what it
        # cannot see (dtypes, lengths) is checked here; the values in them it checks itself.
        if (embd.dtype != torch.float32 or not embd.is_contiguous() or embd.shape[1] != self.model.config.n_embd
                or any(t.dtype != torch.int64 or t.numel() != n_rows for t in (positions, write_slots))
                or logit_rows.dtype != torch.int64 or len(key_offsets) != n_rows):
            raise ValueError("native forward: the batch's arrays are not int64 [rows] (embeddings float32 [rows, n_embd])")
        logits = torch.empty(logit_rows.numel(), self.model.config.vocab_size)
        scales = np.asarray(self.model.lora_scales.scales, dtype=np.float32) if self._has_loras else None
        b = abi.Batch(n_rows=n_rows, n_logits=logit_rows.numel(), n_key_slots=key_slots.size,
                      n_lora_scales=0 if scales is None else scales.size, embeddings=_ptr(embd),
                      positions=_ptr(positions), write_slots=_ptr(write_slots), key_offsets=_ptr(key_offsets),
                      key_slots=_ptr(key_slots), logit_rows=_ptr(logit_rows), lora_scales=_ptr(scales))
        pool = self._kv(kv)
        rc = self.lib.lp_forward(self.handle, ctypes.byref(b), ctypes.byref(pool), logits.data_ptr())
        if rc == abi.LP_ERR_UNSUPPORTED:
            raise NativeUnsupported(abi.last_error(self.lib)[1])
        if rc != abi.LP_OK:
            raise abi.error(self.lib, rc)  # ValueError naming the array, row and value out of range
        return logits


def _pack_groups(infos: list) -> list[tuple[list, object]]:
    """(infos, packed weight or None for dense float32) parts for weights read together: one
    packed part if they share a format, else one part each."""
    from . import pack

    if len(infos) == 1 or not all(pack.can_pack(i.qtype) for i in infos):
        return [([i], pack.pack(i) if pack.can_pack(i.qtype) else None) for i in infos]
    try:
        return [(infos, pack.pack_rows(infos))]
    except ValueError:  # mixed formats (e.g. Q4_K Q/K with a Q6_K V): one part each
        return [([i], pack.pack(i)) for i in infos]


class _Expert:
    """Expert e's slice of a 3-D expert tensor, as a 2-D weight (its rows of raw blocks)."""

    def __init__(self, bank, e: int):
        out, k = bank.out_features, bank.in_features
        self.info = TensorInfo(f"{bank.info.name}[{e}]", bank.info.qtype, (out, k), bank.info.data[e * out:(e + 1) * out])


def _expert_bias(bank, e: int):
    return bank.bias[e] if bank.bias is not None else None


def _joint_expert_bias(ffn: MoEFeedForward, e: int):
    gate, up = _expert_bias(ffn.gate, e), _expert_bias(ffn.up, e)
    if gate is None and up is None:
        return None
    zeros = torch.zeros(ffn.gate.out_features)
    return torch.cat([gate if gate is not None else zeros, up if up is not None else zeros])


class _TiedHead:
    """The token embedding standing in as the output head (models with a tied head)."""

    def __init__(self, model: CausalLM):
        self.info = model.token_embd_info


def key_table(batch: ForwardBatch) -> tuple[np.ndarray, np.ndarray]:
    """Each row's key slots in the pool: (offsets [T], slots); row r's key at position p is
    slots[offsets[r] + p]. A chunk's rows share its slot list (causality comes from positions)."""
    offsets, base = [], 0
    for chunk in batch.chunks:
        offsets.extend([base] * len(chunk.token_ids))
        base += len(chunk.kv_slots)
    slots = np.fromiter(itertools.chain.from_iterable(c.kv_slots for c in batch.chunks), dtype=np.int64, count=base)
    return np.asarray(offsets, dtype=np.int64), slots
