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
        hits = [(at, stop) for stop in self._stops if (at := pending.find(stop)) >= 0]
        if hits:  # the earliest; of stops found at one place, the first given
            at, stop = min(hits, key=lambda hit: hit[0])
            self._held = ""
            return pending[:at], stop
        # Hold back the longest suffix that begins some stop sequence.
        sizes = range(min(len(pending), self._longest - 1), 0, -1)
        keep = next((n for n in sizes if any(s.startswith(pending[-n:]) for s in self._stops)), 0)
        cut = len(pending) - keep
        self._held = pending[cut:]
        return pending[:cut], None

    def flush(self) -> str:
        """Release the held text (generation ended for another reason)."""
        held, self._held = self._held, ""
        return held
