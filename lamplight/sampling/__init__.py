"""llama.cpp's sampler chain, batch-first, in numpy (never importing torch, whatever the backend).

The engine's whole interface:

    params = SamplingParams(temperature=0.7, top_k=20, seed=effective_seed(request_seed), ...)
    params.validate()                                   # ValueError("<field>: <reason>")
    sampler = SequenceSampler(params, tokenizer=tok, n_ctx=slot_ctx, choice_index=i, eog_ids=eogs)
    sampler.accept_many(prompt_ids)                     # history for penalties / DRY
    result = sample_batch(logits, [sampler, ...], allowed_mask=None, forced=None)   # logits: [B, V] numpy
    sampler.accept(result.token_ids[row])               # the engine, once it keeps the token
    result.probs[row]                                   # TokenProbs when params.n_probs > 0

Helpers for the HTTP layer: `parse_samplers` (names, aliases or letters -> canonical names),
`resolve_logit_bias` (array or object form -> (id, bias) pairs), `effective_seed` (-1 -> random).

Order, as llama.cpp (common_sampler_init): grammar mask -> logit_bias (+ ignore_eos bans) ->
forced tokens (the reasoning budget: `forced[i]` leaves row i that one candidate) -> the
row's `samplers` list (default penalties, dry, top_n_sigma, top_k, typ_p, top_p, min_p, xtc,
temperature) -> the draw. With mirostat 1/2 the list is replaced by temperature -> mirostat.
Temperature <= 0 keeps only the best token at the temperature step (greedy). dynatemp_range > 0
makes the temperature step llama.cpp's temp_ext.

Arrays: `logits` is a float array (any float dtype; a torch tensor, on any device, is converted
with `.detach().float().cpu().numpy()` without importing torch), `allowed_mask` a bool array
(lamplight.grammar.fill_masks makes one); run_chain returns a new float32 array.

Batching: each step runs once for all the rows that use it, with per-row parameter arrays;
a sampler no row uses is skipped, and a sampler a row's parameters disable is an identity for
that row. Candidates are never dropped from the [B, V] array: a removed token's logit is -inf.
After a top_k the chain remembers each row's candidate ids, so the later samplers work on
[B, k] gathers instead of the vocabulary (truncation.Hint). Only DRY's match search and the
penalty counts run per row in Python, on incremental state.

Randomness: no shared generator. The draw and XTC's coin use counter_uniform(seed, number of
generated tokens, choice index, purpose), so a seed gives the same tokens whatever else is in the
batch and whichever row it is in. The draw is an inverse-CDF over the final distribution in
vocabulary order. Equal logits are ordered by ascending token id wherever order decides (top_k,
top_p, typical, min_keep, XTC, greedy), so results do not depend on the sort algorithm. Every
per-row sum is computed the same way for a row alone or in any batch (lamplight.sampling.
reductions and .draw), so a row's probabilities and token are the same bits whatever shares its
step.

Modules: params (SamplingParams, parse_samplers, effective_seed), sequence (SequenceSampler),
chain (run_chain, sample_batch), reasoning_budget (`--reasoning-budget N`'s per-sequence state
machine: which token, if any, a step must produce), logit_bias, penalties, dry, truncation
(top_k, top_p, min_p, typical, top_n_sigma), xtc, temperature (incl. dynatemp), mirostat,
probs (n_probs), rng, draw (the inverse-CDF draw), reductions (reproducible per-row sums),
arrays (what the chain accepts), bench (`python -m lamplight.sampling.bench`).

Where this differs from llama.cpp on purpose (llama.cpp keeps -inf candidates in its array):
* a forced token (reasoning budget) overrides logit_bias; llama.cpp runs its budget sampler
  before logit_bias, so a -inf bias on the forced token leaves it no candidate at all;
* a -inf candidate is no candidate: typical_p's entropy skips it (llama.cpp's 0*log 0 = NaN
  turns the filter into a plain cumulative cut), dynatemp's maximum entropy is log(number of
  finite candidates), XTC's and the filters' min_keep count finite candidates only;
* duplicate logit_bias entries always add up (llama.cpp: only when the array is in vocab order,
  which it always is in llama-server);
* greedy keeps the lowest id among equal maxima (llama.cpp: the first in its array, which is
  vocabulary order unless a sorting sampler ran before);
* validation is strict where llama.cpp clamps or ignores (see SamplingParams.validate), and
  resolve_logit_bias rejects entries llama.cpp skips silently (including a `true` bias).
"""

from .chain import SampleResult, run_chain, sample_batch
from .logit_bias import resolve_logit_bias
from .params import DEFAULT_SAMPLERS, SamplingParams, effective_seed, parse_samplers
from .probs import TokenProb, TokenProbs
from .reasoning_budget import BudgetState, ReasoningBudget, ReasoningBudgetSpec
from .sequence import SequenceSampler

__all__ = [
    "BudgetState",
    "DEFAULT_SAMPLERS",
    "ReasoningBudget",
    "ReasoningBudgetSpec",
    "SampleResult",
    "SamplingParams",
    "SequenceSampler",
    "TokenProb",
    "TokenProbs",
    "effective_seed",
    "parse_samplers",
    "resolve_logit_bias",
    "run_chain",
    "sample_batch",
]
