"""logit_bias: parse the request field, and add the biases to the logits (always the first step)."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

FLOAT32_MAX = 3.4028234663852886e38
_INTEGER_KEY = re.compile(r"\s*[+-]?[0-9]+")  # what strtol reads whole, as llama.cpp parses object keys


class TextEncoder(Protocol):
    def encode(self, text: str, add_special: bool = False, parse_special: bool = False) -> list[int]: ...


def resolve_logit_bias(raw: Any, tokenizer: TextEncoder | None, n_vocab: int) -> list[tuple[int, float]]:
    """The request's `logit_bias` as (token_id, bias) pairs, bias -inf for a ban.

    Accepts llama.cpp's array form `[[id_or_string, bias_or_false], ...]` and OpenAI's object form
    `{"id or string": bias_or_false}`. A string is tokenized (no BOS, no special tokens) and the
    bias applies to each of its tokens. Integer ids outside [0, n_vocab) are ignored, as llama.cpp
    does. Entries llama.cpp would skip silently (wrong shapes, `true`, non-integer ids) raise
    ValueError here.
    """
    if raw is None:
        return []
    if isinstance(raw, dict):
        pairs = [(_key_as_token(key), value, f"logit_bias[{key!r}]") for key, value in raw.items()]
    elif isinstance(raw, (list, tuple)):
        pairs = [_array_entry(entry, index) for index, entry in enumerate(raw)]
    else:
        raise ValueError(f"logit_bias: expected an array of [token, bias] pairs or an object, got {type(raw).__name__}")
    resolved: list[tuple[int, float]] = []
    for token, value, where in pairs:
        bias = _bias_value(value, where)
        for token_id in _token_ids(token, tokenizer, where):
            if 0 <= token_id < n_vocab:
                resolved.append((token_id, bias))
    return resolved


def _array_entry(entry: Any, index: int) -> tuple[int | str, Any, str]:
    where = f"logit_bias[{index}]"
    if not (isinstance(entry, (list, tuple)) and len(entry) == 2):
        raise ValueError(f"{where}: expected a [token, bias] pair, got {entry!r}")
    token, value = entry
    if isinstance(token, bool) or not isinstance(token, (int, str)):
        raise ValueError(f"{where}: the token must be an integer id or a string, got {token!r}")
    return token, value, where


def _key_as_token(key: Any) -> int | str:
    if not isinstance(key, str):
        raise ValueError(f"logit_bias: object keys must be strings, got {key!r}")
    if key == "":
        raise ValueError("logit_bias: an empty key is neither a token id nor text")
    return int(key) if _INTEGER_KEY.fullmatch(key) else key


def _bias_value(value: Any, where: str) -> float:
    if value is False:
        return -math.inf
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where}: the bias must be a number or false (ban), got {value!r}")
    if math.isnan(value) or value == math.inf or (math.isfinite(value) and abs(value) > FLOAT32_MAX):
        # float32, as the logits: 1e308 would turn into inf there (and in the JSON echo).
        raise ValueError(f"{where}: the bias must be a finite float32 number (or false or -inf to ban), got {value!r}")
    return float(value)


def _token_ids(token: int | str, tokenizer: TextEncoder | None, where: str) -> list[int]:
    if isinstance(token, int):
        return [token]
    if tokenizer is None:
        raise ValueError(f"{where}: a text key needs a tokenizer")
    return list(tokenizer.encode(token, add_special=False, parse_special=False))


def apply_logit_bias(logits: np.ndarray, rows: Sequence[int], biases: Sequence[Sequence[tuple[int, float]]]) -> None:
    """Add each row's biases in place; repeated ids add up, ids outside the vocabulary are ignored."""
    add_entries(logits, *bias_entries(logits.shape[1], rows, biases))


def add_entries(logits: np.ndarray, index: tuple[np.ndarray, np.ndarray], values: list[float]) -> None:
    """logits[index] += values in place, in order, in the logits' precision (repeated entries add up)."""
    if values:
        np.add.at(logits, index, np.asarray(values, dtype=logits.dtype))


def bias_entries(n_vocab: int, rows: Sequence[int], biases: Sequence[Sequence[tuple[int, float]]]
                 ) -> tuple[tuple[np.ndarray, np.ndarray], list[float]]:
    """The (row, token) entries apply_logit_bias adds to, as an index of the logits, with the
    values in order: ids outside the vocabulary left out, repeated ids each an entry."""
    row_index: list[int] = []
    token_index: list[int] = []
    values: list[float] = []
    for row, entries in zip(rows, biases):
        for token, bias in entries:
            if 0 <= token < n_vocab:
                row_index.append(row)
                token_index.append(token)
                values.append(bias)
    return (np.asarray(row_index, dtype=np.intp), np.asarray(token_index, dtype=np.intp)), values
