"""Deterministic text for the mock engine: a pseudo-tokenizer, prompts, tokens, stop sequences.

Nothing here is a real model.  The rules are chosen so tests can predict the
output exactly:

- a prompt is rendered to one string (chat messages through a fixed
  template) and counted with a pseudo-tokenizer (runs of word characters and
  single punctuation marks);
- generated tokens are drawn from a fixed 64-word vocabulary by a PRNG seeded
  from a hash of the rendered prompt and the request's ``seed``, so the same
  prompt and seed always give the same text; every token after the first
  starts with a space, so the text reads as words;
- stop sequences are matched across token boundaries, holding back any text
  that could be the start of one (see :class:`StopMatcher`).
"""

from __future__ import annotations

import hashlib
import random
import re
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..llm import GenerateRequest

__all__ = ["VOCABULARY", "StopMatcher", "TokenSource", "count_tokens", "render_prompt"]

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

_FIRST: Final = VOCABULARY
_NEXT: Final = tuple(" " + word for word in VOCABULARY)
_INDEX_BITS: Final = 6  # 2**6 == len(VOCABULARY)
_TOKEN_PATTERN: Final = re.compile(r"\w+|[^\w\s]")


def count_tokens(text: str) -> int:
    """The pseudo-token count of ``text``: word runs plus punctuation marks."""
    return len(_TOKEN_PATTERN.findall(text))


def render_prompt(request: GenerateRequest) -> str:
    """The prompt text the engine sees: a completion prompt, or chat messages in a template."""
    if request["request_type"] == "completion":
        return request.get("prompt", "")
    return "".join(
        f"<|{message['role']}|>\n{message['content']}\n" for message in request.get("messages", ())
    ) + ("<|assistant|>\n")


class TokenSource:
    """The deterministic token stream for one prompt and seed.

    Args:
        prompt: The rendered prompt.
        seed: The request's seed; ``None`` is a seed of its own.
    """

    __slots__ = ("_first", "_random")

    def __init__(self, prompt: str, seed: int | None) -> None:
        key = hashlib.blake2b(f"{seed!r}\0{prompt}".encode(), digest_size=8).digest()
        self._random = random.Random(int.from_bytes(key, "little"))
        self._first = True

    def next(self) -> tuple[int, str]:
        """The next ``(token_id, text)``."""
        index = self._random.getrandbits(_INDEX_BITS)
        if self._first:
            self._first = False
            return index, _FIRST[index]
        return index, _NEXT[index]


class StopMatcher:
    """Finds stop sequences in generated text, across token boundaries.

    Text that could still turn into a stop sequence is held back, so text
    already released never has to be taken back::

        matcher = StopMatcher(["\\n\\n"])
        matcher.push("a\\n")   # ("a", None): the "\\n" is held
        matcher.push("\\nb")   # ("", "\\n\\n"): stop; nothing after it is output
    """

    __slots__ = ("_held", "_longest", "_stops")

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._longest = max((len(s) for s in self._stops), default=0)
        self._held = ""

    def push(self, text: str, *, active: bool = True) -> tuple[str, str | None]:
        """Add generated text.

        Args:
            text: The new text.
            active: Whether stop sequences may end generation yet
                (``min_tokens``); when false, all text is released.

        Returns:
            ``(released, stop)``: the text that can be output now, and the
            stop sequence found (then ``released`` ends just before it and
            the rest is dropped), or ``None``.
        """
        pending = self._held + text
        if not active or not self._stops:
            self._held = ""
            return pending, None
        found: tuple[int, str] | None = None
        for stop in self._stops:
            at = pending.find(stop)
            if at >= 0 and (found is None or at < found[0]):
                found = (at, stop)
        if found is not None:
            self._held = ""
            return pending[: found[0]], found[1]
        keep = self._partial_match(pending)
        self._held = pending[len(pending) - keep :] if keep else ""
        return pending[: len(pending) - keep], None

    def flush(self) -> str:
        """Release the held text (generation ended for another reason)."""
        held, self._held = self._held, ""
        return held

    def _partial_match(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that begins some stop sequence."""
        for size in range(min(len(text), self._longest - 1), 0, -1):
            suffix = text[-size:]
            if any(stop.startswith(suffix) for stop in self._stops):
                return size
        return 0
