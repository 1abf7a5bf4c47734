"""Speculative decoding's drafting side: which tokens a sequence might continue with.

The engine (lamplight.engine.speculation) verifies the drafts: each drafted position is
computed as a decode row and sampled as decoding would sample it, so speculation changes
how many tokens a step yields, never which.
"""

from .config import NGRAM_KINDS, SpecConfig, SpecRequest, parse_kinds
from .speculator import Speculator, SpeculatorFactory

__all__ = ["NGRAM_KINDS", "SpecConfig", "SpecRequest", "Speculator", "SpeculatorFactory", "parse_kinds"]
