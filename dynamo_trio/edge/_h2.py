"""A fair scheduler for hypercorn's HTTP/2 sending task, in place of its priority tree.

hypercorn sends each HTTP/2 connection's DATA from one task that asks a
``priority.PriorityTree`` which stream goes next, and a stream leaves the tree
only when that task next picks it after it ended.  The tree's weighted queue
puts a newly opened stream at the current level, ahead of a stream that was
passed over while it waited for its app (every pass raises its level).  Under
a steady flow of new streams (a gRPC channel making calls, several in flight)
an ended stream is then passed over for as long as new ones keep coming: the
tree only grows, and at 1000 streams it refuses the next one, which ends the
whole connection with a ``GOAWAY``.  A response with trailers ends its stream
from the app's own task, so every gRPC call leaves such an entry.

:class:`RoundRobin` has the tree's interface (what hypercorn calls of it) and
serves the active streams in turn, first come first served: a stream waits at
most one turn of the others, so an ended one leaves at once, and there is no
limit to reach.  HTTP/2 priority signals are ignored (RFC 9113 deprecates
them); every stream is equal.
"""

from __future__ import annotations

from collections import deque
from typing import Final, final

from priority.priority import DeadlockError, DuplicateStreamError, MissingStreamError

__all__ = ["RoundRobin"]


@final
class RoundRobin:
    """The active streams in turn (see the module docstring)."""

    __slots__ = ("_active", "_queued", "_turns")

    def __init__(self) -> None:
        self._active: dict[int, bool] = {}
        """Every stream in the scheduler: whether it has something to send."""
        self._turns: Final[deque[int]] = deque()
        """The line: active streams in the order they go, and streams blocked or removed
        since they joined it (dropped when they reach its front)."""
        self._queued: Final[set[int]] = set()
        """The streams in the line (each is in it once)."""

    def __len__(self) -> int:
        return len(self._active)

    def insert_stream(
        self,
        stream_id: int,
        depends_on: int | None = None,
        weight: int = 16,
        exclusive: bool = False,
    ) -> None:
        """Add a stream, active (the tree's default).

        Raises:
            priority.DuplicateStreamError: it is already in.
        """
        if stream_id in self._active:
            raise DuplicateStreamError(f"stream {stream_id} is already scheduled")
        self._active[stream_id] = True
        self._join(stream_id)

    def reprioritize(
        self,
        stream_id: int,
        depends_on: int | None = None,
        weight: int = 16,
        exclusive: bool = False,
    ) -> None:
        """Ignored (every stream is equal), but for a stream not in: raises
        ``priority.MissingStreamError``, as the tree does."""
        self._check(stream_id)

    def remove_stream(self, stream_id: int) -> None:
        """Take a stream out (raises ``priority.MissingStreamError`` if it is not in)."""
        self._check(stream_id)
        del self._active[stream_id]

    def block(self, stream_id: int) -> None:
        """The stream has nothing to send (raises ``priority.MissingStreamError``)."""
        self._check(stream_id)
        self._active[stream_id] = False

    def unblock(self, stream_id: int) -> None:
        """The stream has something to send (raises ``priority.MissingStreamError``)."""
        self._check(stream_id)
        self._active[stream_id] = True
        self._join(stream_id)

    def __iter__(self) -> RoundRobin:
        return self

    def __next__(self) -> int:
        """The next active stream; it goes to the back of the line.

        Raises:
            priority.DeadlockError: no stream is active.
        """
        turns = self._turns
        while turns:
            stream_id = turns.popleft()
            if self._active.get(stream_id):
                turns.append(stream_id)
                return stream_id
            self._queued.discard(stream_id)
        raise DeadlockError("no active stream")

    def _join(self, stream_id: int) -> None:
        if stream_id not in self._queued:
            self._queued.add(stream_id)
            self._turns.append(stream_id)

    def _check(self, stream_id: int) -> None:
        if stream_id not in self._active:
            raise MissingStreamError(f"stream {stream_id} is not scheduled")
