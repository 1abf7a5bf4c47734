"""Our tokenizer described to llguidance: the bytes of every token, which ones are special."""

from __future__ import annotations

from dataclasses import dataclass

import llguidance

from .errors import GrammarError

# llguidance's convention: a special token's bytes start with 0xFF, which no UTF-8 text
# contains, so grammars over text never match control tokens.
SPECIAL_PREFIX = b"\xff"


@dataclass(frozen=True)
class Vocabulary:
    """What masks need besides llguidance: the tokenizer's size and its end-of-generation ids."""

    size: int
    eog_ids: tuple[int, ...]


class _TokenizerView:
    """The object `llguidance.TokenizerWrapper` expects."""

    def __init__(self, tokenizer, eog_ids: list[int]):
        self._tokenizer = tokenizer
        self.eos_token_id = eog_ids[0]
        self.bos_token_id = tokenizer.bos_id
        self.special_token_ids = [i for i in range(tokenizer.vocab_size) if tokenizer.is_control(i)]
        special = set(self.special_token_ids)
        self.tokens = [
            SPECIAL_PREFIX + tokenizer.token_bytes(i) if i in special else tokenizer.token_bytes(i)
            for i in range(tokenizer.vocab_size)
        ]

    def __call__(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise TypeError("text only")  # llguidance then passes str (its probe sends bytes)
        return self._tokenizer.encode(text, add_special=False, parse_special=False)


def build_vocabulary(tokenizer) -> tuple[llguidance.LLTokenizer, Vocabulary]:
    eog_ids = sorted(tokenizer.eog_ids) or [tokenizer.eos_id if tokenizer.eos_id is not None else 0]
    view = _TokenizerView(tokenizer, eog_ids)
    ll_tokenizer = llguidance.LLTokenizer(
        llguidance.TokenizerWrapper(view), n_vocab=tokenizer.vocab_size, eos_token=eog_ids
    )
    return ll_tokenizer, Vocabulary(tokenizer.vocab_size, tuple(eog_ids))


def token_resolver(tokenizer):
    """For GBNF's `<text>` token references: the text must be exactly one token."""

    def token_id(spelling: str) -> int:
        ids = tokenizer.encode(spelling, add_special=False, parse_special=True)
        if len(ids) != 1:
            raise GrammarError(f"invalid token '{spelling}'")
        return ids[0]

    return token_id
