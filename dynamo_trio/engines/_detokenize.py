"""Incremental detokenization: the text each new token adds, for a tokenizer that only
decodes whole sequences (Hugging Face's), without ever taking text back."""

from __future__ import annotations

from typing import Any, final


@final
class Detokenizer:
    """Turns token ids, one at a time, into text deltas.

    Decodes a short window (the previous few tokens plus the new ones), so
    that a word's leading space and multi-token characters come out right,
    and holds text back while it ends in an incomplete character (U+FFFD),
    as Hugging Face's ``TextStreamer`` and vLLM's detokenizer do.

    Args:
        tokenizer: A Hugging Face tokenizer (``decode(ids, skip_special_tokens=)``).
        prompt_ids: The prompt's ids: the first delta is decoded in their context.
    """

    __slots__ = ("_ids", "_prefix", "_read", "_tokenizer")

    def __init__(self, tokenizer: Any, prompt_ids: list[int]) -> None:
        self._tokenizer = tokenizer
        self._ids = list(prompt_ids[-6:])
        self._prefix = 0
        self._read = len(self._ids)

    def push(self, token_id: int) -> str:
        """The text that ``token_id`` completes (possibly empty)."""
        self._ids.append(token_id)
        decode = self._tokenizer.decode
        before: str = decode(self._ids[self._prefix : self._read], skip_special_tokens=True)
        after: str = decode(self._ids[self._prefix :], skip_special_tokens=True)
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return after[len(before) :]
