"""Speculative decoding's settings: the kinds (llama-server's `--spec-type` names) and their sizes.

The defaults are llama.cpp's (common/common.h, common_params_speculative): they are written here
once and read by the serve flags, the engine and the request parser.
"""

from __future__ import annotations

from dataclasses import dataclass, field

NONE = "none"
# The n-gram kinds look for the tokens that follow an earlier occurrence of the sequence's last
# n tokens (self-speculation); draft-simple asks a smaller model (--spec-draft-model).
NGRAM_KINDS = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod")
DRAFT_MODEL_KIND = "draft-simple"
# llama-server's other kinds: a model's own draft heads, or a lookup cache; refused with a reason.
HEAD_KINDS = ("draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark")
CACHE_KINDS = ("ngram-cache",)
ALL_KINDS = (NONE, DRAFT_MODEL_KIND, *HEAD_KINDS, *NGRAM_KINDS, *CACHE_KINDS)
NOT_YET = ("not yet: lamplight drafts with the n-gram kinds (" + ", ".join(NGRAM_KINDS) + ") and a draft model ("
           + DRAFT_MODEL_KIND + ")")
NO_DRAFT_MODEL = DRAFT_MODEL_KIND + " drafts with a draft model, and the server was started without one (-md)"

NGRAM_SIZE_LIMIT = 1024  # llama-server's bound on the n-gram sizes


@dataclass(frozen=True)
class NgramMapSizes:
    """ngram-simple, ngram-map-k, ngram-map-k4v: look up the last `size_n` tokens, draft the
    `size_m` that followed them; k4v drafts an m-gram seen after the key at least `min_hits` times."""

    size_n: int = 12
    size_m: int = 48
    min_hits: int = 1


@dataclass(frozen=True)
class NgramModSizes:
    """ngram-mod: a table (shared by the slots) of each `n_match`-gram's next token, followed
    from the sequence's last tokens for at most `n_max` tokens; a chain shorter than `n_min`
    is no draft."""

    n_match: int = 24
    n_max: int = 64
    n_min: int = 48


@dataclass(frozen=True)
class DraftModelSizes:
    """--spec-draft-n-max/-n-min/-p-min: a draft model's most and fewest tokens per draft, and the
    least probability (among its 10 likeliest tokens) of a drafted token."""

    n_max: int = 3
    n_min: int = 0
    p_min: float = 0.0


@dataclass(frozen=True)
class SpecConfig:
    """The server's speculative decoding: `kinds` tried in order (the first that drafts wins);
    empty: none."""

    kinds: tuple[str, ...] = ()
    ngram_simple: NgramMapSizes = field(default_factory=NgramMapSizes)
    ngram_map_k: NgramMapSizes = field(default_factory=NgramMapSizes)
    ngram_map_k4v: NgramMapSizes = field(default_factory=NgramMapSizes)
    ngram_mod: NgramModSizes = field(default_factory=NgramModSizes)
    draft: DraftModelSizes = field(default_factory=DraftModelSizes)
    draft_model: str | None = None  # -md: the draft model's path (kind draft-simple)
    draft_cache_type_k: str | None = None  # -ctkd/-ctvd; None: as the draft runner stores by default
    draft_cache_type_v: str | None = None
    # Drafts only where they pay, by the engine's own measurements (lamplight.engine.draft_policy);
    # False: every step drafts (the tests that count drafts of several sequences at once).
    adaptive: bool = True

    @property
    def enabled(self) -> bool:
        return bool(self.kinds)

    def types_text(self) -> str:
        return types_text(self.kinds)


@dataclass(frozen=True)
class SpecRequest:
    """A request's own speculative fields (`speculative.type`, `speculative.n_max`,
    `speculative.n_min`): kinds None are the server's; n_max caps each draft (None: the kind's
    own size), drafts shorter than n_min are not verified."""

    kinds: tuple[str, ...] | None = None
    n_max: int | None = None
    n_min: int = 0


def types_text(kinds: tuple[str, ...]) -> str:
    """As llama-server's generation_settings `speculative.types`: "none" or the kinds, comma-separated."""
    return ",".join(kinds) or NONE


def parse_kinds(text: str) -> tuple[str, ...]:
    """`--spec-type` / `speculative.type`: comma-separated kind names, "none" for none.
    ValueError naming an unknown kind, or a kind lamplight cannot draft with yet."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    kinds = []
    for name in names:
        if name not in ALL_KINDS:
            raise ValueError(f"unknown speculative decoding type {name!r} (one of {', '.join(ALL_KINDS)})")
        if name in HEAD_KINDS or name in CACHE_KINDS:
            raise ValueError(f"{name}: {NOT_YET}")
        if name != NONE and name not in kinds:
            kinds.append(name)
    return tuple(kinds)


def spec_config(values: dict) -> SpecConfig:
    """The SpecConfig of the serve flags' "spec" settings (lamplight.serve_flags: kinds, default,
    ngram_<kind>_size_n/_size_m/_min_hits, ngram_mod_n_match/_n_min/_n_max, draft_n_max/_n_min/_p_min,
    draft_model, draft_cache_type_k/_v). A draft model without --spec-type drafts (as llama-server
    did before its kinds were named); draft-simple without one: ValueError."""
    kinds = tuple(values.get("kinds") or ())
    draft_model = values.get("draft_model") or None
    if draft_model is not None and values.get("kinds") is None:
        kinds = (DRAFT_MODEL_KIND,)
    if DRAFT_MODEL_KIND in kinds and draft_model is None:
        raise ValueError("--spec-type: " + NO_DRAFT_MODEL)
    base_mod, base_draft = NgramModSizes(), DraftModelSizes()
    mod = NgramModSizes(values.get("ngram_mod_n_match", base_mod.n_match), values.get("ngram_mod_n_max", base_mod.n_max),
                        values.get("ngram_mod_n_min", base_mod.n_min))
    if values.get("default"):  # --spec-default: llama-server's ngram-mod preset
        kinds = (*kinds, "ngram-mod") if "ngram-mod" not in kinds else kinds
        mod = NgramModSizes()

    def sizes(name: str) -> NgramMapSizes:
        base = NgramMapSizes()
        return NgramMapSizes(values.get(f"ngram_{name}_size_n", base.size_n), values.get(f"ngram_{name}_size_m", base.size_m),
                             values.get(f"ngram_{name}_min_hits", base.min_hits))

    draft = DraftModelSizes(values.get("draft_n_max", base_draft.n_max), values.get("draft_n_min", base_draft.n_min),
                            values.get("draft_p_min", base_draft.p_min))
    return SpecConfig(kinds, sizes("simple"), sizes("map_k"), sizes("map_k4v"), mod, draft, draft_model,
                      values.get("draft_cache_type_k"), values.get("draft_cache_type_v"))
