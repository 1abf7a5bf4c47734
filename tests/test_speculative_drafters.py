"""The n-gram drafters (lamplight.speculative): what each kind proposes from a history, as
llama.cpp's kinds do. Drafts decide speed only; the engine tests check that output never changes."""

from __future__ import annotations

import pytest

from lamplight.speculative import SpecConfig, SpecRequest, SpeculatorFactory, parse_kinds
from lamplight.speculative.config import NgramMapSizes, NgramModSizes, spec_config
from lamplight.speculative.speculator import DraftCap, Speculator
from lamplight.speculative.ngram import Drafter, NgramMap, NgramMod, NgramModTable, NgramSimple, TokenHistory

TEXT = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]


def test_history_searches_whole_tokens_only():
    """A byte match across token boundaries is no match (ids as int32 bytes)."""
    h = TokenHistory()
    h.sync([0x0100, 0x0002, 7, 0x0201, 9, 0x0100, 0x0002])
    assert h.last_occurrence(5, 2, 0, 4) == 0
    assert h.occurrences(5, 2, 0, 5) == [0, 5]
    h.sync([0x0100, 0x0002, 7, 0x0201, 9, 0x0100, 0x0002, 5])
    assert len(h) == 8 and h.span(6, 2) == [2, 5]


def test_ngram_simple_copies_what_followed_the_last_n_tokens():
    drafter = NgramSimple(NgramMapSizes(size_n=3, size_m=5))
    tokens = [0] + TEXT + [50, 60] + TEXT[:3]  # ... 1 2 3 again: what followed is 4 5 6 7 8
    drafter.begin(tokens[:10])
    assert drafter.draft(tokens, 16) == [4, 5, 6, 7, 8]
    assert drafter.draft(tokens, 2) == [4, 5]  # the step's limit
    assert NgramSimple(NgramMapSizes(size_n=3, size_m=5)).draft([0] + TEXT + [99, 98, 97], 16) == []


def test_ngram_simple_needs_n_tokens_after_the_match():
    """A match followed by fewer than n tokens drafts nothing; an earlier one followed by more does
    (a loop shorter than n tokens)."""
    drafter = NgramSimple(NgramMapSizes(size_n=3, size_m=8))
    assert drafter.draft([0, 1, 2, 3, 4, 5, 40, 41, 42, 43, 44, 45, 1, 2, 3], 16) == [4, 5, 40, 41, 42, 43, 44, 45][:8]
    # a loop of one token: the nearest occurrences are followed by 1 or 2 tokens; an earlier one by 3
    assert NgramSimple(NgramMapSizes(size_n=3, size_m=8)).draft([0] + [9] * 8 + [5] * 7, 16) == [5, 5, 5]
    assert NgramSimple(NgramMapSizes(size_n=3, size_m=8)).draft([0] + [9] * 8 + [5] * 6, 16) == []


def test_a_draft_stops_before_an_image_placeholder():
    drafter = NgramSimple(NgramMapSizes(size_n=2, size_m=6))
    tokens = [0, 7, 8, 20, 21, -1, -1, 22, 30, 31, 32, 33, 7, 8]
    assert drafter.draft(tokens, 16) == [20, 21]


def test_ngram_map_k_drafts_as_many_as_were_accepted_last_time():
    drafter = NgramMap(NgramMapSizes(size_n=2, size_m=4), values=False)
    tokens = [0, 1, 2, 3, 4, 5, 6, 40, 41, 42, 43, 44, 45, 46, 1, 2]
    assert drafter.draft(tokens, 16) == [3, 4, 5, 6]
    drafter.accepted(1)
    assert drafter.draft(tokens + [3, 9, 1, 2], 16) == [3]  # the same key: one token this time
    drafter.accepted(0)
    assert drafter.draft(tokens + [3, 9, 1, 2, 3, 9, 7, 1, 2], 16) == []


def test_ngram_map_k4v_drafts_the_clearly_most_frequent_value():
    sizes = NgramMapSizes(size_n=2, size_m=2, min_hits=1)
    often = [1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1, 2, 5, 6, 0]  # after 1 2: "3 4" twice, "5 6" once
    drafter = NgramMap(sizes, values=True)
    assert drafter.draft(often + [50, 51, 52, 53, 1, 2], 16) == [3, 4]
    tied = [1, 2, 3, 4, 0, 1, 2, 5, 6, 0]  # once each: no clear winner
    assert NgramMap(sizes, values=True).draft(tied + [50, 51, 52, 53, 1, 2], 16) == []
    picky = NgramMap(NgramMapSizes(size_n=2, size_m=2, min_hits=2), values=True)
    assert picky.draft(often + [50, 51, 52, 53, 1, 2], 16) == []  # the key's first hit
    assert picky.draft(often + [50, 51, 52, 53, 1, 2, 9, 9, 1, 2], 16) == [3, 4]


def test_ngram_mod_follows_the_shared_table_and_needs_n_min():
    table = NgramModTable(2)
    sizes = NgramModSizes(n_match=2, n_max=6, n_min=3)
    first = NgramMod(sizes, table)
    first.begin([1, 2, 3, 4, 5, 6, 7, 8])
    second = NgramMod(sizes, table)  # another sequence reads what the first added
    second.begin([90, 91])
    assert second.draft([90, 91, 1, 2], 16) == [3, 4, 5, 6, 7, 8]
    assert second.draft([90, 91, 1, 2], 4) == [3, 4, 5, 6]
    third = NgramMod(sizes, table)
    third.begin([90, 91])
    assert third.draft([90, 91, 6, 7], 16) == []  # a chain of 1 (8) is shorter than n_min


def test_ngram_mod_clears_the_table_after_poor_acceptance():
    table = NgramModTable(2)
    drafter = NgramMod(NgramModSizes(n_match=2, n_max=4, n_min=1), table)
    drafter.begin([1, 2, 3, 4, 5, 6])
    for _ in range(5):
        assert drafter.draft([1, 2, 3, 4, 5, 6, 1, 2], 16) == [3, 4, 5, 6]
        drafter.accepted(0)
    assert table.next == {}


def test_the_first_kind_that_drafts_wins_and_hears_the_result():
    config = SpecConfig(kinds=("ngram-simple", "ngram-map-k"), ngram_simple=NgramMapSizes(size_n=5, size_m=4),
                        ngram_map_k=NgramMapSizes(size_n=2, size_m=3))
    speculator = SpeculatorFactory(config).build(None)
    tokens = [0, 1, 2, 3, 4, 5, 6, 40, 41, 42, 43, 44, 45, 46, 1, 2]
    speculator.begin(tokens[:3])
    assert speculator.draft(tokens, 16) == [3, 4, 5]  # ngram-simple finds no 5-gram; map-k drafts
    assert speculator.last.kind == "ngram-map-k"
    speculator.accepted(3, 2)
    assert speculator.last.keys  # the map-k drafter kept the key's result


def test_the_draft_cap_follows_the_sequences_acceptance():
    """Drafts accepted whole double the cap; a rejection brings it to what was accepted plus two."""
    cap = DraftCap()
    assert cap.value == DraftCap.START == 8
    cap.update(8, 8)
    assert cap.value == 16
    cap.update(5, 5)  # a short draft accepted whole: no evidence for more
    assert cap.value == 16
    cap.update(16, 3)
    assert cap.value == 5
    cap.update(5, 0)
    assert cap.value == DraftCap.LEAST
    speculator = SpeculatorFactory(SpecConfig(kinds=("ngram-simple",), ngram_simple=NgramMapSizes(size_n=1, size_m=10))
                                   ).build(None)
    tokens = [0] + list(range(1, 30)) + [1]
    assert len(speculator.draft(tokens, 64)) == 8
    speculator.accepted(8, 1)
    assert len(speculator.draft(tokens, 64)) == 3


class FixedModelDrafter(Drafter):
    kind = "draft-simple"

    def _draft(self, limit: int) -> list[int]:
        return [7] * limit


def test_draft_model_drafts_rejected_whole_pause_drafting_longer_each_time():
    """A draft model's draft with nothing accepted pauses drafting 1 step, the next such 2, then
    4 ... up to PAUSE_MOST; an accepted token drafts on at once and starts the pauses over. The
    n-gram kinds (whose drafts cost only their rows) never pause."""
    ngram = SpeculatorFactory(SpecConfig(kinds=("ngram-simple",), ngram_simple=NgramMapSizes(size_n=1, size_m=10))
                              ).build(None)
    tokens = [0] + list(range(1, 30)) + [1]
    for _ in range(3):
        assert ngram.draft(tokens, 64)
        ngram.accepted(2, 0)
    speculator = Speculator([FixedModelDrafter()])

    def steps_until_a_draft() -> int:
        for waited in range(200):
            if speculator.limit(64) > 0:
                assert speculator.draft(tokens, 64)
                return waited
            assert speculator.draft(tokens, 64) == []
        raise AssertionError("no draft in 200 steps")

    assert steps_until_a_draft() == 0
    pauses = []
    for _ in range(9):
        speculator.accepted(2, 0)
        pauses.append(steps_until_a_draft())
    assert pauses == [1, 2, 4, 8, 16, 32, 64, 64, 64]
    speculator.accepted(2, 1)  # agreed once: no pause, and the next rejection pauses 1 step again
    assert steps_until_a_draft() == 0
    speculator.accepted(2, 0)
    assert steps_until_a_draft() == 1


def test_request_fields_choose_kinds_and_bound_drafts():
    factory = SpeculatorFactory(SpecConfig(kinds=("ngram-simple",)))
    assert factory.build(SpecRequest(kinds=())) is None
    assert factory.build(SpecRequest(n_max=0)) is None
    assert SpeculatorFactory(SpecConfig()).build(None) is None
    chosen = factory.build(SpecRequest(kinds=("ngram-mod", "ngram-map-k4v"), n_max=4, n_min=2))
    assert [d.kind for d in chosen.drafters] == ["ngram-mod", "ngram-map-k4v"]
    simple = SpeculatorFactory(SpecConfig(kinds=("ngram-simple",), ngram_simple=NgramMapSizes(size_n=2, size_m=8)))
    tokens = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 1, 2]
    assert simple.build(SpecRequest(n_max=3)).draft(tokens, 16) == [3, 4, 5]
    assert simple.build(SpecRequest(n_min=9)).draft(tokens, 16) == []  # 8 drafted, fewer than n_min
    # ngram-mod's table is one per server
    assert factory._drafter("ngram-mod").table is factory._drafter("ngram-mod").table


def test_kind_names_and_flag_settings():
    assert parse_kinds("ngram-simple, ngram-mod,ngram-simple") == ("ngram-simple", "ngram-mod")
    assert parse_kinds("none") == () and parse_kinds("") == ()
    assert parse_kinds("ngram-mod,draft-simple") == ("ngram-mod", "draft-simple")
    with pytest.raises(ValueError, match="draft-eagle3: not yet"):
        parse_kinds("draft-eagle3")
    with pytest.raises(ValueError, match="unknown speculative decoding type 'fast'"):
        parse_kinds("fast")
    config = spec_config({"kinds": ("ngram-simple",), "default": True, "ngram_map_k_size_n": 7,
                          "ngram_mod_n_match": 9})
    assert config.kinds == ("ngram-simple", "ngram-mod")
    assert config.ngram_map_k.size_n == 7 and config.ngram_mod == NgramModSizes()  # --spec-default's preset
    assert config.types_text() == "ngram-simple,ngram-mod" and SpecConfig().types_text() == "none"


def test_a_draft_model_drafts_unless_told_otherwise():
    """-md alone drafts with it (draft-simple); --spec-type decides where given; draft-simple
    without a draft model is refused, in the flags and in a request."""
    assert spec_config({"draft_model": "d.gguf"}).kinds == ("draft-simple",)
    assert spec_config({"draft_model": "d.gguf", "kinds": ()}).kinds == ()  # --spec-type none
    both = spec_config({"draft_model": "d.gguf", "kinds": ("ngram-mod", "draft-simple"), "draft_n_max": 5,
                        "draft_p_min": 0.5, "draft_cache_type_k": "q8_0"})
    assert both.kinds == ("ngram-mod", "draft-simple") and both.draft.n_max == 5 and both.draft.p_min == 0.5
    assert both.draft_cache_type_k == "q8_0" and both.draft_cache_type_v is None
    with pytest.raises(ValueError, match="draft-simple drafts with a draft model"):
        spec_config({"kinds": ("draft-simple",)})
    factory = SpeculatorFactory(SpecConfig(kinds=("ngram-simple",)))
    factory.check(SpecRequest(kinds=("ngram-mod",)))
    with pytest.raises(ValueError, match="started without one"):
        factory.check(SpecRequest(kinds=("draft-simple",)))
