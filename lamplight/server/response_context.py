"""What every response of one request shares: id, timestamps, model name, prompts, parameters."""

from __future__ import annotations

import secrets
import string
import time
from dataclasses import dataclass, field
from typing import Any, Iterable

from lamplight.engine.types import FinalEvent, is_placeholder

from .params import GenerationParams

_ALNUM = string.ascii_letters + string.digits


def random_alnum(n: int = 32) -> str:
    return "".join(secrets.choice(_ALNUM) for _ in range(n))


def new_completion_id() -> str:
    # llama-server uses the chat prefix for text completions too.
    return "chatcmpl-" + random_alnum()


@dataclass
class ResponseContext:
    params: GenerationParams
    prompts: list[list[int]]
    model: str
    fingerprint: str
    tokenizer: Any
    generation_settings: dict
    id: str = field(default_factory=new_completion_id)
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def n_results(self) -> int:
        return len(self.prompts) * self.params.n_choices

    def prompt_of(self, index: int) -> list[int]:
        return self.prompts[index // self.params.n_choices]

    def prompt_text(self, index: int) -> str:
        """The prompt of result `index` as llama-server echoes it (`prompt`): special tokens as text."""
        # Image positions hold placeholder ids (lamplight.engine.types): no text of their own.
        return self.tokenizer.decode([t for t in self.prompt_of(index) if not is_placeholder(t)], special=True)

    def usage(self, finals: dict[int, FinalEvent]) -> dict:
        """OpenAI usage: each prompt counted once, every choice's completion tokens added up."""
        per_prompt = {index // self.params.n_choices: final for index, final in sorted(finals.items())}
        return usage_json(per_prompt.values(), finals.values())


def usage_json(prompt_finals: Iterable[FinalEvent], finals: Iterable[FinalEvent]) -> dict:
    prompt_finals = list(prompt_finals)
    prompt_tokens = sum(f.n_prompt for f in prompt_finals)
    completion_tokens = sum(f.n_decoded for f in finals)
    return {
        "completion_tokens": completion_tokens,
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": sum(f.n_cached for f in prompt_finals)},
    }
