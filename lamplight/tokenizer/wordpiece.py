"""WordPiece exactly as llama.cpp's `llm_tokenizer_wpm` (`tokenizer.ggml.model = "bert"`).

The vocabulary is the converter's: control tokens verbatim, word-initial pieces prefixed with
U+2581, continuation pieces without their `##`. Encoding: special tokens are split out first
(special.py, as for every vocabulary); each remaining text is normalised per code point
(accents, control characters, lower-casing) and cut into words at whitespace, punctuation,
ASCII symbols and CJK ideographs; each word is matched greedily, longest piece first, and
becomes `[UNK]` as a whole where some position matches nothing. `[CLS]` and `[SEP]` enclose the
result whenever specials are added, whatever the add_bos/add_eos keys say (llama.cpp).
"""

from __future__ import annotations

import unicodedata
from typing import Sequence

from .vocab import Attr, Vocab

WORD_START = "\u2581"

# What llama.cpp's unicode tables flag as whitespace (a word boundary, never part of a word).
_WHITESPACE = frozenset(
    [*map(chr, range(0x09, 0x0E)), " ", "\u0085", "\u00a0", "\u1680", *map(chr, range(0x2000, 0x200B)),
     "\u2028", "\u2029", "\u202f", "\u205f", "\u3000"]
)
_DROPPED_CATEGORIES = frozenset({"Cc", "Cf", "Co", "Cs"})
_MARK_CATEGORIES = frozenset({"Mn", "Mc", "Me"})
_DROPPED_CHARS = frozenset({"\u0000", "\ufffd"})
_CJK_RANGES = (
    (0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
    (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F),
)


def _is_cjk(cp: int) -> bool:
    return any(lo <= cp <= hi for lo, hi in _CJK_RANGES)


def _is_own_word(char: str) -> bool:
    """Punctuation, ASCII symbols ($ + < = > ^ ` | ~) and CJK ideographs are words of one
    character; other symbols (emoji, the euro sign) stay inside words."""
    category = unicodedata.category(char)
    cp = ord(char)
    return category[0] == "P" or (cp < 0x7F and category[0] == "S") or _is_cjk(cp)


def _first_nfd(char: str) -> str:
    """The first code point of the character's canonical decomposition (llama.cpp keeps only
    that one: é -> e, and a Hangul syllable -> its leading jamo)."""
    return unicodedata.normalize("NFD", char)[0]


def _lower(char: str) -> str:
    # Simple 1:1 lower-casing: where Python's full mapping gives several characters (only
    # U+0130 does), the first is the simple mapping.
    return char.lower()[0]


def split_words(text: str, lowercase: bool, strip_accents: bool) -> list[str]:
    """llama.cpp's WPM preprocess: the normalised words of `text`."""
    words: list[str] = []
    current: list[str] = []

    def end_word() -> None:
        if current:
            words.append("".join(current))
            current.clear()

    for char in text:
        if strip_accents:
            char = _first_nfd(char)
        if char in _WHITESPACE:
            end_word()
            continue
        category = unicodedata.category(char)
        if char in _DROPPED_CHARS or category in _DROPPED_CATEGORIES:
            continue
        if strip_accents and category in _MARK_CATEGORIES:
            continue
        if lowercase:
            char = _lower(char)
        if _is_own_word(char):
            end_word()
            words.append(char)
        else:
            current.append(char)
    end_word()
    return words


class WordPiece:
    """Greedy longest-match WordPiece over the vocabulary's token texts (as UTF-8 bytes)."""

    def __init__(self, vocab: Vocab):
        self.lowercase = vocab.lowercase
        self.strip_accents = vocab.strip_accents
        self._ids = {text.encode("utf-8", "surrogateescape"): i for i, text in enumerate(vocab.tokens)}
        self._window = max(map(len, self._ids)) + 1  # llama.cpp: the longest token's bytes + 1
        self.cls_id = _required(vocab, "bos", "[CLS] (tokenizer.ggml.bos_token_id)")
        self.sep_id = _required(vocab, "sep", "[SEP] (tokenizer.ggml.seperator_token_id)")
        self.unk_id = _required(vocab, "unk", "[UNK] (tokenizer.ggml.unknown_token_id)")

    def encode(self, fragments: Sequence[str | int], add_special: bool) -> list[int]:
        """Token ids of the fragments (texts, and special token ids already split out)."""
        ids = [self.cls_id] if add_special else []
        for fragment in fragments:
            if isinstance(fragment, int):
                ids.append(fragment)
                continue
            for word in split_words(fragment, self.lowercase, self.strip_accents):
                ids.extend(self.word_ids(word))
        if add_special:
            ids.append(self.sep_id)
        return ids

    def word_ids(self, word: str) -> list[int]:
        """One word's pieces; the whole word is [UNK] where some position matches no piece."""
        data = (WORD_START + word).encode("utf-8", "surrogateescape")
        ids: list[int] = []
        i, n = 0, len(data)
        while i < n:
            for j in range(min(n, i + self._window), i, -1):
                token_id = self._ids.get(data[i:j])
                if token_id is not None:
                    ids.append(token_id)
                    i = j
                    break
            else:
                return [self.unk_id]
        return ids or [self.unk_id]


def _required(vocab: Vocab, name: str, what: str) -> int:
    token_id = vocab.ids.get(name)
    if token_id is None:
        raise ValueError(f"GGUF tokenizer: a bert (WordPiece) vocabulary needs {what}")
    return token_id


def token_piece(vocab: Vocab, token_id: int, attr: int) -> bytes:
    """llama.cpp's token_to_piece for WPM: control, unknown and user-defined tokens as written,
    normal ones with U+2581 shown as a space, other kinds as nothing."""
    text = vocab.tokens[token_id]
    if attr & int(Attr.CONTROL | Attr.UNKNOWN | Attr.USER_DEFINED):
        return text.encode("utf-8", "surrogateescape")
    if attr & int(Attr.NORMAL):
        return text.replace(WORD_START, " ").encode("utf-8", "surrogateescape")
    return b""
