"""What the scenarios share: the servers under test, the prompt factory, sizes and progress."""

from __future__ import annotations

from dataclasses import dataclass

from lamplight.bench.client import ServerClient, ServerInfo
from lamplight.bench.config import BenchConfig
from lamplight.bench.progress import Progress
from lamplight.bench.prompts import Prompt, PromptFactory
from lamplight.bench.report import ScenarioResult

# Tokens a server adds around our text (BOS, chat template) that our count does not see.
TEMPLATE_MARGIN = {"completions": 8, "chat": 64}


@dataclass
class Target:
    """One server under test: "A" is --url, "B" is --compare."""

    label: str
    client: ServerClient
    info: ServerInfo


class BenchContext:
    def __init__(self, targets: list[Target], prompts: PromptFactory, config: BenchConfig,
                 progress: Progress, api: str = "completions"):
        self.targets = targets
        self.prompts = prompts
        self.config = config
        self.progress = progress
        self.margin = TEMPLATE_MARGIN.get(api, 64)

    def fits(self, target: Target, prompt: Prompt, max_tokens: int) -> bool:
        n_ctx = target.info.n_ctx
        return n_ctx is None or prompt.tokens + max_tokens + self.margin <= n_ctx

    def largest_prompt(self, max_tokens: int) -> int | None:
        """The longest prompt every server can take with max_tokens of output; None if unknown."""
        limits = [t.info.n_ctx - max_tokens - self.margin for t in self.targets if t.info.n_ctx]
        return min(limits) if limits else None

    async def measure(self, scenario: ScenarioResult, target: Target, prompt: Prompt,
                      max_tokens: int, keep_reply: bool = False, **tags) -> dict:
        """Send one timed request and add its figures to the scenario's records; with keep_reply,
        the record's "reply" holds the text generated (for the caller to judge and pop)."""
        result = await target.client.stream(prompt, max_tokens)
        record = {
            "server": target.label,
            **tags,
            "prompt_target_tokens": prompt.target_tokens,
            "prompt_counted_tokens": prompt.counted_tokens,
            **result.to_dict(),
            **({"reply": result.text} if keep_reply else {}),
        }
        scenario.records.append(record)
        self.progress.tick(failed=result.error is not None)
        return record

    async def measure_chat(self, scenario: ScenarioResult, target: Target, messages: list[dict],
                           max_tokens: int, **tags) -> dict:
        """One timed chat turn; the record's "reply" holds the text generated."""
        result = await target.client.stream_chat(messages, max_tokens)
        record = {"server": target.label, **tags, **result.to_dict(), "reply": result.text}
        scenario.records.append(record)
        self.progress.tick(failed=result.error is not None)
        return record
