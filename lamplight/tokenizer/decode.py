"""Token ids back to text the way llama.cpp's `token_to_piece` and `detokenize` do it."""

from __future__ import annotations

import codecs
import re
from typing import Callable

from .hf_model import SPM_SPACE
from .vocab import Attr, Vocab, VocabType

# Plain ints: IntFlag arithmetic is slow, and pieces of the whole vocabulary get computed.
_RAW_TEXT = int(Attr.CONTROL | Attr.UNKNOWN | Attr.USER_DEFINED)
_NORMAL, _BYTE = int(Attr.NORMAL), int(Attr.BYTE)


def _gpt2_unicode_to_byte() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode: printable bytes stand for themselves, the other 68
    bytes were shifted to U+0100 and up."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    mapping = {chr(b): b for b in printable}
    shifted = (b for b in range(256) if b not in set(printable))
    for n, byte in enumerate(shifted):
        mapping[chr(256 + n)] = byte
    return mapping


_GPT2_CHAR_TO_BYTE = _gpt2_unicode_to_byte()


def token_piece(vocab: Vocab, token_id: int, attr: int) -> bytes:
    """llama.cpp's token_to_piece with special=True."""
    text = vocab.tokens[token_id]
    if attr & _RAW_TEXT:
        return _raw_bytes(text)
    if attr & _NORMAL:
        if vocab.type is VocabType.SPM:
            return _raw_bytes(text.replace(SPM_SPACE, " "))
        return _gpt2_decode(text)
    if attr & _BYTE:
        return bytes([int(text[3:5], 16)])
    return b""  # UNUSED / UNDEFINED tokens render as nothing


def _raw_bytes(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def _gpt2_decode(text: str) -> bytes:
    if all(char in _GPT2_CHAR_TO_BYTE for char in text):
        return bytes(map(_GPT2_CHAR_TO_BYTE.__getitem__, text))
    out = bytearray()
    for char in text:
        byte = _GPT2_CHAR_TO_BYTE.get(char)
        if byte is not None:
            out.append(byte)
        else:
            # llama.cpp's llama_decode_text marks characters outside the byte alphabet like this.
            out += b"[UNK_BYTE_0x" + _raw_bytes(char).hex().encode() + _raw_bytes(text) + b"]"
    return bytes(out)


def detokenize(vocab: Vocab, ids: list[int], piece: Callable[[int], bytes]) -> bytes:
    """llama_detokenize(remove_special=False, unparse_special=...) as common_detokenize calls it;
    `piece` renders control tokens as nothing when unparse_special is off."""
    out = bytearray()
    for position, token_id in enumerate(ids):
        text = piece(token_id)
        # With a space prefix added at encode time, the first token's leading space is dropped.
        if position == 0 and vocab.add_space_prefix and text.startswith(b" "):
            text = text[1:]
        out += text
    return _clean_spaces(bytes(out)) if vocab.pre.clean_spaces else bytes(out)


# llama.cpp's clean_spaces passes: " ?" " !" " ." " ,"; " ' "; " 's" " 'm" " 're" " 've".
_SPACE_BEFORE_PUNCT = re.compile(rb" (?=[?!.,])")
_SPACED_APOSTROPHE = re.compile(rb" ' ")
_SPACE_BEFORE_CONTRACTION = re.compile(rb" (?='(?:[sm]|re|ve))")


def _clean_spaces(text: bytes) -> bytes:
    text = _SPACE_BEFORE_PUNCT.sub(b"", text)
    text = _SPACED_APOSTROPHE.sub(b"'", text)
    return _SPACE_BEFORE_CONTRACTION.sub(b"", text)


class IncrementalDecoder:
    """Streams token pieces as text, holding back the bytes of a character that is not complete
    yet (llama-server does the same before it sends a chunk). Like llama-server's streaming, it
    concatenates raw pieces: no first-token space removal or clean_spaces."""

    def __init__(self, piece: Callable[[int], bytes]):
        self._piece = piece
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")

    def feed(self, token_id: int) -> str:
        return self._utf8.decode(self._piece(token_id))

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)
