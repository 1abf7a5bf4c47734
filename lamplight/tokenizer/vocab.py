"""The vocabulary as llama.cpp's `llama_vocab::load` sees it: token texts, attributes, special ids
and flags, with llama.cpp's defaults and its name-based fix-ups applied."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, IntFlag
from typing import Any, NamedTuple

import numpy as np


class VocabType(Enum):
    SPM = "llama"  # SentencePiece-style BPE over scores, byte fallback
    BPE = "gpt2"  # byte-level BPE over merges
    WPM = "bert"  # WordPiece (lamplight.tokenizer.wordpiece)


class Attr(IntFlag):
    """llama_token_attr bits."""

    UNDEFINED = 0
    UNKNOWN = 1 << 0
    UNUSED = 1 << 1
    NORMAL = 1 << 2
    CONTROL = 1 << 3
    USER_DEFINED = 1 << 4
    BYTE = 1 << 5
    LSTRIP = 1 << 7
    RSTRIP = 1 << 8


# GGUF tokenizer.ggml.token_type value -> attribute.
_TYPE_TO_ATTR = {
    0: Attr.UNDEFINED,
    1: Attr.NORMAL,
    2: Attr.UNKNOWN,
    3: Attr.CONTROL,
    4: Attr.USER_DEFINED,
    5: Attr.UNUSED,
    6: Attr.BYTE,
}


class PreSettings(NamedTuple):
    """What tokenizer.ggml.pre decides in llama.cpp."""

    regexes: str  # key into hf_model.PRE_TOKENIZER_REGEXES ("" for SPM: no pre-tokenizer)
    clean_spaces: bool  # detokenize removes " ?", " 's" etc.
    ignore_merges: bool  # a whole pre-token found in the vocab is taken as is
    add_bos: bool  # default when tokenizer.ggml.add_bos_token is absent


_SPM_SETTINGS = PreSettings("", clean_spaces=False, ignore_merges=False, add_bos=True)
_WPM_SETTINGS = PreSettings("", clean_spaces=True, ignore_merges=False, add_bos=True)
_PRE_TYPES: dict[str, PreSettings] = {
    "default": PreSettings("default", True, False, False),
    "llama3": PreSettings("llama3", True, True, True),
    "llama-v3": PreSettings("llama3", True, True, True),
    "llama-bpe": PreSettings("llama3", True, True, True),
    "smollm": PreSettings("smollm", False, False, False),
    "starcoder": PreSettings("smollm", True, False, False),
    "refact": PreSettings("smollm", True, False, False),
    "gpt2": PreSettings("gpt2", True, False, False),  # not a name llama.cpp knows; "gpt-2" is
    "gpt-2": PreSettings("gpt2", True, False, False),
    "qwen2": PreSettings("qwen2", False, False, False),
    "deepseek-r1-qwen": PreSettings("qwen2", False, False, False),
    "stablelm2": PreSettings("qwen2", True, False, False),
}

_EOT_NAMES = (
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
    "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>",
)
_EOM_NAMES = ("<|eom_id|>",)
_FIM_PRE_NAMES = (
    "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
    "<|code_prefix|>", "<|prefix|>",
)
_FIM_SUF_NAMES = (
    "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
    "<|code_suffix|>", "<|suffix|>",
)
_FIM_MID_NAMES = (
    "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
    "<|code_middle|>", "<|middle|>",
)
_FIM_PAD_NAMES = ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]")
_FIM_REP_NAMES = ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>")
_FIM_SEP_NAMES = ("<|file_sep|>",)
_EOG_NAMES = (
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "[e~[",
)
_ALWAYS_RENDERED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")

# Special ids in the order llama.cpp reads them; the deprecated keys come last and win.
_SPECIAL_ID_KEYS = (
    ("bos", "bos_token_id"), ("eos", "eos_token_id"), ("eot", "eot_token_id"),
    ("eom", "eom_token_id"), ("unk", "unknown_token_id"), ("sep", "seperator_token_id"),
    ("pad", "padding_token_id"), ("mask", "mask_token_id"),
    ("fim_pre", "fim_pre_token_id"), ("fim_suf", "fim_suf_token_id"),
    ("fim_mid", "fim_mid_token_id"), ("fim_pad", "fim_pad_token_id"),
    ("fim_rep", "fim_rep_token_id"), ("fim_sep", "fim_sep_token_id"),
    ("fim_pre", "prefix_token_id"), ("fim_suf", "suffix_token_id"), ("fim_mid", "middle_token_id"),
)
_DEFAULT_IDS = {
    VocabType.SPM: {"bos": 1, "eos": 2, "unk": 0},
    VocabType.BPE: {"bos": 11, "eos": 11},
    VocabType.WPM: {"bos": 101, "unk": 100, "sep": 102, "pad": 0, "mask": 103},
}


@dataclass
class Vocab:
    type: VocabType
    pre: PreSettings
    tokens: list[str]
    attrs: np.ndarray  # uint32 Attr bits per token
    scores: np.ndarray | None
    merges: list[str]
    ids: dict[str, int | None]  # bos, eos, eot, ..., fim_sep
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    eog_ids: frozenset[int] = frozenset()
    add_sep: bool = False  # a separator between the two texts of a pair (rerank), WordPiece's default
    lowercase: bool = True  # WordPiece normalisation (tokenizer.ggml.normalizer.*)
    strip_accents: bool = True

    def __post_init__(self) -> None:
        self.token_to_id = dict(zip(self.tokens, range(len(self.tokens))))
        if len(self.token_to_id) != len(self.tokens):
            raise ValueError("GGUF tokenizer: duplicate token texts in tokenizer.ggml.tokens")

    def id_of(self, text: str) -> int | None:
        return self.token_to_id.get(text)


def load_vocab(metadata: dict[str, Any]) -> Vocab:
    vocab_type = _vocab_type(metadata)
    if vocab_type is VocabType.BPE and "tokenizer.ggml.merges" not in metadata:
        raise ValueError("GGUF tokenizer: a gpt2 vocabulary needs tokenizer.ggml.merges")
    tokens = _token_texts(metadata)
    pre = _pre_settings(metadata, vocab_type)
    scores = metadata.get("tokenizer.ggml.scores")
    lowercase = bool(metadata.get("tokenizer.ggml.normalizer.lowercase", True))
    vocab = Vocab(
        type=vocab_type,
        pre=pre,
        tokens=tokens,
        attrs=_token_attrs(metadata, len(tokens)),
        scores=None if scores is None else np.asarray(scores, dtype=np.float32)[: len(tokens)],
        merges=list(metadata.get("tokenizer.ggml.merges", [])),
        ids=_special_ids(metadata, vocab_type, len(tokens)),
        add_bos=bool(metadata.get("tokenizer.ggml.add_bos_token", pre.add_bos)),
        add_eos=bool(metadata.get("tokenizer.ggml.add_eos_token", False)),
        add_space_prefix=bool(
            metadata.get("tokenizer.ggml.add_space_prefix", vocab_type is VocabType.SPM)
        ),
        add_sep=bool(metadata.get("tokenizer.ggml.add_sep_token", vocab_type is VocabType.WPM)),
        lowercase=lowercase,
        strip_accents=bool(metadata.get("tokenizer.ggml.normalizer.strip_accents", lowercase)),
    )
    _detect_by_name(vocab)
    vocab.eog_ids = _eog_ids(vocab)
    _check_add_special(vocab)
    return vocab


def _vocab_type(metadata: dict[str, Any]) -> VocabType:
    model = metadata.get("tokenizer.ggml.model")
    for vocab_type in VocabType:
        if model == vocab_type.value:
            return vocab_type
    supported = ", ".join(repr(t.value) for t in VocabType)
    raise ValueError(f"unsupported tokenizer.ggml.model {model!r} (supported: {supported})")


def _pre_settings(metadata: dict[str, Any], vocab_type: VocabType) -> PreSettings:
    if vocab_type is VocabType.SPM:
        return _SPM_SETTINGS
    if vocab_type is VocabType.WPM:
        return _WPM_SETTINGS
    name = metadata.get("tokenizer.ggml.pre") or "default"
    if name not in _PRE_TYPES:
        known = ", ".join(sorted(_PRE_TYPES))
        raise ValueError(f"unsupported tokenizer.ggml.pre {name!r} (supported: {known})")
    return _PRE_TYPES[name]


def _token_texts(metadata: dict[str, Any]) -> list[str]:
    tokens = metadata.get("tokenizer.ggml.tokens")
    if not tokens:
        raise ValueError("GGUF tokenizer: tokenizer.ggml.tokens is missing")
    if "" in tokens:
        # llama.cpp renames empty tokens so that every text maps to one id.
        tokens = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
    return list(tokens)


def _token_attrs(metadata: dict[str, Any], n: int) -> np.ndarray:
    types = metadata.get("tokenizer.ggml.token_type")
    if types is None:
        return np.full(n, int(Attr.NORMAL), dtype=np.uint32)
    table = np.zeros(max(_TYPE_TO_ATTR) + 1, dtype=np.uint32)
    for token_type, attr in _TYPE_TO_ATTR.items():
        table[token_type] = int(attr)
    types = np.asarray(types, dtype=np.int64)[:n]
    known = (types >= 0) & (types < len(table))
    return np.where(known, table[np.clip(types, 0, len(table) - 1)], np.uint32(Attr.UNDEFINED))


def _special_ids(metadata: dict[str, Any], vocab_type: VocabType, n: int) -> dict[str, int | None]:
    ids: dict[str, int | None] = {name: None for name, _ in _SPECIAL_ID_KEYS}
    for name, default in _DEFAULT_IDS[vocab_type].items():
        ids[name] = default if default < n else None
    for name, key in _SPECIAL_ID_KEYS:
        value = metadata.get(f"tokenizer.ggml.{key}")
        # llama.cpp reads the id as uint32, so a negative or out-of-range id keeps the default.
        if isinstance(value, (int, np.integer)) and 0 <= int(value) < n:
            ids[name] = int(value)
    return ids


def _detect_by_name(vocab: Vocab) -> None:
    """Fill eot/eom/fim ids the metadata lacks by their well-known texts, as llama.cpp does; a
    token found this way becomes CONTROL. llama.cpp walks a hash map, so which of several
    candidates wins is unspecified there; we take the lowest id."""
    for name, texts in (
        ("eot", _EOT_NAMES), ("eom", _EOM_NAMES), ("fim_pre", _FIM_PRE_NAMES),
        ("fim_suf", _FIM_SUF_NAMES), ("fim_mid", _FIM_MID_NAMES), ("fim_pad", _FIM_PAD_NAMES),
        ("fim_rep", _FIM_REP_NAMES), ("fim_sep", _FIM_SEP_NAMES),
    ):
        if vocab.ids[name] is not None:
            continue
        found = [i for i in map(vocab.id_of, texts) if i is not None]
        if found:
            vocab.ids[name] = min(found)
            vocab.attrs[min(found)] |= int(Attr.CONTROL)


def _eog_ids(vocab: Vocab) -> frozenset[int]:
    eog = {vocab.ids[k] for k in ("fim_pad", "fim_rep", "fim_sep") if vocab.ids[k] is not None}
    for text in _EOG_NAMES:
        token_id = vocab.id_of(text)
        if token_id is not None:
            eog.add(token_id)
            vocab.attrs[token_id] |= int(Attr.CONTROL)
    for text in _ALWAYS_RENDERED:
        token_id = vocab.id_of(text)
        if token_id is not None:
            vocab.attrs[token_id] = int(Attr.USER_DEFINED)
    eog.update(vocab.ids[k] for k in ("eos", "eot", "eom") if vocab.ids[k] is not None)
    _apply_eog_workarounds(vocab, eog)
    return frozenset(eog)


def _apply_eog_workarounds(vocab: Vocab, eog: set[int]) -> None:
    texts = {vocab.tokens[i]: i for i in eog}
    # gpt-oss (harmony) and solar-open: "<|end|>" ends a message, not the generation.
    has_call = "<|call|>" in texts or "<|calls|>" in texts
    if "<|end|>" in texts and has_call and ("<|return|>" in texts or "<|flush|>" in texts):
        eog.discard(texts["<|end|>"])
        vocab.attrs[texts["<|end|>"]] = int(Attr.USER_DEFINED)
    # gemma4 / paddleocr: "</s>" is an ordinary token there.
    if "<|tool_response>" in texts and "</s>" in texts:
        eog.discard(texts["</s>"])
        vocab.attrs[texts["</s>"]] = int(Attr.NORMAL)


def _check_add_special(vocab: Vocab) -> None:
    if vocab.add_bos and vocab.ids["bos"] is None:
        raise ValueError("GGUF tokenizer: add_bos_token is true, but bos_token_id is not set")
    if vocab.add_eos and vocab.ids["eos"] is None:
        raise ValueError("GGUF tokenizer: add_eos_token is true, but eos_token_id is not set")
