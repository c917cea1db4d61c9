"""The asyncio bridge: an asyncio engine on its own event loop, streamed to trio handlers.

:func:`open_asyncio_loop` runs an asyncio loop in a thread owned by the block
that opened it.  :meth:`AsyncioLoop.batches` turns one engine call into a trio
async generator of batches, read at most ``window`` items ahead of the handler,
one wake-up of trio per batch.  A kill, stop or ``aclose`` aborts the request in
the engine (shielded) and closes its generator before the stream ends; see
docs/engines.md.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from contextlib import asynccontextmanager, suppress
from typing import TYPE_CHECKING, Any, Generic, TypeVar, final

import outcome
import trio

from .._errors import EngineShutdown

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable

    from .._context import CancelReason, Context, ContextState

_log = logging.getLogger("dynamo_trio.engines")

T = TypeVar("T")


@final
class _Call(Generic[T]):
    """One coroutine run on the asyncio loop, as seen from trio.

    ``ended`` is set (and ``on_end`` called) in the trio thread once the
    coroutine has really finished on the loop, whatever way: a cancelled call is
    only over when its task is.
    """

    __slots__ = ("_cancelled", "_fn", "_on_end", "_owner", "_result", "_task", "ended")

    def __init__(
        self,
        owner: AsyncioLoop,
        fn: Callable[[], Awaitable[T]],
        on_end: Callable[[], object] | None = None,
    ) -> None:
        self._owner = owner
        self._fn = fn
        self._task: asyncio.Task[outcome.Outcome[T]] | None = None
        self._cancelled = False
        self._result: outcome.Outcome[T] | None = None
        self.ended = trio.Event()
        self._on_end = on_end
        owner._calls.add(self)
        try:
            owner.loop.call_soon_threadsafe(self._start)
        except RuntimeError:  # the loop is closed
            self._finish(outcome.Error(EngineShutdown("the engine's event loop has stopped")))

    def _start(self) -> None:  # on the loop
        if self._cancelled:
            self._owner._from_loop(self._finish, outcome.Error(asyncio.CancelledError()))
            return
        self._task = self._owner.loop.create_task(self._run())
        self._task.add_done_callback(self._done)

    async def _run(self) -> outcome.Outcome[T]:  # on the loop
        try:
            return outcome.Value(await self._fn())
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # carried to trio, whatever it is
            return outcome.Error(exc)

    def _done(self, task: asyncio.Task[outcome.Outcome[T]]) -> None:  # on the loop
        # A task cancelled before its first step never runs its body: only its
        # done callback hears of it.
        result = outcome.Error(asyncio.CancelledError()) if task.cancelled() else task.result()
        self._owner._from_loop(self._finish, result)

    def cancel(self) -> None:
        """Cancel the coroutine on the loop (``ended`` is set once it has unwound)."""
        with suppress(RuntimeError):  # a closed loop has nothing left to cancel
            self._owner.loop.call_soon_threadsafe(self._cancel)

    def _cancel(self) -> None:  # on the loop
        self._cancelled = True
        if self._task is not None:
            self._task.cancel()

    def _finish(self, result: outcome.Outcome[T]) -> None:  # in trio
        if self.ended.is_set():
            return
        self._result = result
        self._owner._calls.discard(self)
        self.ended.set()
        if self._on_end is not None:
            self._on_end()

    def unwrap(self) -> T:
        """The coroutine's result, or its exception raised (a loop that went away while
        it ran is :class:`~dynamo_trio.EngineShutdown`)."""
        assert self._result is not None
        if isinstance(self._result, outcome.Error) and isinstance(
            self._result.error, asyncio.CancelledError
        ):
            raise EngineShutdown("the engine's event loop cancelled the request")
        return self._result.unwrap()


@final
class _Pipe(Generic[T]):
    """One request's items between the loops.

    A task on the loop (:meth:`pump`) reads the engine's generator into
    ``ready`` while fewer than ``window`` items wait there; trio takes them all
    at once (:meth:`take`).  Each side wakes the other only when it waits: trio
    by publishing ``trio_waiting``, the loop by publishing ``_space``.  A side
    publishes before it looks again, and the other looks after it has moved
    (the GIL orders the two), so a wake-up is never lost; one may come twice,
    and a second is harmless.
    """

    __slots__ = (
        "_generate",
        "_notified",
        "_owner",
        "_space",
        "_space_notified",
        "_window",
        "ended",
        "ready",
        "trio_waiting",
    )

    def __init__(
        self, owner: AsyncioLoop, generate: Callable[[], AsyncIterator[T]], window: int
    ) -> None:
        self._owner = owner
        self._generate = generate
        self._window = window
        self.ready: deque[T] = deque()
        # Set on the loop after the last item: Value if the engine ended the stream,
        # Error if it raised.
        self.ended: outcome.Outcome[None] | None = None
        self.trio_waiting: trio.Event | None = None  # written in trio only
        self._notified: trio.Event | None = None  # written on the loop only
        self._space: asyncio.Event | None = None  # written on the loop only
        self._space_notified: asyncio.Event | None = None  # written in trio only

    async def pump(self) -> None:  # on the loop
        iterator: AsyncIterator[T] | None = None
        try:
            try:
                iterator = aiter(self._generate())
                async for item in iterator:
                    self.ready.append(item)
                    self._wake_trio()
                    while len(self.ready) >= self._window:
                        self._space = space = asyncio.Event()
                        if len(self.ready) < self._window:
                            break
                        await space.wait()
                    self._space = None
            finally:
                aclose = getattr(iterator, "aclose", None)
                if aclose is not None:
                    await aclose()
        except Exception as exc:  # the engine's error: raised to the handler after the items
            self.ended = outcome.Error(exc)
        else:
            self.ended = outcome.Value(None)

    def _wake_trio(self) -> None:  # on the loop
        waiting = self.trio_waiting
        if waiting is not None and waiting is not self._notified:
            self._notified = waiting
            self._owner._wake_soon(waiting)

    def take(self) -> list[T]:  # in trio
        """Every item read so far (maybe none); makes room for the loop to read on."""
        batch: list[T] = []
        with suppress(IndexError):
            while True:
                batch.append(self.ready.popleft())
        space = self._space
        if space is not None and space is not self._space_notified:
            self._space_notified = space
            with suppress(RuntimeError):  # a closed loop reads nothing more
                self._owner.loop.call_soon_threadsafe(space.set)
        return batch

    def wake(self) -> None:  # in trio
        if self.trio_waiting is not None:
            self.trio_waiting.set()


@final
class AsyncioLoop:
    """An asyncio event loop in a dedicated thread; open it with :func:`open_asyncio_loop`.

    Its methods are called from trio.  The asyncio side sees a normal running
    loop (``asyncio.get_running_loop()`` works in the coroutines it runs), so
    an engine is created and used there unchanged.
    """

    __slots__ = ("_calls", "_flush_scheduled", "_token", "_wakes", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop, token: trio.lowlevel.TrioToken) -> None:
        self.loop = loop
        self._token = token
        self._calls: set[_Call[Any]] = set()
        self._wakes: list[trio.Event] = []  # on the loop only
        self._flush_scheduled = False  # on the loop only

    def _from_loop(self, fn: Callable[..., object], *args: Any) -> None:
        with suppress(trio.RunFinishedError):
            self._token.run_sync_soon(fn, *args)

    def _wake_soon(self, event: trio.Event) -> None:  # on the loop
        """Set ``event`` in trio at the end of this loop pass: the streams an engine
        step fed all wake trio in one hop."""
        self._wakes.append(event)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush_wakes)

    def _flush_wakes(self) -> None:  # on the loop
        self._flush_scheduled = False
        wakes, self._wakes = self._wakes, []
        self._from_loop(_set_all, wakes)

    async def run(self, fn: Callable[[], Awaitable[T]]) -> T:
        """``await fn()`` on the loop and return its result (or raise its exception).

        A trio cancellation cancels the coroutine on the loop and waits until it
        has unwound before it propagates.
        """
        call = _Call(self, fn)
        try:
            await call.ended.wait()
        finally:
            if not call.ended.is_set():
                call.cancel()
                with trio.CancelScope(shield=True):
                    await call.ended.wait()
        return call.unwrap()

    async def _settle(self, call: _Call[object], what: str) -> None:
        """Wait, shielded, for ``call`` to end on the loop; a failure is logged, not raised."""
        with trio.CancelScope(shield=True):
            await call.ended.wait()
            try:
                call.unwrap()
            except EngineShutdown:
                _log.debug("the engine's %s did not run: its event loop has stopped", what)
            except Exception:
                _log.exception("the engine's %s failed", what)

    async def batches(
        self,
        generate: Callable[[], AsyncIterator[T]],
        *,
        abort: Callable[[], Awaitable[object]] | None = None,
        context: Context | None = None,
        window: int = 16,
    ) -> AsyncGenerator[list[T], None]:
        """Stream what ``generate()`` (an asyncio async iterator) yields, in batches.

        Args:
            generate: Called on the loop to start the engine's stream for this
                request (e.g. ``lambda: engine.generate(prompt, params, rid)``).
            abort: Called on the loop whenever the stream ends before the
                engine ended it (e.g. ``lambda: engine.abort(rid)``).
            context: The request's context: a stop ends the stream early (no
                error), a kill cancels the handler and so this stream.
            window: At most this many items are read from the engine and not
                yet handed over (a slow client slows the engine).

        Each batch is every item read since the last one (never empty, in the
        engine's order).  An exception the engine raises comes after the items
        it yielded before; a loop that went away is
        :class:`~dynamo_trio.EngineShutdown`.  Use it as ``batches =
        loop.batches(...)`` and ``await batches.aclose()`` in a ``finally``, so
        that leaving the handler early closes it at once.
        """
        if window < 1:
            raise ValueError("window must be at least 1")
        pipe = _Pipe(self, generate, window)
        pump: _Call[None] | None = None
        aborting: _Call[object] | None = None
        completed = False

        def on_cancel(context: Context, _state: ContextState, _reason: CancelReason) -> None:
            # A kill reaches the engine now, not after the handler has unwound; the
            # stream still ends only once the abort has.
            nonlocal aborting
            started = pump is not None and pipe.ended is None
            if started and context.is_killed() and abort is not None and aborting is None:
                aborting = _Call(self, abort)
            pipe.wake()

        if context is not None:
            context.add_cancel_callback(on_cancel)
        try:
            while context is None or not context.is_stopped():
                if pump is None:  # started once the handler asks, unless stopped before
                    pump = _Call(self, pipe.pump, pipe.wake)
                if pump.ended.is_set() and pipe.ended is None:
                    pump.unwrap()  # the loop went away: what it read is dropped
                batch = pipe.take()
                if batch:
                    await trio.lowlevel.checkpoint_if_cancelled()
                    yield batch
                    continue
                if pump.ended.is_set():
                    assert pipe.ended is not None
                    pipe.ended.unwrap()  # the engine's error
                    completed = True
                    return
                pipe.trio_waiting = waiting = trio.Event()
                if not pipe.ready and not pump.ended.is_set():
                    await waiting.wait()
                pipe.trio_waiting = None
            if context.is_killed():
                # kill() marks the context before its scope's cancellation is
                # delivered: take the Cancelled here, rather than end as a stop.
                await trio.lowlevel.checkpoint()
        finally:
            if context is not None:
                context.remove_cancel_callback(on_cancel)
            with trio.CancelScope(shield=True):
                if aborting is None and not completed and abort is not None:
                    aborting = _Call(self, abort)
                if aborting is not None:
                    await self._settle(aborting, "abort")
                if pump is not None and not pump.ended.is_set():
                    pump.cancel()
                    await pump.ended.wait()

    async def stream(
        self,
        generate: Callable[[], AsyncIterator[T]],
        *,
        abort: Callable[[], Awaitable[object]] | None = None,
        context: Context | None = None,
        window: int = 16,
    ) -> AsyncGenerator[T, None]:
        """:meth:`batches`, item by item (the same arguments): a stop or a kill in
        the middle of a batch drops the rest of it."""
        batches = self.batches(generate, abort=abort, context=context, window=window)
        try:
            async for batch in batches:
                for item in batch:
                    if context is not None and context.is_stopped():
                        if context.is_killed():
                            await trio.lowlevel.checkpoint()  # the kill's Cancelled
                        return
                    await trio.lowlevel.checkpoint_if_cancelled()
                    yield item
        finally:
            await batches.aclose()


@asynccontextmanager
async def open_asyncio_loop(name: str = "dynamo-trio asyncio") -> AsyncIterator[AsyncioLoop]:
    """Run an asyncio event loop in a thread named ``name`` for the duration of the block.

    On exit (normal, error or cancellation) every task still on the loop is
    cancelled and awaited, async generators and the default executor are shut
    down, the loop stops and its thread is joined, shielded from cancellation.
    """
    token = trio.lowlevel.current_trio_token()
    loop = asyncio.new_event_loop()
    bridge = AsyncioLoop(loop, token)
    ended = trio.Event()

    def thread_ended() -> None:
        ended.set()
        for call in tuple(bridge._calls):  # the loop will never finish them now
            call._finish(outcome.Error(EngineShutdown("the engine's event loop has stopped")))

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:
            with suppress(trio.RunFinishedError):
                token.run_sync_soon(thread_ended)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    try:
        yield bridge
    finally:
        with trio.CancelScope(shield=True):
            try:
                await bridge.run(_shutdown)
            except Exception:
                _log.exception("shutting the asyncio loop down failed")
            with suppress(RuntimeError):
                loop.call_soon_threadsafe(loop.stop)
            await ended.wait()
            thread.join()
            loop.close()


def _set_all(events: list[trio.Event]) -> None:  # in trio
    for event in events:
        event.set()


async def _shutdown() -> None:
    """On the loop: cancel and await every other task, then shut generators and executor."""
    current = asyncio.current_task()
    tasks = [task for task in asyncio.all_tasks() if task is not current]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    loop = asyncio.get_running_loop()
    await loop.shutdown_asyncgens()
    await loop.shutdown_default_executor()
