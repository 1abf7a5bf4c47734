"""Random walks through a grammar: outputs a constrained model could produce, without a model.

Tokens are chosen uniformly among the allowed ones, with a bias toward ending (EOG when
allowed, closing quotes/brackets) so that walks finish in a few dozen tokens.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from .matcher import CompiledGrammar, GrammarMatcher, fill_masks
from .vocabulary import Vocabulary

CLOSING_BYTES = frozenset(b"\"]})")


@dataclass
class Walk:
    token_ids: list[int]
    complete: bool  # ended with EOG where the grammar allowed it


def closing_tokens(tokenizer) -> frozenset[int]:
    """Tokens made of closing characters only (e.g. `"}`, `]`)."""
    closing = []
    for token_id in range(tokenizer.vocab_size):
        text = tokenizer.token_bytes(token_id).strip()
        if text and set(text) <= CLOSING_BYTES and not tokenizer.is_control(token_id):
            closing.append(token_id)
    return frozenset(closing)


def random_walk(
    compiled: CompiledGrammar,
    rng: random.Random,
    closing: frozenset[int] = frozenset(),
    max_steps: int = 400,
) -> Walk:
    matcher = compiled.new_matcher()
    tokens: list[int] = []
    for _ in range(max_steps):
        token_id = choose_token(matcher, rng, closing)
        if not matcher.accept(token_id):
            raise AssertionError(f"the mask allowed token {token_id}, accept() refused it")
        if token_id in matcher.vocabulary.eog_ids:
            return Walk(tokens, True)
        tokens.append(token_id)
    return Walk(tokens, False)


def choose_token(matcher: GrammarMatcher, rng: random.Random, closing: frozenset[int]) -> int:
    mask = fill_masks([matcher], matcher.vocabulary.size)[0]
    return pick_token(mask, matcher.vocabulary, rng, closing)


def pick_token(mask: np.ndarray, vocabulary: Vocabulary, rng: random.Random,
               closing: frozenset[int], end_bias: float = 0.7) -> int:
    """A random allowed token from a mask row (modified in place)."""
    eog = [t for t in vocabulary.eog_ids if mask[t]]
    mask[list(vocabulary.eog_ids)] = False
    text = np.flatnonzero(mask)
    if not eog and not len(text):
        raise AssertionError("the mask allows nothing")
    if eog and (not len(text) or rng.random() < end_bias):
        return eog[0]
    if closing and rng.random() < 0.5:
        closers = [t for t in sorted(closing) if mask[t]]
        if closers:
            return rng.choice(closers)
    return int(text[rng.randrange(len(text))])
