"""Stop sequences in generated text, for engines (the mock engine and the examples use it)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence


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
        """Add generated text; ``(released, stop)``: what can be output now, and the stop found.

        ``released`` ends before a found stop (the rest is dropped); while not
        ``active`` (``min_tokens``) all text is released.
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
