"""The "native" backend: a model definition handed to the C++ forward pass (src/forward.cpp).

`NativeRunner(spec, lib)` describes a DecoderSpec (lamplight.models.spec) to the C++ side once:
the packed weights (lamplight.native.pack, exact repacks of the GGUF blocks), norms, RoPE
tables, LoRA adapters. Each step runs every row through the same native code, K/V written to
the caller's paged pool, the recurrent layers' states (hybrid models) read from and written to
its RecurrentPool (written once the whole step has succeeded), logits for the batch's logit
rows. It reads only the spec: no PyTorch module of the model is built.

No torch is needed to build it or to serve with it: its state is numpy's (new_state), a step
reads the chunks' rows as numpy (lamplight.models.rows) and gives numpy logits (`step`), and a
context shift re-rotates keys on numpy (lamplight.native.context_shift). `run`, `run_batch` and
`hidden_states` give PyTorch tensors (tests, library users, the embedders) and import torch
when called; a step also runs on PyTorch pools on the CPU (the tests' shared pools).
"""

from __future__ import annotations

import ctypes
import itertools
from typing import TYPE_CHECKING, Sequence

import numpy as np

from ..gguf.file import TensorInfo
from ..gguf.quant import dequantize
from ..models.lora import LoraAdapter, LoraScales, check_adapters
from ..models.rope import RopeTables
from ..models.rows import BatchRows, batch_rows
from ..models.spec import (DecoderSpec, DeltaNetSpec, ExpertsSpec, FeedForwardSpec, LayerSpec, Mamba2Spec, RecurrentSpec,
                           ShortConvSpec)
from ..runner.base import ModelRunner
from ..state import ModelState, kv_type
from ..state.advance import advance_states
from . import abi
from .abi import NativeUnsupported
from .context_shift import KeyRotation, shift_kv
from .linear import address as _ptr, describe_linear, hold, pack_groups
from .lookup import embedding_rows
from .prefetch import PLAIN as PLAIN_READS
from .prefetch import OneRowReads
from .prefetch import describe as describe_reads
from .threads import configured_threads

if TYPE_CHECKING:
    import torch

    from ..models.batch import ForwardBatch
    from ..models.chunks import SequenceChunk
    from ..state.kv import KVPool
    from ..state.recurrent import RecurrentPool

# The gate/up combinations (lamplight.models.activations) the native forward computes. ggml's
# fp16 GELU table (gemma2) is computed exactly instead of looked up: within fp16 rounding of it.
_ACTIVATIONS = {"silu": abi.LP_ACT_SILU, "gelu_tanh": abi.LP_ACT_GELU_TANH, "gelu_tanh_fp16": abi.LP_ACT_GELU_TANH,
                "swiglu_oai": abi.LP_ACT_SWIGLU_OAI}


def native_kv_type(kind) -> int:
    """The C side's LP_KV_* of a pool's K or V type (lamplight.state.kv_type's forms)."""
    return kv_type(kind).native_id


class NativeRunner(ModelRunner):
    backend = "native"
    default_cache_type = "f16"  # llama-server's default; the native attention reads f16 fast
    owns_threads = True
    # Every row's matmuls are its own and a chunk's shared keys are converted exactly (src/forward.cpp).
    chunk_rows_are_decode_rows = True

    def __init__(self, spec: DecoderSpec, lib: ctypes.CDLL, packed: bool = True):
        super().__init__(spec)
        _check_supported(spec)
        self.lib = lib
        self.packed = packed
        self.ropes = [RopeTables.compute(r.n_rot, r.base, r.max_pos, r.freq_factors, r.scaling) for r in spec.ropes]
        self._adapters: list[LoraAdapter] = []
        self._packed: dict[tuple[str, ...], list] = {}  # packed parts by weight names (kept across rebuilds)
        self._kv_desc: tuple[KVPool, abi.KV] | None = None  # (the pool, its description)
        self._state_desc: tuple[RecurrentPool, abi.States] | None = None  # likewise for recurrent state
        self._n_recurrent: int | None = None
        self.handle = None
        self._rebuild()
        lib.lp_set_threads(configured_threads())  # -t, else the default (lamplight.native.threads)
        self.threads = lib.lp_get_threads()
        self.kinds = sorted({self._kind(p) for p in self._parts()})
        self.one_row_reads: OneRowReads | None = None  # lamplight.native.prefetch's choice, once made

    def attach_loras(self, adapters: list[LoraAdapter]) -> LoraScales:
        """Describe the model again with the adapters' deltas on their linears (packed weights
        are reused)."""
        check_adapters(self.spec, adapters)
        routers = {layer.ffn.router.name for layer in self.spec.layers if isinstance(layer.ffn, ExpertsSpec)}
        adapted = sorted(name for adapter in adapters for name in adapter.weights if name in routers)
        if adapted:
            raise NativeUnsupported(f"LoRA adapters on a mixture-of-experts router ({adapted[0]})")
        self._adapters = list(adapters)
        self.lora_scales = LoraScales([0.0] * len(adapters))
        self._rebuild()
        return self.lora_scales

    def _rebuild(self) -> None:
        self._keep: list = []  # every array the C side points into
        config = self._describe_config()
        state_index = itertools.count()
        layers = (abi.Layer * len(self.spec.layers))(*(
            self._describe_layer(layer, next(state_index) if layer.recurrent is not None else None)
            for layer in self.spec.layers))
        if self.handle:
            self.lib.lp_model_free(self.handle)
        self._config, self._layers = config, layers
        self.handle = self.lib.lp_model_new(ctypes.byref(config), layers)
        self._has_loras = any(lin.n_loras for layer in layers for lin in self._layer_linears(layer))

    def describe(self) -> str:
        """The kernel set, for the start-up log and /props: e.g. 'native avx512vnni (w4, w8_32; 2 threads;
        decode rows read 4 column groups at once, prefetch 2 KiB ahead)'."""
        reads = self.one_row_reads
        said = f"; decode rows {describe_reads(reads)}" if reads is not None and reads != PLAIN_READS else ""
        return f"native {self.lib.lp_isa().decode()} ({', '.join(self.kinds)}; {self.threads} threads{said})"

    def weight_bytes(self) -> int:
        """Bytes of the weights the native forward reads (packed, plus dense norms and tables)."""
        return sum(t.nbytes for t in self._keep if isinstance(t, np.ndarray))

    def scratch_bytes(self) -> int:
        """Bytes of the forward's working buffers so far (they grow with the largest step)."""
        return self.lib.lp_model_scratch_bytes(self.handle)

    def new_state(self, num_tokens: int, k_dtype=None, v_dtype=None, device: str = "cpu",
                  n_sequences: int = 1) -> ModelState:
        """Numpy pools (the native forward computes on the CPU)."""
        if str(device) != "cpu":
            raise ValueError(f"the native forward keeps its state on the CPU, not on {device}")
        return ModelState.allocate(self.state_spec, num_tokens, k_dtype, v_dtype, n_sequences)

    def shift_kv(self, state: ModelState, src: Sequence[int], dst: Sequence[int], delta: int) -> None:
        """The keys re-rotated on numpy, as the PyTorch path rotates them (lamplight.native.context_shift)."""
        owners = [layer.attn for layer in self.spec.layers if layer.attn is not None and layer.attn.owns_kv]
        rotations = [None if a.rope is None else KeyRotation(self.ropes[a.rope], self.spec.ropes[a.rope].neox)
                     for a in owners]
        shift_kv(self.lib, state.kv, rotations, src, dst, delta)

    def __del__(self):
        handle = getattr(self, "handle", None)
        if handle:
            self.lib.lp_model_free(handle)

    # -- description -----------------------------------------------------------------------------

    def _hold(self, t: np.ndarray | None) -> int | None:
        return hold(self._keep, t)

    def _linear(self, infos: tuple[TensorInfo, ...], bias: np.ndarray | None = None) -> abi.Linear:
        """One native linear over weights reading the same input, outputs side by side."""
        names = tuple(i.name for i in infos)
        if names not in self._packed:
            self._packed[names] = pack_groups(list(infos)) if self.packed else [([i], None) for i in infos]
        lin = describe_linear(self._packed[names], bias, self._hold)
        self._attach_loras(lin, infos)
        return lin

    def _attach_loras(self, lin: abi.Linear, infos: tuple[TensorInfo, ...]) -> None:
        """The adapters' deltas on these weights, as native deltas on their columns."""
        loras, offset = [], 0
        for info in infos:
            for index, adapter in enumerate(self._adapters):
                if info.name not in adapter.weights:
                    continue
                a, b = adapter.weights[info.name]
                if a.shape[0] > abi.MAX_LORA_RANK:
                    raise NativeUnsupported(f"LoRA rank {a.shape[0]} is above {abi.MAX_LORA_RANK}")
                loras.append(abi.Lora(index, a.shape[0], offset, info.shape[0], adapter.factor(info.name), 0,
                                      self._hold(a), self._hold(b)))
            offset += info.shape[0]
        if loras:
            array = (abi.Lora * len(loras))(*loras)
            self._keep.append(array)
            lin.n_loras, lin.loras = len(loras), ctypes.cast(array, ctypes.POINTER(abi.Lora))

    @staticmethod
    def _layer_linears(layer: abi.Layer) -> list[abi.Linear]:
        linears = [layer.qkv, layer.wo, layer.gate_up, layer.down]
        if layer.recurrent:
            mixer = abi.Recurrent.from_address(layer.recurrent)
            linears += [mixer.in_proj, mixer.out]
        return linears

    def _parts(self):
        for layer in self._layers:
            for lin in self._layer_linears(layer):
                yield from lin.parts[: lin.n_parts]
        yield from self._config.head.parts[: self._config.head.n_parts]

    @staticmethod
    def _kind(part: abi.LinearPart) -> str:
        if part.dense:
            return {abi.DENSE_F16: "f16", abi.DENSE_BF16: "bf16"}.get(part.w.format, "f32")
        return {1: "w4", 2: "w8", 3: "w8_32", 4: "w6"}.get(part.w.format, f"format{part.w.format}")

    def _describe_config(self) -> abi.Config:
        spec, cfg, opts = self.spec, self.spec.config, self.spec.options
        c = abi.Config()
        c.n_layers, c.n_embd, c.n_heads, c.n_kv_heads = cfg.n_layers, cfg.n_embd, cfg.n_heads, cfg.n_kv_heads
        c.head_dim_k, c.head_dim_v, c.n_ff, c.vocab = cfg.head_dim_k, cfg.head_dim_v, cfg.n_ff, cfg.vocab_size
        c.rms_eps, c.attn_scale = cfg.rms_eps, spec.attn_scale
        c.activation, c.embd_scale = _ACTIVATIONS[opts.activation], opts.embd_scale
        c.residual_scale, c.logit_scale = opts.residual_scale, opts.logit_scale
        c.final_softcap = float(opts.final_softcap or 0.0)
        c.attn_softcap = float(opts.attn_softcap or 0.0)
        if opts.query_temperature is not None:
            t = opts.query_temperature
            c.qtemp_scale, c.qtemp_length, c.qtemp_offset = t.scale, float(t.length), t.offset
        first = spec.ropes[0]
        c.n_rot, c.rope_neox, c.rope_max_pos = first.n_rot, int(first.neox), first.max_pos
        for i, tables in enumerate(self.ropes):
            # A scaling's magnitude (YaRN) scales the rotated values: folded into the tables.
            c.rope_cos[i], c.rope_sin[i] = (self._hold(t) for t in tables.scaled())
        c.output_norm = self._hold(spec.output_norm)
        if spec.per_layer_inputs is not None:
            ple, pe = spec.per_layer_inputs, abi.PerLayerEmbedding()
            pe.size, pe.proj_norm = ple.size, self._hold(ple.proj_norm)
            pe.model_proj = self._linear(ple.model_proj.weights, ple.model_proj.bias)
            self._keep.append(pe)
            c.per_layer_embedding = ctypes.addressof(pe)
        head = spec.output.weights if spec.output is not None else (spec.token_embd,)  # tied: the embedding
        c.head = self._linear(head, spec.output_bias)
        return c

    def _describe_layer(self, spec: LayerSpec, state_index: int | None) -> abi.Layer:
        attn, ffn = spec.attn, spec.ffn
        layer = abi.Layer()
        if spec.recurrent is not None:
            layer.recurrent = self._recurrent(spec.recurrent, state_index)
        else:
            layer.qkv = self._linear(attn.qkv.weights, attn.qkv.bias)
            layer.wo = self._linear(attn.wo.weights, attn.wo.bias)
            layer.q_norm, layer.k_norm = self._hold(attn.q_norm), self._hold(attn.k_norm)
            head_dim = attn.heads.head_dim_k
            layer.qk_norm_whole = int(any(n is not None and n.size != head_dim for n in (attn.q_norm, attn.k_norm)))
            layer.rope = -1 if attn.rope is None else attn.rope  # -1: no rotation (NoPE layers)
            layer.window = attn.window or 0
            layer.sinks = self._hold(attn.sinks)
            layer.kv_layer, layer.output_gate = attn.kv_layer, int(attn.output_gate)
            self._describe_shape(layer, spec)
        if isinstance(ffn, FeedForwardSpec):
            layer.gate_up = self._linear(ffn.gate_up.weights, ffn.gate_up.bias)
            layer.down = self._linear(ffn.down.weights, ffn.down.bias)
        else:
            layer.moe = self._experts(ffn)
        layer.attn_norm, layer.ffn_norm = self._hold(spec.attn_norm), self._hold(spec.ffn_norm)
        layer.post_attn_norm, layer.post_ffn_norm = self._hold(spec.post_attn_norm), self._hold(spec.post_ffn_norm)
        layer.output_scale = spec.output_scale or 0.0
        if spec.per_layer_input is not None:
            pli, branch = spec.per_layer_input, abi.PerLayerInput()
            branch.inp_gate = self._linear(pli.inp_gate.weights, pli.inp_gate.bias)
            branch.proj = self._linear(pli.proj.weights, pli.proj.bias)
            branch.post_norm = self._hold(pli.post_norm)
            self._keep.append(branch)
            layer.per_layer_input = ctypes.addressof(branch)
        return layer

    def _describe_shape(self, layer: abi.Layer, spec: LayerSpec) -> None:
        """The layer's own KV heads, head size, FFN width and rotated dims where they are not
        the config's (gemma4), and how it gets its K/V."""
        cfg, attn = self.spec.config, spec.attn
        heads = attn.heads
        if (heads.n_kv_heads, heads.head_dim_k) != (cfg.n_kv_heads, cfg.head_dim_k):
            layer.n_kv_heads, layer.head_dim = heads.n_kv_heads, heads.head_dim_k
        if isinstance(spec.ffn, FeedForwardSpec) and spec.ffn.down.in_features != cfg.n_ff:
            layer.n_ff = spec.ffn.down.in_features
        ropes = self.spec.ropes
        if attn.rope is not None and ropes[attn.rope].n_rot != ropes[0].n_rot:
            layer.n_rot = ropes[attn.rope].n_rot
        layer.kv_flags = ((0 if attn.owns_kv else abi.LP_KV_SHARED) | (abi.LP_V_FROM_K if attn.value_from_key else 0)
                          | (abi.LP_V_NORM if attn.value_norm else 0))

    def _recurrent(self, spec: RecurrentSpec, state_index: int) -> int:
        """A recurrent mixer's description (its address); `state_index`: its place in the
        recurrent state pool."""
        mixer = abi.Recurrent()
        mixer.state = state_index
        mixer.channels, mixer.conv_kernel = spec.conv.shape
        mixer.in_proj = self._linear(spec.in_proj.weights, spec.in_proj.bias)
        mixer.out = self._linear(spec.out.weights, spec.out.bias)
        mixer.inner = spec.out.in_features
        mixer.conv = self._hold(spec.conv)
        if isinstance(spec, DeltaNetSpec):
            mixer.kind = abi.LP_MIX_DELTANET
            mixer.n_groups, mixer.n_heads, mixer.head_dim = spec.n_k_heads, spec.n_v_heads, spec.head_dim
        elif isinstance(spec, Mamba2Spec):
            mixer.kind = abi.LP_MIX_MAMBA2
            mixer.n_groups, mixer.n_heads, mixer.head_dim = spec.n_groups, spec.n_heads, spec.d_state
            mixer.conv_bias, mixer.d = self._hold(spec.conv_bias), self._hold(spec.d)
        else:
            mixer.kind = abi.LP_MIX_SHORTCONV
        if not isinstance(spec, ShortConvSpec):
            mixer.dt_bias, mixer.a = self._hold(spec.dt_bias), self._hold(spec.a)
            mixer.norm = self._hold(spec.norm.reshape(-1))
        self._keep.append(mixer)
        return ctypes.addressof(mixer)

    def _experts(self, ffn: ExpertsSpec):
        """A mixture-of-experts layer: the router in float32, each expert packed on its own."""
        ex = abi.Experts()
        ex.n_expert, ex.n_used, ex.n_ff = ffn.n_expert, ffn.n_used, ffn.gate.shape[1]
        ex.gating = abi.LP_GATING_SOFTMAX_SELECTED if ffn.gating == "softmax_selected" else abi.LP_GATING_SOFTMAX
        ex.normalize, ex.activation = int(ffn.normalize), _ACTIVATIONS[ffn.activation]
        ex.router = self._hold(dequantize(ffn.router))
        ex.router_bias = self._hold(ffn.router_bias)
        gate_up, down = (abi.Linear * ffn.n_expert)(), (abi.Linear * ffn.n_expert)()
        for e in range(ffn.n_expert):
            gate_up[e] = self._linear((_expert(ffn.gate, e), _expert(ffn.up, e)), _joint_expert_bias(ffn, e))
            down[e] = self._linear((_expert(ffn.down, e),), _row(ffn.down_bias, e))
        self._keep += [gate_up, down, ex]
        ex.gate_up = ctypes.cast(gate_up, ctypes.POINTER(abi.Linear))
        ex.down = ctypes.cast(down, ctypes.POINTER(abi.Linear))
        if ffn.shared is not None:
            shared = ffn.shared
            ex.shared_n_ff = shared.down.in_features
            shared_gate_up = self._linear(shared.gate_up.weights, shared.gate_up.bias)
            shared_down = self._linear(shared.down.weights, shared.down.bias)
            self._keep += [shared_gate_up, shared_down]
            ex.shared_gate_up, ex.shared_down = ctypes.pointer(shared_gate_up), ctypes.pointer(shared_down)
            ex.shared_gate = self._hold(ffn.shared_gate)
        return ctypes.pointer(ex)

    # -- one step --------------------------------------------------------------------------------

    def _kv(self, kv: KVPool) -> abi.KV:
        """The pool's description for the C side, made once per pool (an engine keeps one)."""
        if self._kv_desc is None or self._kv_desc[0] is not kv:
            layout = kv.layout
            shapes = [layout.shape(layer) for layer in range(len(kv.k))]
            expected = [a.kv_shape for layer in self.spec.layers if (a := layer.attn) is not None and a.owns_kv]
            if shapes != expected or layout != self.spec.state_spec.kv:
                raise ValueError(f"native forward: a KV pool of layout {layout}, the model's is {self.spec.state_spec.kv}")
            desc = kv_description(native_kv_type(kv.k_type), native_kv_type(kv.v_type), kv.k[0].shape[1], kv.k, kv.v)
            self._kv_desc = (kv, desc)
        return self._kv_desc[1]

    def step(self, chunks: Sequence[SequenceChunk], state: ModelState) -> np.ndarray:
        rows = batch_rows(chunks)
        return self._forward(rows, state, rows.logit_rows, self.config.vocab_size, self.lib.lp_forward_states,
                             loras=True)

    def run(self, chunks: Sequence[SequenceChunk], state: ModelState) -> torch.Tensor:
        """`step`'s logits (the same array) as a tensor."""
        import torch

        return torch.from_numpy(self.step(chunks, state))

    def run_batch(self, batch: ForwardBatch, state: ModelState) -> torch.Tensor:
        import torch

        rows = batch.host_rows()
        return torch.from_numpy(self._forward(rows, state, rows.logit_rows, self.config.vocab_size,
                                              self.lib.lp_forward_states, loras=True))

    def hidden_states(self, batch: ForwardBatch, state: ModelState) -> torch.Tensor:
        """Every row's final hidden states (after output_norm) [rows, n_embd] instead of logits:
        what an embedder pools. The LoRA adapters are left out: the engine sets their scales
        per step, and an embedding must not depend on which step came last. `state` is the
        caller's for this call only: the engine's pools stay described, and `state` is not kept."""
        import torch

        rows = batch.host_rows()
        every_row = np.arange(rows.token_ids.size, dtype=np.int64)
        described = self._kv_desc, self._state_desc
        try:
            return torch.from_numpy(self._forward(rows, state, every_row, self.config.n_embd,
                                                  self.lib.lp_forward_hidden, loras=False))
        finally:
            self._kv_desc, self._state_desc = described

    def _forward(self, rows: BatchRows, state: ModelState, logit_rows: np.ndarray, width: int, entry,
                 loras: bool) -> np.ndarray:
        """One call of `entry` (lp_forward_states or lp_forward_hidden): its output [logit rows, width]."""
        embd = embedding_rows(self.lib, self.spec.token_embd, rows.token_ids)
        given = _given_rows(rows, embd)
        key_ends = None if rows.key_ends is None else np.ascontiguousarray(rows.key_ends)
        key_offsets, key_slots = key_table(rows)
        positions, write_slots = np.ascontiguousarray(rows.positions), np.ascontiguousarray(rows.kv_write_slots)
        logit_rows = np.ascontiguousarray(logit_rows)
        n_rows = embd.shape[0]
        # The C side reads int64 [n_rows] arrays and float32 embeddings [n_rows, n_embd]: what it
        # cannot see (dtypes, lengths) is checked here; the values in them it checks itself.
        if (embd.dtype != np.float32 or not embd.flags.c_contiguous or embd.shape[1] != self.config.n_embd
                or any(a.dtype != np.int64 or a.size != n_rows for a in (positions, write_slots))
                or logit_rows.dtype != np.int64 or len(key_offsets) != n_rows
                or (key_ends is not None and (key_ends.dtype != np.int64 or key_ends.size != n_rows))):
            raise ValueError("native forward: the batch's arrays are not int64 [rows] (embeddings float32 [rows, n_embd])")
        ple = self.spec.per_layer_inputs
        per_layer_rows = None if ple is None else embedding_rows(self.lib, ple.token_embd, rows.token_ids)
        out = np.empty((logit_rows.size, width), dtype=np.float32)
        scales = self.step_lora_scales() if loras else None
        b = abi.Batch(n_rows=n_rows, n_logits=logit_rows.size, n_key_slots=key_slots.size,
                      n_lora_scales=0 if scales is None else scales.size, embeddings=_ptr(embd),
                      positions=_ptr(positions), write_slots=_ptr(write_slots), key_offsets=_ptr(key_offsets),
                      key_slots=_ptr(key_slots), logit_rows=_ptr(logit_rows), lora_scales=_ptr(scales),
                      key_ends=_ptr(key_ends), given_rows=_ptr(given), per_layer_rows=_ptr(per_layer_rows))
        pool = self._kv(state.kv)
        states = self._states(rows, state.recurrent) if self._recurrent_layers else None
        self.call_forward(entry, b, pool, states, _ptr(out))
        if states is not None:
            advance_states(rows, state.recurrent)
        return out

    def call_forward(self, entry, batch: abi.Batch, pool: abi.KV, states: abi.States | None, out: int) -> None:
        """One call of `entry` (lp_forward_states or lp_forward_hidden) on described arrays, its
        output written at address `out`; the C side's errors raised."""
        states_ref = None if states is None else ctypes.byref(states)
        rc = entry(self.handle, ctypes.byref(batch), ctypes.byref(pool), states_ref, out)
        if rc == abi.LP_ERR_UNSUPPORTED:
            raise NativeUnsupported(abi.last_error(self.lib)[1])
        if rc != abi.LP_OK:
            raise abi.error(self.lib, rc)  # ValueError naming the array, row and value out of range

    def step_lora_scales(self) -> np.ndarray | None:
        """The adapters' scales for a step, as the C side reads them (None: no adapter here)."""
        return np.asarray(self.lora_scales.scales, dtype=np.float32) if self._has_loras else None

    @property
    def _recurrent_layers(self) -> int:
        if self._n_recurrent is None:  # the spec's state_spec is built anew on each read
            self._n_recurrent = len(self.spec.state_spec.recurrent)
        return self._n_recurrent

    def _states(self, rows: BatchRows, pool: RecurrentPool | None) -> abi.States:
        """The recurrent pool's description with this step's row slots; each chunk's start is
        checked against its slot (as the PyTorch path checks it)."""
        if pool is None:
            raise ValueError("this model has recurrent layers: its state needs recurrent slots (new_state)")
        seen = set()
        for chunk in rows.chunks:
            pool.check_start(chunk.state_slot, chunk.start_pos)
            if chunk.state_slot in seen:
                raise ValueError(f"two chunks of one step on recurrent state slot {chunk.state_slot}")
            seen.add(chunk.state_slot)
        if self._state_desc is None or self._state_desc[0] is not pool:
            if pool.layouts != self.spec.state_spec.recurrent or any(
                    not _float32_rows(t) for t in (*pool.history, *pool.matrix) if t is not None):
                raise ValueError("native forward: a recurrent state pool not laid out for this model")
            self._state_desc = (pool, states_description(pool.n_sequences, pool.history, pool.matrix))
        desc = self._state_desc[1]
        slots = np.fromiter(itertools.chain.from_iterable([c.state_slot] * len(c.token_ids) for c in rows.chunks),
                            dtype=np.int64, count=rows.token_ids.size)
        set_row_slots(desc, slots)
        return desc


def _given_rows(rows: BatchRows, embd: np.ndarray) -> np.ndarray | None:
    """Writes the rows' given embeddings (images) into `embd`; their flags for the C side, which
    leaves them unscaled (None: no given rows)."""
    if rows.given_rows is None:
        return None
    embd[rows.given_rows] = rows.given_values
    flags = np.zeros(embd.shape[0], dtype=np.uint8)
    flags[rows.given_rows] = 1
    return flags


def _float32_rows(t) -> bool:
    """Whether a state array is contiguous float32, as the C side reads it: a numpy array, or a
    PyTorch tensor (the tests' shared pools), named by its dtype's name."""
    if isinstance(t, np.ndarray):
        return t.dtype == np.float32 and t.flags.c_contiguous
    return t.is_contiguous() and str(t.dtype) == "torch.float32"


def _check_supported(spec: DecoderSpec) -> None:
    """NativeUnsupported naming what the native forward does not compute."""
    cfg, opts = spec.config, spec.options
    if cfg.head_dim_k % 8 or cfg.head_dim_v % 8 or cfg.n_embd > abi.MAX_EMBD or cfg.head_dim_k > abi.MAX_HEAD_DIM:
        raise NativeUnsupported(f"head sizes {cfg.head_dim_k}/{cfg.head_dim_v} or width {cfg.n_embd}")
    activations = {opts.activation} | {layer.ffn.activation for layer in spec.layers}
    unknown = sorted(a for a in activations if a not in _ACTIVATIONS)
    if unknown:
        raise NativeUnsupported(f"the activation {', '.join(unknown)}")
    if len(spec.ropes) > 2 or len({r.neox for r in spec.ropes}) > 1:
        raise NativeUnsupported("two rope layouts")
    for i, layer in enumerate(spec.layers):
        ffn = layer.ffn
        if isinstance(ffn, ExpertsSpec) and (ffn.n_expert > abi.MAX_EXPERTS or ffn.n_used > abi.MAX_EXPERTS_USED):
            raise NativeUnsupported(f"{ffn.n_expert} experts, {ffn.n_used} used")
        _check_mixer(spec, i, layer)


def _check_mixer(spec: DecoderSpec, i: int, layer: LayerSpec) -> None:
    """What the native forward computes of a layer beyond the model-wide checks: attention with
    the model's query heads and key = value head sizes (its own KV heads, head size, rope, sliding
    window, shared K/V), any recurrent mixer of lamplight.models.spec, a shared expert of the
    routed experts' activation."""
    cfg = spec.config
    if isinstance(layer.ffn, ExpertsSpec) and layer.ffn.shared is not None and layer.ffn.shared.activation != layer.ffn.activation:
        raise NativeUnsupported(f"layer {i}: a shared expert of another activation")
    attn = layer.attn
    if attn is None:
        return
    h = attn.heads
    if h.n_heads != cfg.n_heads or h.head_dim_k != h.head_dim_v or h.head_dim_k % 8 or h.head_dim_k > abi.MAX_HEAD_DIM:
        raise NativeUnsupported(f"layer {i}: heads {h} (the model's query heads, key = value size, a multiple of 8)")
    if attn.output_gate and (not attn.owns_kv or attn.value_from_key):
        raise NativeUnsupported(f"layer {i}: an output gate on shared K/V or V from K")


def _expert(bank: TensorInfo, e: int) -> TensorInfo:
    """Expert e's slice of a 3-D expert tensor, as a 2-D weight (its rows of raw blocks)."""
    _, out, k = bank.shape
    return TensorInfo(f"{bank.name}[{e}]", bank.qtype, (out, k), bank.data[e * out:(e + 1) * out])


def _row(bias: np.ndarray | None, e: int) -> np.ndarray | None:
    return bias[e] if bias is not None else None


def _joint_expert_bias(ffn: ExpertsSpec, e: int) -> np.ndarray | None:
    gate, up = _row(ffn.gate_bias, e), _row(ffn.up_bias, e)
    if gate is None and up is None:
        return None
    zeros = np.zeros(ffn.gate.shape[1], dtype=np.float32)
    return np.concatenate([gate if gate is not None else zeros, up if up is not None else zeros])


def kv_description(k_type: int, v_type: int, pool_tokens: int, k: list, v: list) -> abi.KV:
    """The C side's view of a KV pool: K and V types (LP_KV_*), and each layer's K and V storage
    [n_kv_heads, pool_tokens, row] (numpy arrays or torch tensors), kept alive by the description."""
    n = len(k)
    desc = abi.KV(k_type=k_type, v_type=v_type, pool_tokens=pool_tokens, n_layers=n)  # the C side checks n
    desc._arrays = (k, v)
    desc._k = (ctypes.c_void_p * n)(*(_ptr(t) for t in k))
    desc._v = (ctypes.c_void_p * n)(*(_ptr(t) for t in v))
    desc.k = ctypes.cast(desc._k, ctypes.POINTER(ctypes.c_void_p))
    desc.v = ctypes.cast(desc._v, ctypes.POINTER(ctypes.c_void_p))
    return desc


def states_description(n_slots: int, history: list, matrix: list) -> abi.States:
    """The C side's view of a recurrent state pool: each recurrent layer's history [n_slots, K-1,
    channels] and matrix (None for a layer without one), float32 numpy arrays or torch tensors,
    kept alive by the description; the step's row slots are set_row_slots'."""
    desc = abi.States(n_layers=len(history), n_slots=n_slots)
    desc._arrays = (history, matrix)
    desc._history = (ctypes.c_void_p * len(history))(*(_ptr(t) for t in history))
    desc._matrix = (ctypes.c_void_p * len(matrix))(*(_ptr(t) for t in matrix))
    desc.history = ctypes.cast(desc._history, ctypes.POINTER(ctypes.c_void_p))
    desc.matrix = ctypes.cast(desc._matrix, ctypes.POINTER(ctypes.c_void_p))
    return desc


def set_row_slots(desc: abi.States, slots: np.ndarray) -> None:
    """Each row's recurrent state slot (int64 [rows]), kept alive by the description."""
    desc._row_slots = slots
    desc.n_rows, desc.row_slots = slots.size, _ptr(slots)


def key_table(batch: BatchRows) -> tuple[np.ndarray, np.ndarray]:
    """Each row's key slots in the pool: (offsets [T], slots); row r's key at position p is
    slots[offsets[r] + p]. A chunk's rows share its slot list (causality comes from positions)."""
    offsets, base = [], 0
    for chunk in batch.chunks:
        offsets.extend([base] * len(chunk.token_ids))
        base += len(chunk.kv_slots)
    slots = np.fromiter(itertools.chain.from_iterable(c.kv_slots for c in batch.chunks), dtype=np.int64, count=base)
    return np.asarray(offsets, dtype=np.int64), slots
