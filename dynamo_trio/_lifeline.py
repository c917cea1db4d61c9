"""Child processes that go down with their supervisor, however the supervisor ends.

Each child gets a *lifeline*: a pipe's read end, whose only write end the supervisor
holds and never writes; when the supervisor dies (SIGKILL included) the child reads
end-of-file and shuts down as on SIGTERM.  (``PR_SET_PDEATHSIG`` fires when the
*thread* that started the child exits, and trio starts processes from passing threads.)
"""

from __future__ import annotations

import contextlib
import os
import stat
from typing import TYPE_CHECKING, Any, Final

import trio

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

LIFELINE_ENV: Final = "DYN_LIFELINE_FD"
"""Names, in a child's environment, the descriptor of its lifeline (set by its supervisor)."""


@contextlib.contextmanager
def lifeline(env: Mapping[str, str]) -> Iterator[dict[str, Any]]:
    """The ``env`` and ``pass_fds`` options of one child's ``open_process``, with a lifeline;
    the supervisor's end stays open for the block (close-on-exec: no other child inherits it)."""
    read, write = os.pipe()
    try:
        yield {"env": {**env, LIFELINE_ENV: str(read)}, "pass_fds": (read,)}
    finally:
        os.close(read)
        os.close(write)


def take_lifeline() -> int | None:
    """This process's lifeline, if its supervisor gave it one (the variable is removed,
    so that the processes this one starts do not take it for their own)."""
    raw = os.environ.pop(LIFELINE_ENV, "")
    try:
        return int(raw) if raw.isdigit() and stat.S_ISFIFO(os.fstat(int(raw)).st_mode) else None
    except OSError:
        return None


async def parent_gone(fd: int) -> None:
    """Return once the supervisor holding the other end of lifeline ``fd`` is gone
    (the descriptor is then closed)."""
    async with trio.lowlevel.FdStream(fd) as stream:
        while await stream.receive_some(1):
            pass  # nothing is ever written; whatever is, is not the end
