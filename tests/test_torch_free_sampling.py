"""The sampler chain and the grammar masks never import torch (the native backend runs without
it): in a fresh interpreter where `import torch` raises, every module of lamplight.sampling and
lamplight.grammar's mask code imports, and sample_batch runs every sampler on numpy logits with a
grammar mask."""

from __future__ import annotations

import textwrap

from no_torch import run_without_torch

SCRIPT = textwrap.dedent(
    '''
    import importlib
    import pkgutil
    import sys

    import numpy as np

    import lamplight.sampling
    for module in pkgutil.iter_modules(lamplight.sampling.__path__):
        importlib.import_module(f"lamplight.sampling.{module.name}")
    from lamplight.grammar import GrammarCompiler, fill_masks
    from lamplight.grammar.walk import pick_token
    from lamplight.sampling import SamplingParams, SequenceSampler, run_chain, sample_batch


    class ByteTokenizer:
        """One token per byte and an end-of-sequence control token (the model pads to N_VOCAB)."""

        vocab_size = 257
        eos_id = 256
        bos_id = None
        eog_ids = frozenset({256})

        def token_bytes(self, token_id):
            return b"</s>" if token_id == 256 else bytes([token_id])

        def is_control(self, token_id):
            return token_id == 256

        def encode(self, text, add_special=False, parse_special=False):
            return list(text.encode())


    N_VOCAB = 8192  # above the chain's SMALL_WIDTH: the whole-vocabulary routes run too
    tokenizer = ByteTokenizer()
    every_sampler = dict(
        repeat_penalty=1.2, frequency_penalty=0.1, presence_penalty=0.2, repeat_last_n=32,
        dry_multiplier=0.8, dry_allowed_length=1, top_n_sigma=3.0, top_k=60, typical_p=0.95, top_p=0.95,
        min_p=0.01, xtc_probability=1.0, xtc_threshold=0.05, dynatemp_range=0.3, temperature=0.9,
        logit_bias=[(ord("a"), 2.0), (ord("z"), float("-inf"))], n_probs=3,
    )
    params = [
        SamplingParams(seed=1, **every_sampler),
        SamplingParams(seed=2, **{**every_sampler, "top_k": 0, "post_sampling_probs": True}),
        SamplingParams(seed=3, mirostat=2, mirostat_tau=3.0, n_probs=2),
        SamplingParams(seed=4, mirostat=1, mirostat_tau=3.0, temperature=0.8),
        SamplingParams(seed=5, temperature=0.0),
    ]
    samplers = [SequenceSampler(p, tokenizer=tokenizer, n_ctx=256, choice_index=0) for p in params]
    for sampler in samplers:
        sampler.accept_many(list(b"abcab: abcab: abca"))
    compiled = GrammarCompiler(tokenizer).compile_gbnf('root ::= [a-f]+ "!"')
    matchers = [compiled.new_matcher(), compiled.new_matcher(), None, None, None]
    rng = np.random.default_rng(0)
    for step in range(4):
        logits = (rng.standard_normal((len(samplers), N_VOCAB)) * 3).astype(np.float32)
        mask = fill_masks(matchers, N_VOCAB)
        assert isinstance(mask, np.ndarray) and mask.dtype == np.bool_ and mask.shape == logits.shape
        result = sample_batch(logits, samplers, allowed_mask=mask, forced=[None, None, None, None, 7])
        assert all(mask[row, token] for row, token in enumerate(result.token_ids)), result.token_ids
        assert result.token_ids[4] == 7
        assert [probs is not None for probs in result.probs] == [True, True, True, False, False]
        assert all(np.isfinite(run_chain(logits, samplers, allowed_mask=mask).max(axis=1)))
        for sampler, matcher, token in zip(samplers, matchers, result.token_ids):
            sampler.accept(token)
            if matcher is not None:
                assert matcher.accept(token)
    greedy = [SequenceSampler(SamplingParams(temperature=0.0), n_ctx=8) for _ in range(2)]
    assert sample_batch(logits[:2], greedy).token_ids == logits[:2].argmax(axis=1).tolist()
    import random
    assert 0 <= pick_token(fill_masks([compiled.new_matcher()], 257)[0], compiled.vocabulary, random.Random(1),
                           frozenset()) < 256
    assert "torch" not in sys.modules
    try:
        import torch  # noqa: F401  (the hook itself must refuse it, or this test proves nothing)
    except ImportError:
        print("torch-free")
    '''
)


def test_sampling_and_grammar_masks_run_without_torch() -> None:
    done = run_without_torch(SCRIPT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "torch-free", done.stdout + done.stderr
