"""The sampler chain against llama.cpp's own samplers (reference/samplers.jsonl, see samplers.md).

Each case's candidates become one vocab-sized row (the case's ids get their logits, every other
id is -inf), run through lamplight's batched chain; the surviving (finite) entries are read back
and compared with llama.cpp's output as sets keyed by id: logits and, for the samplers that
write them, p values within 1e-4 (the largest deviations seen are printed by the summary test).
lamplight keeps no array order: where llama.cpp's output is sorted, the test checks that the
survivors sorted by logit give the same logit sequence.

lamplight keeps no `p` between samplers: a sampler that needs probabilities takes the softmax
of the current candidates, and the draw renormalizes. So llama.cpp's stale `p` (left by an earlier
step) and its unrenormalized `p` after top_p/typical/XTC have no counterpart; `p` is compared only
where the sampler writes it, as the softmax of the candidates before (top_p, typical, XTC) or
after (temp_ext, mirostat) the step. Mirostat's `selected` is compared only where it does not
depend on llama.cpp's RNG (one survivor).

Deliberate deviations (see the package docstring) are listed in KNOWN_DEVIATIONS and checked
against the fixed semantics instead. The C API's `last_n = -1` (penalties, DRY) means "off"
there but "context size" in requests, so those cases are run with 0.
"""

from __future__ import annotations

import math
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

from conftest import load_jsonl
from lamplight.sampling import SamplingParams, SequenceSampler, run_chain, sample_batch
from lamplight.sampling.dry import BreakerTable, DryState, apply_dry

TOL = 1e-4

# Neutral parameters: every sampler off; each case switches on what it tests.
NEUTRAL = dict(
    samplers=[], temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, typical_p=1.0, repeat_penalty=1.0, seed=0
)

KNOWN_DEVIATIONS = {
    "typical/019": "llama.cpp's entropy is NaN when a -inf candidate is in its array (0 * log 0), which turns "
    "typical into a plain cumulative cut; lamplight skips -inf candidates in the entropy (fix)",
    "temp_ext/006": "llama.cpp's max entropy log(size) counts -inf entries; lamplight counts finite candidates (fix)",
    "temp_ext/009": "same as temp_ext/006",
    "temp_ext/015": "same as temp_ext/006",
    "temp_ext/018": "same as temp_ext/006",
    "temp/011": "equal maxima under greedy: llama.cpp keeps the first in its array's order (here a shuffled "
    "one); lamplight keeps the lowest id, which is llama-server's array order unless a sorting sampler ran",
    "logit_bias/004": "llama.cpp adds only the first of duplicate ids when the array is not in vocab order; "
    "llama-server's array always is, and duplicates add up (as in logit_bias/003), which lamplight always does",
}
STEP_NAMES = {"typical": "typ_p", "temp": "temperature", "temp_ext": "temperature"}
WRITES_P_BEFORE = {"top_p", "typical", "xtc"}  # p = softmax of the candidates before the step


def f32(value) -> float:
    return float(np.float32(float(value)))


@dataclass
class Outcome:
    case: str
    status: str  # "match", "skip" or "mismatch"
    detail: str = ""
    deviations: dict[str, float] = field(default_factory=dict)


class FakeTokenizer:
    """The DRY cases' `pieces` as a vocabulary; encode is greedy longest match (unknown text gets
    id -1, which no history holds, so breaker tails made of it never match)."""

    def __init__(self, pieces: dict[str, str]) -> None:
        self.texts = {int(token): text for token, text in pieces.items()}
        self.n_vocab = max(self.texts) + 1
        self._by_text = {text: token for token, text in self.texts.items()}

    def token_bytes(self, token_id: int) -> bytes:
        return self.texts.get(token_id, "").encode("utf-8")

    def encode(self, text: str, add_special: bool = False, parse_special: bool = False) -> list[int]:
        ids, start = [], 0
        while start < len(text):
            for end in range(len(text), start, -1):
                if text[start:end] in self._by_text:
                    ids.append(self._by_text[text[start:end]])
                    start = end
                    break
            else:
                ids.append(-1)
                start += 1
        return ids


def vocab_size(case: dict) -> int:
    steps = case["params"]["steps"] if case["sampler"] == "chain" else [case]
    for step in steps:
        if "n_vocab" in step["params"]:
            return step["params"]["n_vocab"]
    return max(token for token, _ in case["input"]) + 1


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
DEVICE = "cpu"  # where the rows given to the chain are; the device tests switch it


def input_row(case: dict, n_vocab: int) -> np.ndarray:
    row = np.full((1, n_vocab), -math.inf, dtype=np.float32)
    for token, logit in case["input"]:
        row[0, token] = f32(logit)
    return row


def given(row: np.ndarray):
    """The row as the chain gets it: numpy, or a torch tensor on DEVICE (a library user's)."""
    return row if DEVICE == "cpu" else torch.from_numpy(row).to(DEVICE)


def finite_entries(row: np.ndarray) -> dict[int, float]:
    ids = np.flatnonzero(np.isfinite(row[0]))
    return dict(zip(ids.tolist(), row[0, ids].tolist()))


def softmax_of(row: np.ndarray) -> dict[int, float]:
    """The float64 softmax of the row's finite entries."""
    values = row[0].astype(np.float64)
    weights = np.exp(values - values.max())
    probs = weights / weights.sum()
    return {token: float(probs[token]) for token in finite_entries(row)}


def step_params(sampler: str, p: dict) -> dict:
    """SamplingParams fields for one llama.cpp sampler with the C API's parameters."""
    if sampler == "top_k":
        return dict(samplers=["top_k"], top_k=p["k"])
    if sampler == "top_p":
        return dict(samplers=["top_p"], top_p=p["p"], min_keep=p["min_keep"])
    if sampler == "min_p":
        return dict(samplers=["min_p"], min_p=p["p"], min_keep=p["min_keep"])
    if sampler == "typical":
        return dict(samplers=["typ_p"], typical_p=p["p"], min_keep=p["min_keep"])
    if sampler == "temp":
        # lamplight rejects a negative temperature (llama-server HEAD clamps it to 0); both are greedy.
        return dict(samplers=["temperature"], temperature=max(p["t"], 0.0))
    if sampler == "temp_ext":
        return dict(
            samplers=["temperature"], temperature=p["t"], dynatemp_range=p["delta"], dynatemp_exponent=p["exponent"]
        )
    if sampler == "xtc":
        return dict(
            samplers=["xtc"],
            xtc_probability=p["probability"],
            xtc_threshold=p["threshold"],
            min_keep=p["min_keep"],
            seed=p["seed"],
        )
    if sampler == "top_n_sigma":
        return dict(samplers=["top_n_sigma"], top_n_sigma=p["n"])
    if sampler == "penalties":
        # At the C API -1 is clamped to 0 (off); in lamplight's requests -1 means the context size.
        return dict(
            samplers=["penalties"],
            repeat_last_n=max(p["last_n"], 0),
            repeat_penalty=p["repeat"],
            frequency_penalty=p["freq"],
            presence_penalty=p["present"],
        )
    if sampler == "dry":
        return dict(
            samplers=["dry"],
            dry_multiplier=p["multiplier"],
            dry_base=p["base"],
            dry_allowed_length=p["allowed_length"],
            dry_penalty_last_n=max(p["penalty_last_n"], 0),  # -1 is off at the C API, as above
            dry_sequence_breakers=p["breakers"] or ["\n"],  # [] is handled by the caller
        )
    if sampler == "logit_bias":
        return dict(logit_bias=[(token, float(bias)) for token, bias in p["biases"]])
    if sampler == "mirostat_v2":
        return dict(mirostat=2, mirostat_tau=p["tau"], mirostat_eta=p["eta"], seed=p["seed"])
    raise AssertionError(f"unknown sampler {sampler}")


def make_sampler(case: dict, fields: dict, tokenizer=None) -> SequenceSampler:
    if tokenizer is None and "pieces" in case:
        tokenizer = FakeTokenizer(case["pieces"])
    params = SamplingParams(**{**NEUTRAL, **fields})
    sampler = SequenceSampler(params, tokenizer=tokenizer, n_ctx=4096)
    sampler.accept_many(case.get("history", []))
    return sampler


def compare_state(
    sampler: str,
    expected: list,
    before: np.ndarray,
    after: np.ndarray,
    *,
    cut_in_tie: bool,
    is_sorted: bool,
    writes_p: bool,
    removed_from_front: int | None = None,
) -> tuple[list[str], dict[str, float]]:
    """Problems found comparing lamplight's row `after` with llama.cpp's output array."""
    problems: list[str] = []
    deviations = {"logit": 0.0, "p": 0.0}
    want = {token: (f32(logit), float(p)) for token, logit, p in expected if math.isfinite(f32(logit))}
    got = finite_entries(after)
    if writes_p:
        probs = softmax_of(before) if sampler in WRITES_P_BEFORE else softmax_of(after)
    if cut_in_tie:
        got_logits = sorted(got.values())
        want_logits = sorted(logit for logit, _ in want.values())
        if len(got_logits) != len(want_logits):
            return [f"{len(got_logits)} survivors, llama.cpp {len(want_logits)}"], deviations
        deviations["logit"] = max((abs(a - b) for a, b in zip(got_logits, want_logits)), default=0.0)
        if writes_p:
            got_p = sorted(probs[token] for token in got)
            want_p = sorted(p for _, p in want.values())
            deviations["p"] = max((abs(a - b) for a, b in zip(got_p, want_p)), default=0.0)
    else:
        if set(got) != set(want):
            return [f"survivors differ: extra {sorted(set(got) - set(want))}, missing {sorted(set(want) - set(got))}"], deviations
        for token, (logit, p) in want.items():
            deviations["logit"] = max(deviations["logit"], abs(got[token] - logit))
            if writes_p:
                deviations["p"] = max(deviations["p"], abs(probs[token] - p))
    if deviations["logit"] > TOL:
        problems.append(f"logit off by {deviations['logit']:.3g}")
    if deviations["p"] > TOL:
        problems.append(f"p off by {deviations['p']:.3g}")
    if is_sorted:
        want_sequence = [f32(logit) for _, logit, _ in expected]
        got_sequence = sorted(got.values(), reverse=True) + [-math.inf] * (len(want_sequence) - len(got))
        if any(abs(a - b) > TOL for a, b in zip(want_sequence, got_sequence) if math.isfinite(b)):
            problems.append("sorted logit sequence differs")
    if removed_from_front is not None:
        removed = len(finite_entries(before)) - len(got)
        if removed != removed_from_front:
            problems.append(f"XTC removed {removed}, llama.cpp moved data by {removed_from_front}")
    return problems, deviations


def writes_p(sampler: str, p: dict, llama_name: str) -> bool:
    if llama_name.startswith("?"):
        return False
    if sampler in ("top_p", "typical", "mirostat_v2"):
        return True
    if sampler == "temp_ext":
        return p["delta"] > 0
    if sampler == "xtc":
        return True  # probability 1 in every active case: the softmax always runs
    return False


def check_single(case: dict, tokenizer=None) -> Outcome:
    sampler, p = case["sampler"], case["params"]
    n_vocab = vocab_size(case)
    before = input_row(case, n_vocab)
    if sampler == "dry" and not p["breakers"]:
        after = _dry_without_breakers(case, before)
    elif sampler == "mirostat_v2":
        return check_mirostat(case)
    else:
        row_sampler = make_sampler(case, step_params(sampler, p), tokenizer)
        after = run_chain(given(before), [row_sampler])
    problems, deviations = compare_state(
        sampler,
        case["output"],
        before,
        after,
        cut_in_tie=case["cut_in_tie"],
        is_sorted=case["sorted"],
        writes_p=writes_p(sampler, p, case["llama_name"]),
        removed_from_front=case["data_offset"] if sampler == "xtc" else None,
    )
    return Outcome(case["case"], "mismatch" if problems else "match", "; ".join(problems), deviations)


def _dry_without_breakers(case: dict, before: np.ndarray) -> np.ndarray:
    # A request must name at least one breaker (as llama-server); the C API accepts none.
    p = case["params"]
    state = DryState(BreakerTable.from_sequences([]), p["multiplier"], p["base"], p["allowed_length"], p["penalty_last_n"])
    state.accept_many(case["history"])
    after = before.copy()
    apply_dry(after, [0], [state])
    return after


def check_mirostat(case: dict) -> Outcome:
    p = case["params"]
    before = input_row(case, vocab_size(case))
    row_sampler = make_sampler(case, step_params("mirostat_v2", p))
    problems = []
    for earlier in case.get("prior_results") or []:
        survivors = len(finite_entries(run_chain(given(before), [row_sampler])))
        if survivors != earlier["size"]:
            problems.append(f"an earlier apply kept {survivors}, llama.cpp {earlier['size']}")
        row_sampler.accept(sample_batch(given(before), [row_sampler]).token_ids[0])
    after = run_chain(given(before), [row_sampler])
    found, deviations = compare_state(
        "mirostat_v2", case["output"], before, after, cut_in_tie=case["cut_in_tie"], is_sorted=True, writes_p=True
    )
    problems += found
    if not case["selected_rng_dependent"]:
        token = sample_batch(given(before), [row_sampler]).token_ids[0]
        if token != case["output"][case["selected"]][0]:
            problems.append(f"drew {token}, llama.cpp selected {case['output'][case['selected']][0]}")
    return Outcome(case["case"], "mismatch" if problems else "match", "; ".join(problems), deviations)


def merged_chain_params(steps: list[dict]) -> dict | None:
    """One SamplingParams for the whole chain, or None if two steps need different min_keep."""
    fields: dict = {"samplers": []}
    for step in steps:
        for key, value in step_params(step["sampler"], step["params"]).items():
            if key == "samplers":
                fields["samplers"] += value
            elif key in fields and fields[key] != value:
                return None
            else:
                fields[key] = value
    return fields


def check_chain(case: dict, tokenizer=None) -> Outcome:
    steps = case["params"]["steps"]
    before = input_row(case, vocab_size(case))
    fields = merged_chain_params(steps)
    if fields:
        states = _chain_states_merged(case, fields, before, tokenizer)
    else:
        states = _chain_states_stepwise(case, before, tokenizer)
    problems: list[str] = []
    deviations = {"logit": 0.0, "p": 0.0}
    previous = before
    for index, (step, trace) in enumerate(zip(steps, case["trace"])):
        current = states[index]
        found, dev = compare_state(
            step["sampler"],
            trace["output"],
            previous,
            current,
            cut_in_tie=trace["cut_in_tie"],
            is_sorted=trace["sorted"],
            writes_p=writes_p(step["sampler"], step["params"], case["llama_name"][index]),
            removed_from_front=(trace["data_offset"] - _offset_before(case, index)) if step["sampler"] == "xtc" else None,
        )
        problems += [f"step {index} ({step['sampler']}): {problem}" for problem in found]
        for key in deviations:
            deviations[key] = max(deviations[key], dev[key])
        previous = current
    return Outcome(case["case"], "mismatch" if problems else "match", "; ".join(problems), deviations)


def _offset_before(case: dict, index: int) -> int:
    return case["trace"][index - 1]["data_offset"] if index > 0 else 0


def _chain_states_merged(case: dict, fields: dict, before: np.ndarray, tokenizer=None) -> list[np.ndarray]:
    """Run the chain once; snapshot the row after each step (a step that did not run: unchanged)."""
    row_sampler = make_sampler(case, fields, tokenizer)
    snapshots: dict[str, np.ndarray] = {}
    run_chain(given(before), [row_sampler], on_step=lambda name, rows, logits: snapshots.__setitem__(name, logits.copy()))
    states, current = [], before
    for step in case["params"]["steps"]:
        current = snapshots.get(STEP_NAMES.get(step["sampler"], step["sampler"]), current)
        states.append(current)
    return states


def _chain_states_stepwise(case: dict, before: np.ndarray, tokenizer=None) -> list[np.ndarray]:
    """Each step with its own parameters on the previous step's output."""
    states, current = [], before
    for step in case["params"]["steps"]:
        current = run_chain(given(current), [make_sampler(case, step_params(step["sampler"], step["params"]), tokenizer)])
        states.append(current)
    return states


def check_case(case: dict, tokenizer=None) -> Outcome:
    """Compare one case; `tokenizer` replaces the fake one built from the case's `pieces`."""
    if case["case"] in KNOWN_DEVIATIONS:
        return Outcome(case["case"], "skip", KNOWN_DEVIATIONS[case["case"]])
    if case["sampler"] == "chain":
        return check_chain(case, tokenizer)
    return check_single(case, tokenizer)


CASES = load_jsonl("samplers.jsonl")
SAMPLER_TYPES = sorted({case["sampler"] for case in CASES})


@pytest.fixture(params=DEVICES)
def device(request, monkeypatch) -> str:
    monkeypatch.setattr(sys.modules[__name__], "DEVICE", request.param)
    return request.param


@pytest.mark.parametrize("sampler", SAMPLER_TYPES)
def test_reference_cases(sampler: str, device: str) -> None:
    outcomes = [check_case(case) for case in CASES if case["sampler"] == sampler]
    mismatches = [f"{o.case}: {o.detail}" for o in outcomes if o.status == "mismatch"]
    assert not mismatches, "\n".join(mismatches)


def test_reference_summary(capsys) -> None:
    outcomes = [check_case(case) for case in CASES]
    counts = Counter(o.status for o in outcomes)
    worst: dict[str, dict[str, float]] = {}
    for case, outcome in zip(CASES, outcomes):
        for key, value in outcome.deviations.items():
            entry = worst.setdefault(case["sampler"], {})
            entry[key] = max(entry.get(key, 0.0), value)
    with capsys.disabled():
        print(f"\nsamplers.jsonl: {counts['match']} matched, {counts['skip']} skipped, "
              f"{counts['mismatch']} mismatched, {len(outcomes)} total")
        for name in sorted(worst):
            print(f"  {name:12s} max |logit diff| {worst[name].get('logit', 0):.2e}  max |p diff| {worst[name].get('p', 0):.2e}")
        for o in outcomes:
            if o.status == "skip":
                print(f"  skipped {o.case}: {o.detail}")
    assert counts["match"] + counts["skip"] == len(CASES) == 263
    assert counts["skip"] == len(KNOWN_DEVIATIONS)


@pytest.mark.real_model
def test_dry_cases_with_the_real_vocabulary(smollm2_path) -> None:
    """The DRY cases again, the breakers resolved against all 49152 SmolLM2 tokens."""
    try:
        from lamplight.gguf.file import GGUFFile
        from lamplight.tokenizer.tokenizer import Tokenizer
    except ImportError as error:
        pytest.skip(f"lamplight.tokenizer is not available: {error}")
    tokenizer = Tokenizer.from_gguf(GGUFFile(smollm2_path))
    cases = [case for case in CASES if "pieces" in case]
    for case in cases:  # the fixture's tokenization is the one llama.cpp made
        assert tokenizer.encode(case["history_text"], add_special=False, parse_special=False) == case["history"]
    outcomes = [check_case(case, tokenizer) for case in cases]
    mismatches = [f"{o.case}: {o.detail}" for o in outcomes if o.status == "mismatch"]
    assert not mismatches, "\n".join(mismatches)
    assert len(outcomes) == 47


@pytest.mark.parametrize("case_id", sorted(KNOWN_DEVIATIONS))
def test_known_deviations_follow_the_fixed_semantics(case_id: str) -> None:
    case = next(c for c in CASES if c["case"] == case_id)
    before = input_row(case, vocab_size(case))
    after = run_chain(given(before), [make_sampler(case, step_params(case["sampler"], case["params"]))])
    got = finite_entries(after)
    expected = FIXED_SEMANTICS[case["sampler"]](case, finite_entries(before))
    assert set(got) == set(expected)
    for token, value in expected.items():
        assert got[token] == pytest.approx(value, rel=1e-5, abs=1e-5)


def _fixed_typical(case: dict, candidates: dict[int, float]) -> dict[int, float]:
    """typical_p over the finite candidates only (float64 reference)."""
    ids = sorted(candidates, key=lambda t: (-candidates[t], t))
    logits = np.array([candidates[t] for t in ids])
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    entropy = -(probs * np.log(probs)).sum()
    order = np.argsort(np.abs(-np.log(probs) - entropy), kind="stable")
    kept, total = [], 0.0
    for position in order:
        kept.append(ids[position])
        total += probs[position]
        if total > case["params"]["p"] and len(kept) >= case["params"]["min_keep"]:
            break
    return {token: candidates[token] for token in kept}


def _fixed_temp_ext(case: dict, candidates: dict[int, float]) -> dict[int, float]:
    """temp_ext with the maximum entropy log(number of finite candidates) (float64 reference)."""
    p = case["params"]
    logits = np.array(list(candidates.values()))
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    entropy = -(probs * np.log(probs)).sum()
    low, high = max(0.0, p["t"] - p["delta"]), p["t"] + p["delta"]
    t = low + (high - low) * (entropy / math.log(len(logits))) ** p["exponent"]
    return {token: value / t for token, value in candidates.items()}


def _fixed_logit_bias(case: dict, candidates: dict[int, float]) -> dict[int, float]:
    result = dict(candidates)
    for token, bias in case["params"]["biases"]:
        if token in result:
            result[token] = f32(result[token] + f32(bias))
    return result


def _fixed_greedy(case: dict, candidates: dict[int, float]) -> dict[int, float]:
    best = max(candidates.values())
    token = min(t for t, value in candidates.items() if value == best)
    return {token: best}


FIXED_SEMANTICS: dict[str, Callable[[dict, dict[int, float]], dict[int, float]]] = {
    "typical": _fixed_typical,
    "temp_ext": _fixed_temp_ext,
    "logit_bias": _fixed_logit_bias,
    "temp": _fixed_greedy,
}
