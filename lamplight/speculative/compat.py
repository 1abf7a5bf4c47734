"""Whether a draft model's tokens are the model's: llama.cpp's test (common/speculative.cpp,
common_speculative_are_compatible), so a draft model llama-server takes is taken here too."""

from __future__ import annotations

from ..tokenizer import Tokenizer

MAX_VOCAB_DIFFERENCE = 128  # SPEC_VOCAB_MAX_SIZE_DIFFERENCE: extra tokens one of them may have
FIRST_COMPARED_ID = 5  # SPEC_VOCAB_CHECK_START_TOKEN_ID: the first ids (special tokens) may differ


def vocab_mismatch(target: Tokenizer, draft: Tokenizer) -> str | None:
    """Why `draft`'s vocabulary cannot draft for `target`'s, or None: the same tokenizer type,
    BOS and EOS use, sizes within MAX_VOCAB_DIFFERENCE, and the same text for every shared id
    from FIRST_COMPARED_ID on."""
    a, b = target.vocab, draft.vocab
    if a.type != b.type:
        return f"the draft model's tokenizer is {b.type.name}, the model's {a.type.name}"
    for name, add_a, add_b, id_a, id_b in (("BOS", a.add_bos, b.add_bos, target.bos_id, draft.bos_id),
                                           ("EOS", a.add_eos, b.add_eos, target.eos_id, draft.eos_id)):
        if add_a != add_b or (add_a and id_a != id_b):
            return f"the draft model's {name} token differs from the model's"
    if abs(len(a.tokens) - len(b.tokens)) > MAX_VOCAB_DIFFERENCE:
        return (f"the draft model has {len(b.tokens)} tokens, the model {len(a.tokens)} (at most "
                f"{MAX_VOCAB_DIFFERENCE} may differ)")
    for i in range(FIRST_COMPARED_ID, min(len(a.tokens), len(b.tokens))):
        if a.tokens[i] != b.tokens[i]:
            return f"token {i} is {b.tokens[i]!r} in the draft model and {a.tokens[i]!r} in the model"
    return None
