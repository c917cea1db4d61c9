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
        self._tokens: dict[str, tuple[float, float]] = {}  # kind -> (tokens, as of when)
        self._suppressed: dict[str, int] = {}

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
        if kind not in self._tokens and len(self._tokens) >= MAX_KINDS:
            self.reset()
        tokens, since = self._tokens.get(kind, (float(self._burst), now))
        tokens = min(float(self._burst), tokens + (now - since) / self._interval)
        if tokens < 1.0:
            self._tokens[kind] = (tokens, now)
            self._suppressed[kind] = self._suppressed.get(kind, 0) + 1
            return False
        self._tokens[kind] = (tokens - 1.0, now)
        suppressed = self._suppressed.pop(kind, 0)
        if suppressed:
            message += " (%d more like this suppressed)"
            args = (*args, suppressed)
        self._logger.log(level, message, *args, exc_info=exc_info)
        return True

    def reset(self) -> None:
        """Forget what was logged (tests; and past MAX_KINDS kinds)."""
        self._tokens.clear()
        self._suppressed.clear()

    def warning(
        self, kind: str, message: str, *args: object, exc_info: BaseException | None = None
    ) -> bool:
        return self.log(logging.WARNING, kind, message, *args, exc_info=exc_info)

    def error(
        self, kind: str, message: str, *args: object, exc_info: BaseException | None = None
    ) -> bool:
        return self.log(logging.ERROR, kind, message, *args, exc_info=exc_info)
