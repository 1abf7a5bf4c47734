"""The GGUF tokenizer against llama.cpp's own token ids (reference files from llama-server's
/tokenize endpoint) for SmolLM2 (gpt2 BPE, pre "smollm") and Gemma 3 (SPM, 262k tokens)."""

from __future__ import annotations

import random
import re
import time

import numpy as np
import pytest
from conftest import load_jsonl

from lamplight.gguf.file import GGUFFile
from lamplight.tokenizer import Tokenizer
from lamplight.tokenizer.decode import _clean_spaces
from lamplight.tokenizer.hf_model import _spm_merge_ids
from lamplight.tokenizer.vocab import load_vocab

pytestmark = pytest.mark.real_model

REFERENCE = {"smollm2": "smollm2.tokenize.jsonl", "gemma3": "gemma3.tokenize.jsonl"}


@pytest.fixture(scope="module")
def smollm2_gguf(smollm2_path) -> GGUFFile:
    return GGUFFile(smollm2_path)


@pytest.fixture(scope="module")
def gemma3_gguf(gemma3_path) -> GGUFFile:
    return GGUFFile(gemma3_path)


@pytest.fixture(scope="module")
def smollm2(smollm2_gguf) -> Tokenizer:
    return Tokenizer.from_gguf(smollm2_gguf)


@pytest.fixture(scope="module")
def gemma3(gemma3_gguf) -> Tokenizer:
    return Tokenizer.from_gguf(gemma3_gguf)


@pytest.fixture(params=sorted(REFERENCE))
def model(request) -> tuple[str, Tokenizer]:
    return request.param, request.getfixturevalue(request.param)


def reference_texts(name: str) -> list[str]:
    return list(dict.fromkeys(row["text"] for row in load_jsonl(REFERENCE[name])))


# -- encoding ---------------------------------------------------------------------------------


def test_encode_matches_llama_cpp_reference(model, capsys):
    name, tokenizer = model
    rows = load_jsonl(REFERENCE[name])
    mismatches = []
    for row in rows:
        ids = tokenizer.encode(row["text"], row["add_special"], row["parse_special"])
        if ids != row["ids"]:
            mismatches.append(
                f"{row['text']!r} add_special={row['add_special']} "
                f"parse_special={row['parse_special']}: got {ids}, llama.cpp {row['ids']}"
            )
    with capsys.disabled():
        agree = len(rows) - len(mismatches)
        print(f"\n{name}: {agree}/{len(rows)} tokenizations agree with llama.cpp")
    assert not mismatches, f"{len(mismatches)} mismatches:\n" + "\n".join(mismatches[:30])


def test_round_trip_of_every_reference_string(model):
    name, tokenizer = model
    failures = [
        (text, decoded)
        for text in reference_texts(name)
        if (decoded := tokenizer.decode(tokenizer.encode(text, False, False))) != text
    ]
    assert not failures, failures[:10]


def test_special_token_texts_map_to_their_ids(smollm2, gemma3):
    im_start = smollm2.encode("<|im_start|>", False)[0]
    assert smollm2.piece(im_start) == "<|im_start|>"
    assert smollm2.encode("<|im_start|>user", False) == [im_start, *smollm2.encode("user", False)]
    assert im_start not in smollm2.encode("<|im_start|>user", False, parse_special=False)

    assert gemma3.encode("<start_of_turn>user\nHi<end_of_turn>") == [2, 105, 2364, 107, 10979, 106]
    assert gemma3.piece(105) == "<start_of_turn>"
    assert 105 not in gemma3.encode("<start_of_turn>user", parse_special=False)


def test_user_defined_tokens_are_split_out_even_without_parse_special(gemma3):
    # Gemma's "\n" (107) and "<html>" are USER_DEFINED; llama.cpp matches those always.
    html = gemma3.encode("<html>", False, False)
    assert len(html) == 1 and gemma3.piece(html[0]) == "<html>"
    assert gemma3.encode("a\nb", False, False)[1] == 107


def test_bos_eos_flags(smollm2, gemma3):
    def flags(t: Tokenizer) -> tuple:
        return t.add_bos, t.add_eos, t.bos_id, t.eos_id

    assert flags(smollm2) == (False, False, 1, 2)
    assert flags(gemma3) == (True, False, 2, 1)
    assert smollm2.encode("") == [] and gemma3.encode("") == [2]
    assert gemma3.encode("Hi", add_special=False) == gemma3.encode("Hi")[1:]


def test_space_prefix_rule_for_spm(gemma3_gguf):
    """add_space_prefix (False for Gemma 3, True for Llama 2 style SPM): a space goes in front of
    the text and after every special token; detokenize drops the first token's space again."""
    metadata = dict(gemma3_gguf.metadata, **{"tokenizer.ggml.add_space_prefix": True})
    tokenizer = Tokenizer(load_vocab(metadata))
    ids = tokenizer.encode("Hello<end_of_turn>Hello", add_special=False)
    assert [tokenizer.piece(i) for i in ids] == ["▁Hello", "<end_of_turn>", "▁Hello"]
    assert tokenizer.decode(ids) == "Hello<end_of_turn> Hello"
    # With BOS first, the leading-space removal applies to BOS, so the space stays.
    assert tokenizer.decode([2, *ids]) == "<bos> Hello<end_of_turn> Hello"


# -- decoding ---------------------------------------------------------------------------------


def test_decode_without_special_drops_control_tokens(smollm2, gemma3):
    ids = smollm2.encode("<|im_start|>user\nHi<|im_end|>")
    assert smollm2.decode(ids) == "<|im_start|>user\nHi<|im_end|>"
    assert smollm2.decode(ids, special=False) == "user\nHi"
    ids = gemma3.encode("<start_of_turn>user\nHi<end_of_turn>")
    assert gemma3.decode(ids, special=False) == "user\nHi"
    assert gemma3.decode(ids) == "<bos><start_of_turn>user\nHi<end_of_turn>"


def test_token_bytes_and_pieces(smollm2, gemma3):
    assert gemma3.token_bytes(gemma3.encode("\U0001fae8", False)[0]) == b"\xf0"  # <0xF0>
    hello = gemma3.encode(" Hello", False)
    assert [gemma3.piece(i) for i in hello] == ["▁Hello"]
    assert gemma3.token_bytes(hello[0]) == b" Hello"
    smile = smollm2.encode("😀", False)
    assert [smollm2.piece(i) for i in smile] == ["ðŁ", "ĺ", "Ģ"]
    assert [smollm2.token_bytes(i) for i in smile] == [b"\xf0\x9f", b"\x98", b"\x80"]
    assert smollm2.token_bytes(smollm2.encode(" the", False)[0]) == b" the"  # "Ġthe"
    with pytest.raises(ValueError):
        smollm2.token_bytes(smollm2.vocab_size)


def test_incremental_decoder_equals_decode(model):
    name, tokenizer = model
    for row in load_jsonl(REFERENCE[name]):
        decoder = tokenizer.new_decoder()
        streamed = "".join(decoder.feed(i) for i in row["ids"]) + decoder.flush()
        assert streamed == tokenizer.decode(row["ids"]), row["text"]


@pytest.mark.parametrize(
    "name, text, parts",
    [
        ("gemma3", "\U0001fae8", 4),  # an emoji too new for Gemma's vocab: four byte tokens
        ("gemma3", "ᚠ", 3),  # a rune: three byte tokens
        ("smollm2", "😀", 3),  # byte-level pieces "ðŁ" "ĺ" "Ģ"
    ],
)
def test_incremental_decoder_holds_back_partial_characters(name, text, parts, request):
    tokenizer = request.getfixturevalue(name)
    ids = tokenizer.encode(text, add_special=False)
    assert len(ids) == parts
    decoder = tokenizer.new_decoder()
    assert [decoder.feed(i) for i in ids] == [""] * (parts - 1) + [text]
    assert decoder.flush() == ""


def test_incremental_decoder_flush_replaces_an_unfinished_character(gemma3):
    decoder = gemma3.new_decoder()
    ids = gemma3.encode("a\U0001fae8", add_special=False)
    assert decoder.feed(ids[0]) == "a" and decoder.feed(ids[1]) == ""
    assert decoder.flush() == "\ufffd"


def test_incremental_decoder_without_special(smollm2):
    decoder = smollm2.new_decoder(special=False)
    ids = smollm2.encode("<|im_start|>Hi<|im_end|>")
    assert "".join(map(decoder.feed, ids)) + decoder.flush() == "Hi"


# -- vocabulary facts ---------------------------------------------------------------------------


def test_end_of_generation_ids(smollm2, gemma3):
    def ids_of(tokenizer, *texts):
        return {tokenizer.encode(t, add_special=False)[0] for t in texts}

    assert ids_of(smollm2, "<|im_end|>", "<|endoftext|>") <= smollm2.eog_ids
    assert smollm2.eos_id in smollm2.eog_ids
    # llama.cpp also takes "<reponame>" as SmolLM2's FIM repo token, and FIM_REP ends generation.
    assert smollm2.eog_ids == ids_of(smollm2, "<|im_end|>", "<|endoftext|>", "<reponame>")
    # Gemma 3: <eos>, <end_of_turn>, and "</s>" (an HTML tag there, but on llama.cpp's EOG list).
    assert gemma3.eog_ids == ids_of(gemma3, "<eos>", "<end_of_turn>", "</s>")
    assert gemma3.is_control(106) and not gemma3.is_control(107)
    assert gemma3.fim_prefix_id is None and smollm2.fim_middle_id is None


def test_fim_ids_from_metadata_or_names(smollm2_gguf):
    metadata = dict(smollm2_gguf.metadata, **{"tokenizer.ggml.fim_pre_token_id": 5})
    tokenizer = Tokenizer(load_vocab(metadata))
    assert tokenizer.fim_prefix_id == 5
    tokens = list(metadata["tokenizer.ggml.tokens"])
    tokens[6:8] = ["<fim_suffix>", "<fim_middle>"]
    metadata["tokenizer.ggml.tokens"] = tokens
    vocab = load_vocab(metadata)
    assert (vocab.ids["fim_suf"], vocab.ids["fim_mid"]) == (6, 7)


def test_unknown_tokenizer_model_is_a_clear_error(smollm2_gguf):
    with pytest.raises(ValueError, match="tokenizer.ggml.model 'rwkv'"):
        load_vocab(dict(smollm2_gguf.metadata, **{"tokenizer.ggml.model": "rwkv"}))
    with pytest.raises(ValueError, match="tokenizer.ggml.pre 'nonesuch'"):
        load_vocab(dict(smollm2_gguf.metadata, **{"tokenizer.ggml.pre": "nonesuch"}))


@pytest.mark.parametrize(
    "pre, text, words",
    [
        ("smollm", "abc 12345 it's", ["abc", "Ġ", "1", "2", "3", "4", "5", "Ġit", "'s"]),
        ("gpt2", "abc 12345  x", ["abc", "Ġ12345", "Ġ", "Ġx"]),
        ("llama-bpe", "(abc 12345\n\nIT'S", ["(abc", "Ġ", "123", "45", "ĊĊ", "IT", "'S"]),
        ("qwen2", "abc 123", ["abc", "Ġ", "1", "2", "3"]),
        ("default", "a+b=1234", ["a", "+", "b", "=", "123", "4"]),
    ],
)
def test_pre_tokenizer_regexes(smollm2_gguf, pre, text, words):
    metadata = dict(smollm2_gguf.metadata, **{"tokenizer.ggml.pre": pre})
    tokenizer = Tokenizer(load_vocab(metadata))
    assert [w for w, _ in tokenizer._hf.pre_tokenizer.pre_tokenize_str(text)] == words
    assert tokenizer.decode(tokenizer.encode(text, False)) == text


def test_spm_merge_table_holds_every_split_best_score_first():
    rng = random.Random(3)
    words = {"".join(rng.choice("ab▁é") for _ in range(rng.randrange(1, 9))) for _ in range(3000)}
    words |= {"a" * 70, "a" * 64, "a" * 6, "b" * 80, "b" * 79}  # past the vectorized width
    tokens = sorted(words)
    scores = np.array([rng.random() for _ in tokens], dtype=np.float32)
    vocab = {t: i for i, t in enumerate(tokens)}
    left, right = _spm_merge_ids(tokens, scores, vocab)
    merges = [(tokens[a], tokens[b]) for a, b in zip(left.tolist(), right.tolist())]
    expected = {
        (t[:cut], t[cut:])
        for t in tokens
        for cut in range(1, len(t))
        if t[:cut] in vocab and t[cut:] in vocab
    }
    assert len(merges) == len(expected) and set(merges) == expected
    ranked = [scores[vocab[a + b]] for a, b in merges]
    assert ranked == sorted(ranked, reverse=True)


# -- detokenizer details ------------------------------------------------------------------------


def llama_cpp_clean_spaces(text: bytes) -> bytes:
    """A line-by-line transcription of llama.cpp's three clean_spaces passes, as an oracle."""
    buf = bytearray(text)
    total = len(buf)
    for apply_pass in (_pass_punctuation, _pass_lone_apostrophe, _pass_contractions):
        total = apply_pass(buf, total)
    return bytes(buf[:total])


def _pass_punctuation(t: bytearray, n: int) -> int:
    total = 1 if n else 0
    for i in range(1, n):
        x = t[i]
        if t[i - 1] == ord(" ") and x in b"?!.,":
            total -= 1
        t[total] = x
        total += 1
    return total


def _pass_lone_apostrophe(t: bytearray, n: int) -> int:
    total, i = (1 if n else 0), 1
    while i < n:
        x = t[i]
        if x == ord("'") and i + 1 < n and t[i - 1] == ord(" ") and t[i + 1] == ord(" "):
            total -= 1
            i += 1
            t[i] = 0
        t[total] = x
        total += 1
        i += 1
    return total


def _pass_contractions(t: bytearray, n: int) -> int:
    total = 1 if n else 0
    for i in range(1, n):
        x = t[i]
        if t[i - 1] == ord(" ") and x == ord("'") and i + 1 < n:
            x1 = t[i + 1]
            if x1 in b"sm" or (i + 2 < n and bytes(t[i + 1 : i + 3]) in (b"re", b"ve")):
                total -= 1
        t[total] = x
        total += 1
    return total


def test_clean_spaces_matches_llama_cpp_loops():
    rng = random.Random(7)
    for _ in range(3000):
        text = bytes(rng.choice(b" ' ?!.,smrevtdlx") for _ in range(rng.randrange(0, 14)))
        assert _clean_spaces(text) == llama_cpp_clean_spaces(text), text


# -- build time ---------------------------------------------------------------------------------


def test_gemma_build_time(gemma3_gguf, tmp_path, monkeypatch, capsys):
    """The merge table is derived once, then read from the cache (the timings are printed: speed
    is the benchmark's to judge, the test checks that the second build derives nothing)."""
    from lamplight.tokenizer import hf_model

    monkeypatch.setenv("LAMPLIGHT_CACHE", str(tmp_path))  # start without the merge-table cache
    timings, tokenizers = {}, {}
    for run in ("cold", "warm"):
        start = time.perf_counter()
        tokenizers[run] = Tokenizer(load_vocab(gemma3_gguf.metadata))
        timings[run] = time.perf_counter() - start
        # From now on the table must come from the cache: deriving it again fails the test.
        monkeypatch.setattr(hf_model, "_spm_merge_ids", lambda *args: pytest.fail("the merge table was derived again"))
    assert re.fullmatch(r"[0-9a-f]{40}\.npy", next((tmp_path / "tokenizers").iterdir()).name)
    assert tokenizers["warm"].vocab_size == 262144
    text = "Merge tables: the same tokens, cached or not."
    assert tokenizers["warm"].encode(text) == tokenizers["cold"].encode(text)
    with capsys.disabled():
        print(
            f"\ngemma3 tokenizer build (262144 tokens): {timings['cold']:.2f} s without the "
            f"merge-table cache, {timings['warm']:.2f} s with it"
        )
