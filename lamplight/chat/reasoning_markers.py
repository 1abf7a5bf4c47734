"""The markers around a model's thinking, per template family.

A template whose source names one of these start markers "can think": llama.cpp then defines
`enable_thinking` true by default, splits the thinking out of replies (`reasoning_format`) and
closes an empty thinking block before an assistant prefill. The order matters: more specific
markers first (`<think:opensource>` before `<think>`). A template that names none of them may still
think in one of them: the one its family's dedicated format splits (Kimi K2 and LFM2: `<think>`;
Devstral, as Ministral 3: `[THINK]`). Which markers a template has is found once, with its family
(lamplight.chat.families).

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


@dataclass(frozen=True)
class ReasoningMarkers:
    family: str
    start: str
    end: str
    probe: str  # the text that names these markers in a template's source
    answer_prefix: str = ""  # what opens the answer after the thinking (harmony's final channel)

    @property
    def empty_block(self) -> str:
        """What closes thinking before any is written (assistant prefill)."""
        return self.start + self.end


HUNYUAN = ReasoningMarkers("hunyuan", "<think:opensource>", "</think:opensource>", "<think:opensource>")
SEED = ReasoningMarkers("seed", "<seed:think>", "</seed:think>", "<seed:think>")
MINIMAX_M3 = ReasoningMarkers("minimax-m3", "<mm:think>", "</mm:think>", "<mm:think>")
MISTRAL = ReasoningMarkers("mistral", "[THINK]", "[/THINK]", "[THINK]")
GEMMA4 = ReasoningMarkers("gemma4", "<|channel>thought", "<channel|>", "<|channel>thought")
HARMONY = ReasoningMarkers("harmony", "<|channel|>analysis<|message|>", "<|end|>", "<|channel|>analysis",
                           answer_prefix="<|start|>assistant<|channel|>final<|message|>")
COMMAND_R7B = ReasoningMarkers("command-r7b", "<|START_THINKING|>", "<|END_THINKING|>", "<|START_THINKING|>")
THINK = ReasoningMarkers("think", "<think>", "</think>", "<think>")

# In the order a template's source is searched for them (lamplight.chat.families): more specific first.
MARKER_PAIRS = (HUNYUAN, SEED, MINIMAX_M3, MISTRAL, GEMMA4, HARMONY, COMMAND_R7B, THINK)
