"""Deterministic text for the mock engine: a pseudo-tokenizer, prompts and tokens; the same
rendered prompt and seed always give the same text (``docs/mocker.md``)."""

from __future__ import annotations

import hashlib
import random
import re
from typing import TYPE_CHECKING, Final

import trio

if TYPE_CHECKING:
    from ..llm import GenerateRequest

VOCABULARY: Final = (
    "the", "a", "quick", "brown", "fox", "jumps", "over", "lazy",
    "dog", "and", "then", "runs", "across", "green", "field", "under",
    "bright", "sky", "while", "birds", "sing", "softly", "near", "river",
    "where", "old", "trees", "stand", "tall", "in", "quiet", "morning",
    "light", "every", "small", "stone", "holds", "story", "of", "time",
    "wind", "carries", "seeds", "far", "beyond", "hills", "into", "valleys",
    "rain,", "snow,", "sun,", "cloud,", "today.", "again.", "slowly.", "together.",
    "we", "they", "it", "is", "was", "will", "be", "here",
)  # fmt: skip
"""The 64 words the mock engine speaks; token id ``i`` is ``VOCABULARY[i]``."""

_NEXT: Final = tuple(" " + word for word in VOCABULARY)
_INDEX_BITS: Final = 6  # 2**6 == len(VOCABULARY)
_TOKEN_PATTERN: Final = re.compile(r"\w+|[^\w\s]")


def count_tokens(text: str) -> int:
    """The pseudo-token count of ``text``: word runs plus punctuation marks."""
    return len(_TOKEN_PATTERN.findall(text))


_PIECE: Final = 1 << 16
_SPACE: Final = re.compile(r"\s")


async def count_tokens_yielding(text: str) -> int:
    """:func:`count_tokens`, letting other tasks run between pieces of a long text (split
    at whitespace, which no token spans): a long prompt holds up no other stream."""
    total = start = 0
    while start < len(text):
        space = _SPACE.search(text, start + _PIECE)  # None past the end
        end = len(text) if space is None else space.start()
        total += len(_TOKEN_PATTERN.findall(text, start, end))
        if (start := end) < len(text):
            await trio.lowlevel.checkpoint()
    return total


def render_prompt(request: GenerateRequest) -> str:
    """The prompt text the engine sees: a completion prompt, or chat messages in a template."""
    if request["request_type"] == "completion":
        return request.get("prompt", "")
    return "".join(
        f"<|{message['role']}|>\n{message['content']}\n" for message in request.get("messages", ())
    ) + ("<|assistant|>\n")


class TokenSource:
    """The deterministic token stream for one rendered prompt and seed (``None`` is one too)."""

    __slots__ = ("_first", "_random")

    def __init__(self, prompt: str, seed: int | None) -> None:
        key = hashlib.blake2b(f"{seed!r}\0{prompt}".encode(), digest_size=8).digest()
        self._random = random.Random(int.from_bytes(key, "little"))
        self._first = True

    def next(self) -> tuple[int, str]:
        """The next ``(token_id, text)``."""
        index = self._random.getrandbits(_INDEX_BITS)
        words = VOCABULARY if self._first else _NEXT
        self._first = False
        return index, words[index]
