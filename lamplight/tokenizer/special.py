"""Splitting special-token texts out of the input, exactly as llama.cpp's
`tokenizer_st_partition` does it."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from .vocab import Attr, Vocab

# C's isspace() in the "C" locale, which llama.cpp uses for LSTRIP/RSTRIP.
_C_SPACE = " \t\n\v\f\r"
_SPECIAL = int(Attr.CONTROL | Attr.USER_DEFINED | Attr.UNKNOWN)
_PARSE_ONLY = int(Attr.CONTROL | Attr.UNKNOWN)
_LSTRIP, _RSTRIP = int(Attr.LSTRIP), int(Attr.RSTRIP)

Fragment = str | int  # raw text, or a token id already decided


@dataclass(frozen=True)
class SpecialToken:
    text: str
    id: int
    parse_only: bool  # CONTROL/UNKNOWN: matched only when parse_special is on
    lstrip: bool
    rstrip: bool


class SpecialSplitter:
    """llama.cpp takes the special tokens longest first (by UTF-8 length) and splits every
    remaining text fragment at each non-overlapping occurrence, left to right. That is not
    leftmost-longest matching: a longer token claims its text before a shorter one that starts
    earlier. User-defined tokens are split out even when parse_special is off."""

    def __init__(self, vocab: Vocab):
        ids = np.nonzero(vocab.attrs & _SPECIAL)[0]
        tokens = [
            _special_token(vocab.tokens[i], i, attr)
            for i, attr in zip(ids.tolist(), vocab.attrs[ids].tolist())
        ]
        tokens.sort(key=lambda t: (-len(t.text.encode("utf-8", "surrogateescape")), t.id))
        self._rank = {token.id: rank for rank, token in enumerate(tokens)}
        self._groups = _groups_by_first_char(tokens)
        self._always_groups = _groups_by_first_char([t for t in tokens if not t.parse_only])

    def split(self, text: str, parse_special: bool) -> list[Fragment]:
        fragments: list[Fragment] = [text] if text else []
        for token in self._occurring(text, parse_special):
            fragments = _split_on(fragments, token)
        return fragments

    def _occurring(self, text: str, parse_special: bool) -> list[SpecialToken]:
        groups = self._groups if parse_special else self._always_groups
        found = [
            token
            for char in set(text).intersection(groups)
            for token in groups[char].occurring_in(text, char)
        ]
        found.sort(key=lambda t: self._rank[t.id])
        return found


class _FirstCharGroup:
    """The special tokens that start with one character."""

    def __init__(self, tokens: list[SpecialToken]):
        self.tokens = tokens
        self.by_text = {t.text: t for t in tokens}
        self.lengths = sorted({len(t.text) for t in tokens})

    def occurring_in(self, text: str, char: str) -> list[SpecialToken]:
        # One substring search per token is cheap for a few tokens; for Gemma's 6000+ tokens
        # that start with "<" it is far cheaper to look up what follows each "<" in the text.
        lookups = text.count(char) * len(self.lengths)
        if lookups * _LOOKUP_VS_SCAN_COST > len(self.tokens) * len(text):
            return [t for t in self.tokens if t.text in text]
        found: dict[int, SpecialToken] = {}
        start = text.find(char)
        while start >= 0:
            for length in self.lengths:
                token = self.by_text.get(text[start : start + length])
                if token is not None:
                    found[token.id] = token
            start = text.find(char, start + 1)
        return list(found.values())


# A slice-and-dict lookup costs about as much as scanning a few hundred characters with `in`.
_LOOKUP_VS_SCAN_COST = 400


def _groups_by_first_char(tokens: list[SpecialToken]) -> dict[str, _FirstCharGroup]:
    by_char: dict[str, list[SpecialToken]] = defaultdict(list)
    for token in tokens:
        by_char[token.text[0]].append(token)
    return {char: _FirstCharGroup(group) for char, group in by_char.items()}


def _special_token(text: str, token_id: int, attr: int) -> SpecialToken:
    return SpecialToken(
        text=text,
        id=token_id,
        parse_only=bool(attr & _PARSE_ONLY),
        lstrip=bool(attr & _LSTRIP),
        rstrip=bool(attr & _RSTRIP),
    )


def _split_on(fragments: list[Fragment], token: SpecialToken) -> list[Fragment]:
    out: list[Fragment] = []
    for fragment in fragments:
        if isinstance(fragment, int) or token.text not in fragment:
            out.append(fragment)
            continue
        parts = fragment.split(token.text)
        for k, part in enumerate(parts):
            if k > 0:
                out.append(token.id)
                if token.rstrip:
                    part = part.lstrip(_C_SPACE)
            if token.lstrip and k < len(parts) - 1:
                part = part.rstrip(_C_SPACE)
            if part:
                out.append(part)
    return out
