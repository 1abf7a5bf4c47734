"""Text helpers the chat layer and the tools layer above it share (this module imports nothing)."""

from __future__ import annotations


def marker_prefix_length(text: str, marker: str) -> int:
    """How many trailing characters of `text` could begin `marker` (`</thi` of `</think>`): what a
    streamed reply holds back until the next text shows whether the marker is coming."""
    for length in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:length]):
            return length
    return 0


def common_prefix_length(a: str, b: str) -> int:
    """How many leading characters a and b share."""
    length = 0
    for x, y in zip(a, b):
        if x != y:
            break
        length += 1
    return length
