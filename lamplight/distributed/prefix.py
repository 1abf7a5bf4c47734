"""Prompt-prefix block hashes, computed by the ingress from a request body (no tokenizer).

A chat request hashes its messages cumulatively: one hash at the end of each message, and one
every `block_chars` characters inside a long message. Turn k+1 of a conversation repeats turn
k's messages, so its hashes start with turn k's; two conversations with one long system prompt
share that prompt's hashes. A completion prompt (text or token ids) hashes every `block_chars`
characters of its JSON form. Requests without either (tokenize, slots, ...) have no hashes and
are routed by load alone.
"""

from __future__ import annotations

import hashlib
import json

from lamplight.serve_flags import default_of

DEFAULT_BLOCK_CHARS = default_of("routing.block_chars")  # --route-block-chars
MAX_HASHES = 512  # a 128k-character prompt; longer ones match on their first 512 blocks


def _pieces(doc: dict) -> list[str]:
    messages = doc.get("messages")
    if isinstance(messages, list):
        return [json.dumps(m, sort_keys=True, ensure_ascii=False) for m in messages]
    for field in ("prompt", "input_prefix"):
        if field in doc:
            prompt = doc[field]
            return [prompt if isinstance(prompt, str) else json.dumps(prompt, ensure_ascii=False)]
    return []


def prefix_hashes(body: bytes, block_chars: int = DEFAULT_BLOCK_CHARS) -> list[str]:
    """The block hashes of a JSON request body, shortest prefix first; [] when it has no prompt."""
    try:
        doc = json.loads(body) if body else None
    except (ValueError, RecursionError):
        return []
    if not isinstance(doc, dict):
        return []
    digest = hashlib.blake2b(digest_size=12)
    hashes: list[str] = []
    for piece in _pieces(doc):
        for start in range(0, len(piece), block_chars):
            digest.update(piece[start:start + block_chars].encode("utf-8", "surrogatepass"))
            hashes.append(digest.hexdigest())
            if len(hashes) >= MAX_HASHES:
                return hashes
        digest.update(b"\x00")  # a message boundary is part of the prefix
    return hashes
