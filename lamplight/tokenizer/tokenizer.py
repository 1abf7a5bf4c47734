"""The tokenizer the engine and the HTTP layer use: llama.cpp's token ids for GGUF vocabularies."""

from __future__ import annotations

import os
import re
import threading
from typing import Sequence

from lamplight.gguf.file import GGUFFile

from .decode import IncrementalDecoder, detokenize, token_piece
from .hf_model import build_hf_tokenizer
from .special import SpecialSplitter
from .vocab import Attr, Vocab, VocabType, load_vocab
from .wordpiece import WordPiece
from .wordpiece import token_piece as wordpiece_piece

_CONTROL = int(Attr.CONTROL)
_CONTROL_OR_UNKNOWN = int(Attr.CONTROL | Attr.UNKNOWN)

_SURROGATE = re.compile("[\ud800-\udfff]")


class Tokenizer:
    """Encodes like llama.cpp's `common_tokenize` and decodes like `common_detokenize`.

    The BPE/SPM merging runs in `tokenizers`; this class adds llama.cpp's special-token
    splitting, BOS/EOS and space-prefix rules, and its piece and detokenize semantics.
    """

    vocab_size: int
    bos_id: int | None
    eos_id: int | None
    eog_ids: frozenset[int]
    add_bos: bool
    add_eos: bool
    sep_id: int | None  # the separator of text pairs ([SEP] in WordPiece vocabularies)
    add_sep: bool
    fim_prefix_id: int | None
    fim_suffix_id: int | None
    fim_middle_id: int | None
    fim_rep_id: int | None  # repository-name marker of repo-level FIM (e.g. <reponame>)
    fim_sep_id: int | None  # file separator of repo-level FIM (e.g. <file_sep>)

    def __init__(self, vocab: Vocab):
        self._vocab = vocab
        # WordPiece (bert) is lamplight's own; SPM and BPE merge in `tokenizers`.
        self._wordpiece = WordPiece(vocab) if vocab.type is VocabType.WPM else None
        self._hf = build_hf_tokenizer(vocab) if self._wordpiece is None else None
        self._token_piece = wordpiece_piece if self._wordpiece is not None else token_piece
        self._splitter = SpecialSplitter(vocab)
        self._attrs: list[int] = vocab.attrs.tolist()
        self._pieces: list[bytes | None] = [None] * len(vocab.tokens)
        self.vocab_size = len(vocab.tokens)
        self.bos_id = vocab.ids["bos"]
        self.eos_id = vocab.ids["eos"]
        self.eog_ids = vocab.eog_ids
        self.add_bos = vocab.add_bos
        self.add_eos = vocab.add_eos
        self.sep_id = vocab.ids["sep"]
        self.add_sep = vocab.add_sep
        self.fim_prefix_id = vocab.ids["fim_pre"]
        self.fim_suffix_id = vocab.ids["fim_suf"]
        self.fim_middle_id = vocab.ids["fim_mid"]
        self.fim_rep_id = vocab.ids.get("fim_rep")
        self.fim_sep_id = vocab.ids.get("fim_sep")

    @property
    def vocab(self) -> Vocab:
        """The vocabulary as the GGUF file lists it (read it, do not change it)."""
        return self._vocab

    @classmethod
    def from_gguf(cls, gguf: GGUFFile) -> "Tokenizer":
        """Built once per file: Gemma's 262k-token vocabulary takes about a second to set up."""
        stat = os.stat(gguf.path)
        key = (os.path.realpath(gguf.path), stat.st_size, stat.st_mtime_ns)
        with _CACHE_LOCK:
            cached = _CACHE.get(key)
            if cached is None:
                cached = _CACHE[key] = cls(load_vocab(gguf.metadata))
        return cached

    # -- encoding -------------------------------------------------------------------------------

    def encode(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids of `text`. A lone UTF-16 surrogate (possible in a Python str, not in UTF-8
        text) is encoded as U+FFFD, the replacement character."""
        vocab = self._vocab
        if _SURROGATE.search(text):
            text = _SURROGATE.sub("\ufffd", text)
        if self._wordpiece is not None:
            return self._wordpiece.encode(self._splitter.split(text, parse_special), add_special)
        ids: list[int] = []
        if add_special and vocab.add_bos:
            ids.append(self.bos_id)  # type: ignore[arg-type]  # load_vocab checked it is set
        prev_was_special = True
        for fragment in self._splitter.split(text, parse_special):
            if isinstance(fragment, int):
                ids.append(fragment)
                prev_was_special = True
                continue
            if vocab.type is VocabType.SPM and vocab.add_space_prefix and prev_was_special:
                fragment = " " + fragment
            ids.extend(self._hf.encode(fragment, add_special_tokens=False).ids)
            prev_was_special = False
        if add_special and vocab.add_eos:
            ids.append(self.eos_id)  # type: ignore[arg-type]  # load_vocab checked it is set
        return ids

    # -- decoding -------------------------------------------------------------------------------

    def decode(self, ids: Sequence[int], special: bool = True) -> str:
        piece = self.token_bytes if special else self._visible_bytes
        return detokenize(self._vocab, list(ids), piece).decode("utf-8", "replace")

    def token_bytes(self, token_id: int) -> bytes:
        piece = self._pieces[self._checked(token_id)]
        if piece is None:
            piece = self._token_piece(self._vocab, token_id, self._attrs[token_id])
            self._pieces[token_id] = piece
        return piece

    def piece(self, token_id: int) -> str:
        return self._vocab.tokens[self._checked(token_id)]

    def is_control(self, token_id: int) -> bool:
        return bool(self._attrs[self._checked(token_id)] & _CONTROL)

    def new_decoder(self, special: bool = True) -> IncrementalDecoder:
        """A streaming decoder; special=False renders control tokens as nothing."""
        return IncrementalDecoder(self.token_bytes if special else self._visible_bytes)

    def _visible_bytes(self, token_id: int) -> bytes:
        if self._attrs[self._checked(token_id)] & _CONTROL_OR_UNKNOWN:
            return b""
        return self.token_bytes(token_id)

    def _checked(self, token_id: int) -> int:
        if not 0 <= token_id < self.vocab_size:
            raise ValueError(
                f"token id {token_id} is outside the vocabulary (size {self.vocab_size})"
            )
        return token_id


_CACHE: dict[tuple[str, int, int], Tokenizer] = {}
_CACHE_LOCK = threading.Lock()
