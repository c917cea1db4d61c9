"""Log lines a peer (or a failing handler) can cause, at a bounded rate: each kind of event
is worth a line, not a flood.  Kinds are few (never a peer's address); more than
:data:`MAX_KINDS` at once start over, so memory stays bounded whatever they are.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Final, final

if TYPE_CHECKING:
    from collections.abc import Callable

MAX_KINDS: Final = 1024


@final
class LogLimiter:
    """At most ``burst`` lines at once, then one per ``interval`` seconds, per kind."""

    def __init__(
        self,
        logger: logging.Logger,
        *,
        interval: float = 10.0,
        burst: int = 5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger: Final = logger
        self._interval: Final = interval
        self._burst: Final = burst
        self._clock: Final = clock
        self._kinds: dict[str, tuple[float, float, int]] = {}  # (tokens, as of when, suppressed)

    def log(
        self,
        level: int,
        kind: str,
        message: str,
        *args: object,
        exc_info: BaseException | None = None,
    ) -> bool:
        """Log ``message % args`` unless ``kind`` has used up its lines for now; whether it did."""
        if not self._logger.isEnabledFor(level):
            return False
        now = self._clock()
        if kind not in self._kinds and len(self._kinds) >= MAX_KINDS:
            self.reset()
        tokens, since, suppressed = self._kinds.get(kind, (float(self._burst), now, 0))
        tokens = min(float(self._burst), tokens + (now - since) / self._interval)
        if tokens < 1.0:
            self._kinds[kind] = (tokens, now, suppressed + 1)
            return False
        self._kinds[kind] = (tokens - 1.0, now, 0)
        if suppressed:
            message += " (%d more like this suppressed)"
            args = (*args, suppressed)
        self._logger.log(level, message, *args, exc_info=exc_info)
        return True

    def reset(self) -> None:
        """Forget what was logged (tests; and past MAX_KINDS kinds)."""
        self._kinds.clear()

    def warning(
        self, kind: str, message: str, *args: object, exc_info: BaseException | None = None
    ) -> bool:
        return self.log(logging.WARNING, kind, message, *args, exc_info=exc_info)

    def error(
        self, kind: str, message: str, *args: object, exc_info: BaseException | None = None
    ) -> bool:
        return self.log(logging.ERROR, kind, message, *args, exc_info=exc_info)
