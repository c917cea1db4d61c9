"""Reporting bad records without flooding the log: a batch (a scan, a burst of watch events)
may hold thousands, each reported once per version by readers that cache their verdicts."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, final

if TYPE_CHECKING:
    import logging

NAMED_PER_BATCH: Final = 10
"""Bad records named individually per batch; the rest are counted."""


@final
class BadRecordReport:
    """Names up to :data:`NAMED_PER_BATCH` bad records per batch, then counts ``what``."""

    def __init__(self, logger: logging.Logger, what: str) -> None:
        self._logger = logger
        self._what = what
        self._named = 0
        self._more = 0

    def bad(self, where: str, reason: str) -> None:
        """Report one bad record: ``where`` it is and why it was skipped."""
        if self._named < NAMED_PER_BATCH:
            self._named += 1
            self._logger.warning("discovery: skipping %s: %s", where, reason)
        else:
            self._more += 1

    def end_batch(self) -> None:
        """Log the summary of the records not named, and start a new batch."""
        if self._more:
            self._logger.warning(
                "discovery: skipping %d more %s (each is reported once, until it changes)",
                self._more,
                self._what,
            )
        self._named = self._more = 0
