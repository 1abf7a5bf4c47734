"""Configure a `tokenizers.Tokenizer` that reproduces llama.cpp's SPM and BPE tokenizers on text
that holds no special tokens (those are split out beforehand, see `special.py`)."""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator

import numpy as np
from tokenizers import Regex
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, normalizers, pre_tokenizers

from .cache import cached_array, vocab_key
from .vocab import Vocab, VocabType

SPM_SPACE = "\u2581"

# llama-vocab.cpp's pre-tokenizer regexes, applied one after the other, each splitting the pieces
# of the previous one (matches and the text between them both become pieces).
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3 = (
    _CONTRACTIONS
    + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    _CONTRACTIONS
    + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PRE_TOKENIZER_REGEXES: dict[str, tuple[str, ...]] = {
    "gpt2": (_GPT2,),
    "smollm": (r"\p{N}", _GPT2),
    "llama3": (_LLAMA3,),
    "qwen2": (_QWEN2,),
    "default": (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"),
}


def build_hf_tokenizer(vocab: Vocab) -> HFTokenizer:
    # The build allocates about a million small tuples; the cyclic GC would otherwise walk the
    # whole heap again and again meanwhile (none of them can form cycles).
    with _gc_paused():
        if vocab.type is VocabType.SPM:
            return _spm_tokenizer(vocab)
        return _bpe_tokenizer(vocab)


@contextmanager
def _gc_paused() -> Iterator[None]:
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _encodable_vocab(vocab: Vocab) -> dict[str, int]:
    if _is_valid_utf8("".join(vocab.tokens)):
        return vocab.token_to_id
    # Texts that are not valid UTF-8 (kept as surrogate escapes) can never match str input.
    return {t: i for t, i in vocab.token_to_id.items() if _is_valid_utf8(t)}


def _is_valid_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _spm_tokenizer(vocab: Vocab) -> HFTokenizer:
    """llama.cpp's SPM tokenizer merges the adjacent pair whose concatenation is the vocab entry
    with the highest score, leftmost first; with byte fallback for characters not in the vocab.
    That is BPE whose merge ranks follow the score of the merged token. (One corner differs in
    principle: two different splits of one token tie in llama.cpp and go leftmost first, while
    BPE ranks them; they can only compete in runs like "aaaa", and the reference ids agree.)"""
    hf_vocab = _encodable_vocab(vocab)
    model = models.BPE(
        vocab=hf_vocab,
        merges=_spm_merges(vocab.tokens, vocab.scores, hf_vocab),
        byte_fallback=True,
        fuse_unk=False,
    )
    tokenizer = HFTokenizer(model)
    tokenizer.normalizer = normalizers.Replace(" ", SPM_SPACE)
    return tokenizer


def _bpe_tokenizer(vocab: Vocab) -> HFTokenizer:
    hf_vocab = _encodable_vocab(vocab)
    model = models.BPE(
        vocab=hf_vocab,
        merges=_bpe_merges(vocab.merges, hf_vocab),
        ignore_merges=vocab.pre.ignore_merges,
    )
    splits = [
        pre_tokenizers.Split(Regex(pattern), behavior="isolated")
        for pattern in PRE_TOKENIZER_REGEXES[vocab.pre.regexes]
    ]
    tokenizer = HFTokenizer(model)
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    return tokenizer


def _bpe_merges(merges: list[str], hf_vocab: dict[str, int]) -> list[tuple[str, str]]:
    pairs = []
    for merge in merges:
        # llama.cpp splits at the first space after the first character.
        cut = merge.find(" ", 1)
        if cut < 0:
            continue
        left, right = merge[:cut], merge[cut + 1 :]
        if left in hf_vocab and right in hf_vocab and left + right in hf_vocab:
            pairs.append((left, right))
    return pairs


def _spm_merges(
    tokens: list[str], scores: np.ndarray | None, hf_vocab: dict[str, int]
) -> list[tuple[str, str]]:
    """Every split of every token into two vocab entries, best-scored result first."""
    if scores is None:
        scores = np.zeros(len(tokens), dtype=np.float32)
    key = vocab_key(tokens, scores)
    pairs = cached_array(key, lambda: _spm_merge_ids(tokens, scores, hf_vocab))
    texts_by_id = np.array(tokens, dtype=object)
    return list(zip(texts_by_id[pairs[0]].tolist(), texts_by_id[pairs[1]].tolist()))


def _spm_merge_ids(tokens: list[str], scores: np.ndarray, hf_vocab: dict[str, int]) -> np.ndarray:
    """(2, n_merges) left and right ids in merge-priority order.

    Checking 1.2M candidate splits of Gemma's 262k tokens one by one in Python takes seconds, so
    the splits are found with vectorized polynomial hashes of all prefixes and suffixes. The few
    very long tokens some vocabularies have are split in Python instead (a long token is never
    part of a shorter one, and the hash matrices grow with the longest token).
    """
    ids = np.fromiter(hf_vocab.values(), dtype=np.int64, count=len(hf_vocab))
    lengths = np.fromiter((len(tokens[i]) for i in ids.tolist()), dtype=np.int64, count=len(ids))
    short_ids = ids[lengths <= _MAX_VECTORIZED_LENGTH]
    target, left, right = _find_splits([tokens[i] for i in short_ids.tolist()])
    long_splits = _split_in_python(ids[lengths > _MAX_VECTORIZED_LENGTH].tolist(), tokens, hf_vocab)
    target_ids = np.concatenate([short_ids[target], long_splits[0]])
    left_ids = np.concatenate([short_ids[left], long_splits[1]])
    right_ids = np.concatenate([short_ids[right], long_splits[2]])
    # Higher score first; equal scores by target id, then by split position (lexsort is stable).
    order = np.lexsort((target_ids, -scores[target_ids].astype(np.float64)))
    return np.stack([left_ids[order], right_ids[order]]).astype(np.int32)


_MAX_VECTORIZED_LENGTH = 64


def _split_in_python(
    target_ids: list[int], tokens: list[str], hf_vocab: dict[str, int]
) -> np.ndarray:
    triples = [
        (token_id, hf_vocab[text[:cut]], hf_vocab[text[cut:]])
        for token_id in target_ids
        for text in (tokens[token_id],)
        for cut in range(1, len(text))
        if text[:cut] in hf_vocab and text[cut:] in hf_vocab
    ]
    return np.array(triples, dtype=np.int64).reshape(-1, 3).T


_HASH_BASE = np.uint64(0x100000001B3)


def _find_splits(texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(target, left, right) index triples with texts[left] + texts[right] == texts[target]."""
    empty = np.zeros(0, dtype=np.int64)
    if not texts:
        return empty, empty, empty
    lengths = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
    width = int(lengths.max())
    # One contiguous row per character position (column k holds every text's k-th code point).
    padded = np.array(texts, dtype=f"<U{width}").view(np.uint32).reshape(len(texts), width)
    columns = padded.T.copy()
    full = _full_hashes(columns, lengths)
    powers = np.ones(width + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for k in range(1, width + 1):
            powers[k] = powers[k - 1] * _HASH_BASE
    sorted_order = np.argsort(full, kind="stable")
    sorted_full = full[sorted_order]

    found = []
    prefix = np.zeros(len(texts), dtype=np.uint64)
    for cut in range(1, width):
        prefix = _extend_hash(prefix, columns[cut - 1])
        rows = np.nonzero(lengths > cut)[0]
        left = _lookup(sorted_full, sorted_order, prefix[rows])
        rows, left = rows[left >= 0], left[left >= 0]
        right_hash = full[rows] - prefix[rows] * powers[lengths[rows] - cut]
        right = _lookup(sorted_full, sorted_order, right_hash)
        rows, left, right = rows[right >= 0], left[right >= 0], right[right >= 0]
        # A hash collision would have to agree on both lengths as well.
        ok = (lengths[left] == cut) & (lengths[right] == lengths[rows] - cut)
        found.append((rows[ok], left[ok], right[ok]))
    if not found:  # no text longer than one character
        return empty, empty, empty
    return tuple(np.concatenate(parts) for parts in zip(*found))  # type: ignore[return-value]


def _extend_hash(hashes: np.ndarray, column: np.ndarray) -> np.ndarray:
    # Code points enter as cp + 1 so that a real U+0000 differs from the zero padding.
    return hashes * _HASH_BASE + (column.astype(np.uint64) + np.uint64(1))


def _full_hashes(columns: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    full = np.zeros(len(lengths), dtype=np.uint64)
    running = np.zeros(len(lengths), dtype=np.uint64)
    for k, column in enumerate(columns):
        running = _extend_hash(running, column)
        done = lengths == k + 1
        full[done] = running[done]
    return full


def _lookup(sorted_keys: np.ndarray, order: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Index of each key among the texts, or -1."""
    # searchsorted is markedly faster on sorted needles (memory locality).
    needle_order = np.argsort(keys)
    pos = np.empty(len(keys), dtype=np.int64)
    pos[needle_order] = np.searchsorted(sorted_keys, keys[needle_order])
    pos = np.minimum(pos, len(sorted_keys) - 1)
    return np.where(sorted_keys[pos] == keys, order[pos], -1)
