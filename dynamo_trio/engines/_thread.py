"""The thread bridge: a blocking engine stepping in a thread, streamed to a trio handler.

A blocking engine cannot be cancelled from outside, only asked between two steps
to end.  Each request gets a thread of its own, always joined before the handler
returns, and a :class:`StopFlag` the engine polls between steps (true once the
request is stopped or killed, or the handler is gone).  ``emit(item)`` blocks
until the handler takes the item, so a slow client slows the engine; see
docs/engines.md.
"""

from __future__ import annotations

import logging
import threading
from contextlib import suppress
from typing import TYPE_CHECKING, Generic, TypeVar, final

import trio

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, Callable, Iterable

    from .._context import Context

_log = logging.getLogger("dynamo_trio.engines")

T = TypeVar("T")


@final
class Abandoned(Exception):
    """Raised by :class:`Emit` in the engine's thread: the handler is gone, stop now."""


@final
class StopFlag:
    """Whether the engine should end its generation; safe to call from any thread.

    True once the request's context is stopped or killed, or the handler's
    stream was left (:attr:`abandoned`).  Poll it between steps (a
    transformers ``StoppingCriteria`` calls it after each token).
    """

    __slots__ = ("_abandoned", "_context")

    def __init__(self, context: Context | None = None) -> None:
        self._context = context
        self._abandoned = threading.Event()

    def __call__(self) -> bool:
        return self._abandoned.is_set() or (
            self._context is not None and self._context.is_stopped()
        )

    @property
    def abandoned(self) -> bool:
        """The handler left: nothing the engine produces now is read."""
        return self._abandoned.is_set()

    def abandon(self) -> None:
        """Declare the handler gone (the bridge does this when its stream ends)."""
        self._abandoned.set()


@final
class Emit(Generic[T]):
    """``emit(item)``: hand one item to the handler, from the engine's thread.

    Blocks until the handler has taken it.  Raises :class:`Abandoned` if the
    handler is gone (then the engine should return at once).
    """

    __slots__ = ("_flag", "_send", "_token")

    def __init__(
        self, send: trio.MemorySendChannel[T], flag: StopFlag, token: trio.lowlevel.TrioToken
    ) -> None:
        self._send = send
        self._flag = flag
        self._token = token

    def __call__(self, item: T) -> None:
        if self._flag.abandoned:
            raise Abandoned
        try:
            trio.from_thread.run(self._send.send, item, trio_token=self._token)
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio.RunFinishedError):
            raise Abandoned from None
        except trio.Cancelled:  # the trio run is shutting down
            raise Abandoned from None


async def stream_from_thread(
    work: Callable[[Emit[T], StopFlag], object],
    *,
    context: Context | None = None,
    name: str = "dynamo-trio engine",
) -> AsyncGenerator[T, None]:
    """Run ``work(emit, should_stop)`` in a thread of its own; yield what it emits.

    ``work`` is blocking engine code: it calls ``emit(item)`` for each item
    and should return once ``should_stop()`` is true.  Whatever ends this
    generator (the work returning, a kill or any trio cancellation, ``aclose``,
    an exception), the flag is set, the thread is released from a pending
    ``emit`` and joined before the generator finishes: the wait is at most
    one engine step, shielded so that no cancellation can skip it.

    Raises:
        Exception: whatever ``work`` raised, once its thread has ended (the
            runtime turns it into the request's typed error).
    """
    token = trio.lowlevel.current_trio_token()
    flag = StopFlag(context)
    send, receive = trio.open_memory_channel[T](0)
    done = trio.Event()
    failure: list[BaseException] = []

    def finished() -> None:
        send.close()
        done.set()

    def run() -> None:
        try:
            work(Emit(send, flag, token), flag)
        except Abandoned:
            pass
        except BaseException as exc:  # carried to the handler, never lost in the thread
            failure.append(exc)
        finally:
            with suppress(trio.RunFinishedError):
                token.run_sync_soon(finished)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    try:
        async for item in receive:
            yield item
        await done.wait()
    finally:
        flag.abandon()
        receive.close()  # a pending emit raises Abandoned in the thread
        with trio.CancelScope(shield=True):
            await done.wait()
        thread.join()
    if failure:
        raise failure[0]


def iterate_in_thread(
    steps: Callable[[StopFlag], Iterable[T]],
    *,
    context: Context | None = None,
    name: str = "dynamo-trio engine",
) -> AsyncGenerator[T, None]:
    """:func:`stream_from_thread` for an engine that is a blocking iterator.

    ``steps(should_stop)`` is called in the thread and iterated there, one
    item per step.  The iterator decides what a stop means (end now, or end
    with a last item); once the handler is gone it is not stepped again, and
    it is closed (``close()``) in its thread.
    """

    def work(emit: Emit[T], should_stop: StopFlag) -> None:
        iterator = iter(steps(should_stop))
        try:
            for item in iterator:
                emit(item)
                if should_stop.abandoned:
                    return
        finally:
            close = getattr(iterator, "close", None)
            if close is not None:
                close()

    return stream_from_thread(work, context=context, name=name)
