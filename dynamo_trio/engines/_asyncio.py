"""The asyncio bridge: an asyncio engine on its own event loop, streamed to trio handlers.

An asyncio engine (vLLM's ``AsyncLLM``, SGLang) gives an async generator per
request and an ``abort(request_id)`` coroutine.  :func:`open_asyncio_loop`
runs an asyncio event loop in a thread of its own for the life of the worker
(the block that opened it owns it: leaving the block, however it is left,
cancels what still runs on the loop, stops it and joins its thread).
:meth:`AsyncioLoop.stream` turns one engine call into a trio async generator:

- each item is fetched on demand (one ``__anext__`` on the loop per item the
  handler asks for), so the engine's stream is read no faster than the
  client reads (backpressure), and items never pile up between the loops;
- a **kill**, or any trio cancellation of the handler, ends the stream at
  once; a **stop** (``context.is_stopped()``) ends it at once too, without
  an error, so the handler can still yield a last item with the usage so far;
- in both cases, and for ``aclose``, an exception in the bridge or the
  engine, or the worker shutting down, the engine's ``abort`` is scheduled on
  the loop at once and awaited (shielded: no cancellation can skip it), then
  the engine's generator is closed, all before the stream ends.  Only a
  stream the engine ended on its own is not aborted;
- an exception the engine raises is raised to the handler, which makes it the
  request's typed error; the worker goes on.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from contextlib import asynccontextmanager, suppress
from typing import TYPE_CHECKING, Any, Generic, TypeVar, final

import outcome
import trio

from .._errors import EngineShutdown

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable

    from .._context import CancelReason, Context, ContextState

__all__ = ["AsyncioLoop", "open_asyncio_loop"]

_log = logging.getLogger("dynamo_trio.engines")

T = TypeVar("T")


@final
class _End:
    """The engine's stream ended on its own."""


_END = _End()


@final
class _Call(Generic[T]):
    """One coroutine run on the asyncio loop, as seen from trio.

    ``ended`` (and ``wake``) are set in the trio thread once the coroutine has
    really finished on the loop, whatever way: a cancelled call is only over
    when its task is.
    """

    __slots__ = ("_cancelled", "_fn", "_owner", "_result", "_task", "ended", "wake")

    def __init__(
        self, owner: AsyncioLoop, fn: Callable[[], Awaitable[T]], wake: trio.Event | None = None
    ) -> None:
        self._owner = owner
        self._fn = fn
        self._task: asyncio.Task[outcome.Outcome[T]] | None = None
        self._cancelled = False
        self._result: outcome.Outcome[T] | None = None
        self.ended = trio.Event()
        self.wake = wake
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
        if self.wake is not None:
            self.wake.set()

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
class _Pump(Generic[T]):
    """The engine's generator for one request; its methods run on the loop."""

    __slots__ = ("_generate", "_iterator")

    def __init__(self, generate: Callable[[], AsyncIterator[T]]) -> None:
        self._generate = generate
        self._iterator: AsyncIterator[T] | None = None

    async def next(self) -> T | _End:
        if self._iterator is None:
            self._iterator = aiter(self._generate())
        try:
            return await anext(self._iterator)
        except StopAsyncIteration:
            return _END

    async def aclose(self) -> None:
        aclose = getattr(self._iterator, "aclose", None)
        if aclose is not None:
            await aclose()


@final
class AsyncioLoop:
    """An asyncio event loop in a dedicated thread; open it with :func:`open_asyncio_loop`.

    Its methods are called from trio.  The asyncio side sees a normal running
    loop (``asyncio.get_running_loop()`` works in the coroutines it runs), so
    an engine is created and used there unchanged.
    """

    __slots__ = ("_calls", "_token", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop, token: trio.lowlevel.TrioToken) -> None:
        self.loop = loop
        self._token = token
        self._calls: set[_Call[Any]] = set()

    def _from_loop(self, fn: Callable[..., object], *args: Any) -> None:
        with suppress(trio.RunFinishedError):
            self._token.run_sync_soon(fn, *args)

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

    async def _settle(self, fn: Callable[[], Awaitable[object]], what: str) -> None:
        """Run ``fn`` on the loop to its end, shielded; a failure is logged, not raised."""
        with trio.CancelScope(shield=True):
            call = _Call(self, fn)
            await call.ended.wait()
            try:
                call.unwrap()
            except EngineShutdown:
                _log.debug("the engine's %s did not run: its event loop has stopped", what)
            except Exception:
                _log.exception("the engine's %s failed", what)

    async def stream(
        self,
        generate: Callable[[], AsyncIterator[T]],
        *,
        abort: Callable[[], Awaitable[object]] | None = None,
        context: Context | None = None,
    ) -> AsyncGenerator[T, None]:
        """Stream what ``generate()`` (an asyncio async iterator) yields, on the loop.

        Args:
            generate: Called on the loop to start the engine's stream for this
                request (e.g. ``lambda: engine.generate(prompt, params, rid)``).
            abort: Called on the loop whenever the stream ends before the
                engine ended it (e.g. ``lambda: engine.abort(rid)``).
            context: The request's context: a stop ends the stream early (no
                error), a kill cancels the handler and so this stream.

        Use it as ``items = loop.stream(...)`` and ``await items.aclose()`` in
        a ``finally``, so that leaving the handler early closes it at once.
        """
        pump = _Pump(generate)
        wake = trio.Event()
        step: _Call[T | _End] | None = None
        completed = False

        def on_cancel(_context: Context, _state: ContextState, _reason: CancelReason) -> None:
            wake.set()

        if context is not None:
            context.add_cancel_callback(on_cancel)
        try:
            while context is None or not context.is_stopped():
                wake = trio.Event()
                step = _Call(self, pump.next, wake)
                await wake.wait()
                if not step.ended.is_set():
                    break  # stopped while the engine was working on the next item
                item = step.unwrap()
                step = None
                if isinstance(item, _End):
                    completed = True
                    return
                yield item
            if context is not None and context.is_killed():
                # kill() marks the context before its scope's cancellation is
                # delivered: take the Cancelled here, rather than end as a stop.
                await trio.lowlevel.checkpoint()
        finally:
            if context is not None:
                context.remove_cancel_callback(on_cancel)
            with trio.CancelScope(shield=True):
                if not completed and abort is not None:
                    await self._settle(abort, "abort")
                if step is not None and not step.ended.is_set():
                    step.cancel()
                    await step.ended.wait()
                await self._settle(pump.aclose, "stream's aclose")


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
