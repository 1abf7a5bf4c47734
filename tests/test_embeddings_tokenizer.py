"""WordPiece (bert vocabularies) and the embedding inputs' tokens against llama-server's: every
/tokenize record and the token ids recorded for every embedded string and rerank pair."""

from __future__ import annotations

import pytest

from conftest import reference_params, reference_path
from lamplight.gguf.file import GGUFFile
from lamplight.tokenizer import Tokenizer
from lamplight.tokenizer.wordpiece import split_words

MODELS = ("bert", "nomic-bert", "bert-f32", "qwen3-embed", "gemma-embed")
EMBED_PATHS = ("/v1/embeddings", "/embedding", "/embeddings")


def _tokenizer(model: str) -> Tokenizer:
    return Tokenizer.from_gguf(GGUFFile(reference_path(f"embeddings/{model}.gguf")))


def _string_inputs(rows: list[dict], model: str) -> list:
    """(model, text, llama-server's ids) for each string input of an embedding request."""
    cases = []
    for row in rows:
        if row["path"] not in EMBED_PATHS or not row.get("tokens"):
            continue
        value = row["request"].get("input", row["request"].get("content"))
        values = [value] if isinstance(value, str) else value
        if any(isinstance(v, int) for v in values):
            continue  # one mixed prompt: the API tests cover it
        cases += [pytest.param(model, v, ids, id=f"{model}-{row['case']}-{i}")
                  for i, (v, ids) in enumerate(zip(values, row["tokens"])) if isinstance(v, str)]
    return cases


def _tokenize_records(rows: list[dict]) -> list:
    return [pytest.param(r["request"]["content"], [t["id"] for t in r["response"]["tokens"]],
                         [t["piece"] for t in r["response"]["tokens"]], id=f"tokenize-{i}")
            for i, r in enumerate(rows) if r["path"] == "/tokenize"]


@pytest.mark.parametrize("text,ids,pieces", reference_params("embeddings/bert.jsonl", _tokenize_records))
def test_wordpiece_matches_llama_tokenize(text, ids, pieces):
    tok = _tokenizer("bert")
    assert tok.encode(text) == ids
    # llama.cpp's pieces: control tokens as written, word starts with a leading space.
    assert [tok.token_bytes(i).decode("utf-8", "replace") for i in ids] == pieces


@pytest.mark.parametrize("model,text,ids", [
    case for model in MODELS
    for case in reference_params(f"embeddings/{model}.jsonl", lambda rows, m=model: _string_inputs(rows, m))
])
def test_embedding_inputs_tokenize_as_llama_server(model, text, ids):
    assert _tokenizer(model).encode(text, add_special=True, parse_special=True) == ids


def test_wordpiece_normalisation_rules():
    # Accents stripped to the first NFD code point, case folded, punctuation and ASCII symbols
    # split off, CJK one word per ideograph, other symbols kept inside words, controls dropped.
    assert split_words("Café naïve\u00a0RÉSUMÉ", True, True) == ["cafe", "naive", "resume"]
    assert split_words("a,b$c€d 中文\x07x", True, True) == ["a", ",", "b", "$", "c€d", "中", "文", "x"]
    assert split_words("Café", False, False) == ["Café"]
    assert split_words("e\u0301", True, True) == ["e"]  # a combining mark is dropped


def test_wordpiece_unknown_word_is_one_unk_and_specials_always_added():
    tok = _tokenizer("bert")
    unk, cls, sep = tok._wordpiece.unk_id, tok.bos_id, tok.sep_id
    assert tok.encode("") == [cls, sep]
    assert tok.encode("\u0416\u0416\u0416") == [cls, unk, sep]  # no piece for these letters
    assert tok.encode("the", add_special=False) == tok.encode("the")[1:-1]
