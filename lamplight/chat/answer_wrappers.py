"""Markers some templates put around the answer, taken off the chat content as llama.cpp's
parsers do (whatever `reasoning_format` and whether tools are used):

| family       | answer                                   |
|--------------|------------------------------------------|
| Command R7B  | `<|START_RESPONSE|>...<|END_RESPONSE|>` |
| Granite 3.x  | `<response>...</response>`               |

The family that has one is found with llama.cpp's format detection (lamplight.chat.families).

The markers go, the text around them stays (llama.cpp adds what comes before the opening marker
to the content too). A reply without the opening marker is left as it is.
"""

from __future__ import annotations

from dataclasses import dataclass

from lamplight.chat.text import marker_prefix_length


@dataclass(frozen=True)
class AnswerWrapper:
    open: str
    close: str

    def unwrap(self, text: str, partial: bool = False) -> str:
        """`text` without the wrapper's markers; `partial` (streaming) holds back a trailing
        prefix of the marker that is due next."""
        at = text.find(self.open)
        if at < 0:
            return text[:len(text) - marker_prefix_length(text, self.open)] if partial else text
        before, inside = text[:at], text[at + len(self.open):]
        end = inside.find(self.close)
        if end < 0:
            return before + (inside[:len(inside) - marker_prefix_length(inside, self.close)] if partial else inside)
        return before + inside[:end] + inside[end + len(self.close):]


COMMAND_R7B = AnswerWrapper("<|START_RESPONSE|>", "<|END_RESPONSE|>")
GRANITE = AnswerWrapper("<response>", "</response>")

