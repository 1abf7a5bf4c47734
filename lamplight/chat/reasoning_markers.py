"""The markers around a model's thinking, per template family.

A template whose source names one of these start markers "can think": llama.cpp then defines
`enable_thinking` true by default, splits the thinking out of replies (`reasoning_format`) and
closes an empty thinking block before an assistant prefill. The order matters: more specific
markers first (`<think:opensource>` before `<think>`).

| family                                   | start                 | end                    |
|------------------------------------------|-----------------------|------------------------|
| Hunyuan (tencent Hy3)                    | `<think:opensource>`  | `</think:opensource>`  |
| Seed-OSS                                 | `<seed:think>`        | `</seed:think>`        |
| MiniMax M3                               | `<mm:think>`          | `</mm:think>`          |
| Mistral reasoning (Magistral, Ministral) | `[THINK]`             | `[/THINK]`             |
| Gemma 4                                  | `<\\|channel>thought` | `<channel\\|>`         |
| gpt-oss (harmony)                        | `<\\|channel\\|>analysis<\\|message\\|>` | `<\\|end\\|>` (then the final channel) |
| Command R7B                              | `<\\|START_THINKING\\|>` | `<\\|END_THINKING\\|>` |
| DeepSeek R1/V3.x, Qwen3, QwQ, GLM, Kimi, MiniMax M2, Nemotron, SmolLM3, ... | `<think>` | `</think>` |

Markers are text here; in a vocabulary some are control tokens, whole (`<channel|>`,
`<|START_THINKING|>`) or in part: Gemma 4's start is the control token `<|channel>` followed by
the text `thought`. Grammars spell them as the model writes them (lamplight.server.answer_grammar).
"""

from __future__ import annotations

from dataclasses import dataclass

from lamplight.chat.prefill import dedicated_section


@dataclass(frozen=True)
class ReasoningMarkers:
    family: str
    start: str
    end: str
    probe: str  # the text that identifies the family in a template's source
    answer_prefix: str = ""  # what opens the answer after the thinking (harmony's final channel)

    @property
    def empty_block(self) -> str:
        """What closes thinking before any is written (assistant prefill)."""
        return self.start + self.end


FAMILIES = (
    ReasoningMarkers("hunyuan", "<think:opensource>", "</think:opensource>", "<think:opensource>"),
    ReasoningMarkers("seed", "<seed:think>", "</seed:think>", "<seed:think>"),
    ReasoningMarkers("minimax-m3", "<mm:think>", "</mm:think>", "<mm:think>"),
    ReasoningMarkers("mistral", "[THINK]", "[/THINK]", "[THINK]"),
    ReasoningMarkers("gemma4", "<|channel>thought", "<channel|>", "<|channel>thought"),
    ReasoningMarkers("harmony", "<|channel|>analysis<|message|>", "<|end|>", "<|channel|>analysis",
                     answer_prefix="<|start|>assistant<|channel|>final<|message|>"),
    ReasoningMarkers("command-r7b", "<|START_THINKING|>", "<|END_THINKING|>", "<|START_THINKING|>"),
    ReasoningMarkers("think", "<think>", "</think>", "<think>"),
)


def detect_reasoning_markers(source: str) -> ReasoningMarkers | None:
    """The thinking markers a template uses, or None when it has no thinking."""
    for family in FAMILIES:
        if family.probe in source:
            return family
    return _dedicated_format_markers(source)


def _dedicated_format_markers(source: str) -> ReasoningMarkers | None:
    """Templates whose source never names a thinking marker but that llama.cpp gives a dedicated
    format which thinks in one of the families' markers (Kimi K2 and LFM2: `<think>`; Devstral,
    as Ministral 3: `[THINK]`): that family. (Formats with markers of their own, Kimi K3's and
    Muse Glimmer's, are not split here.)"""
    section = dedicated_section(source)
    if section is None:
        return None
    return next((f for f in FAMILIES if (f.start, f.end) == (section.start, section.end)), None)
