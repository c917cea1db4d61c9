"""Calling an endpoint: a child context linked under the caller's (its deadline, stop and
kill reach the worker as frames), sent where the router chooses, read as a ResponseStream of
Annotated items."""

from __future__ import annotations

import functools
import math
import time
from typing import TYPE_CHECKING, Any, Final, Literal, Self, TypeVar, final, overload

import trio

from .._context import CancelReason, Context, ContextState, find_cancelled, reason_for_cancelled
from .._errors import (
    Cancelled,
    CannotConnect,
    Disconnected,
    DynamoError,
    EngineShutdown,
    NoInstances,
    ResponseTimeout,
    StreamIncomplete,
)
from .._logcontext import current_request
from .._tracing import check_metadata, request_headers
from ..request_plane import ClientStream

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from types import TracebackType

    from .._config import RouterMode
    from .._tracing import TraceContext
    from ..discovery import Instance, PrefixView
    from ..request_plane import ClientConnection
    from ._router import Router, Target

_R = TypeVar("_R")

_CONNECT_ATTEMPTS: Final = 3  # distinct instances a routed call tries on CannotConnect


@final
class Annotated:
    """One item of a response stream: JSON-like ``data`` and SSE ``id``/``event``/``comment``;
    handlers may yield plain values (they become ``data``) or an ``Annotated``."""

    __slots__ = ("_data", "comment", "event", "id")

    def __init__(
        self,
        data: Any = None,
        *,
        id: str | None = None,
        event: str | None = None,
        comment: list[str] | None = None,
    ) -> None:
        self._data = data
        self.id = id
        self.event = event
        self.comment = comment

    def data(self) -> Any:
        """The item's value (a method, as in Dynamo's Python bindings)."""
        return self._data

    def comments(self) -> list[str] | None:
        """The comment lines (Dynamo's method name; also the :attr:`comment` attribute)."""
        return self.comment

    def is_error(self) -> bool:
        """Always false: an error ends a stream by raising, as in Dynamo."""
        return False

    def __repr__(self) -> str:
        extras = "".join(
            f", {name}={value!r}"
            for name, value in (("id", self.id), ("event", self.event), ("comment", self.comment))
            if value is not None
        )
        return f"Annotated({self._data!r}{extras})"

    def _fields(self) -> tuple[Any, str | None, str | None, list[str] | None]:
        return self._data, self.id, self.event, self.comment

    def __eq__(self, other: object) -> bool:
        return self._fields() == other._fields() if isinstance(other, Annotated) else NotImplemented

    __hash__ = None  # type: ignore[assignment]


class ResponseStream:
    """The items of one call, as an async iterator of :class:`Annotated`; closing kills the call.
    Iteration ends cleanly only when the stream ended as this caller wanted
    (``docs/cancellation.md`` tabulates the endings and what leaving early does)."""

    def __init__(
        self,
        context: Context,
        stream: ClientStream | None,
        *,
        instance_id: int | None,
        on_lost: Callable[[str], None] | None = None,
    ) -> None:
        self.context: Final = context
        """The call's own context (a child of the caller's, with the same id)."""
        self._stream = stream
        self._on_lost = on_lost
        self.instance_id: Final = instance_id
        """The instance serving the call (``None`` if nothing was sent)."""
        self._done = stream is None
        if stream is None:
            context.finish()
            return

        # The callback holds the wire stream, not self, so that dropping self finalises it.
        def on_cancel(context: Context, state: ContextState, reason: CancelReason) -> None:
            if state is ContextState.KILLED:
                stream.kill(reason)
            else:
                stream.stop(reason)

        self._cancel_callback = on_cancel
        context.add_cancel_callback(on_cancel)
        if context.is_stopped():  # cancelled while we were connecting
            on_cancel(context, context.state, context.reason or CancelReason.KILL_REQUESTED)

    @property
    def end_reason(self) -> str | None:
        """The reason in the worker's ``stopped``/``killed`` terminal frame, if any."""
        return None if self._stream is None else self._stream.end_reason

    @property
    def outcome(self) -> str | None:
        """``complete``, ``stopped`` or ``killed``; ``None`` while running or if none was sent."""
        if self._stream is None:
            return None
        if self._stream.outcome is None and self.context.is_killed():
            return "killed"
        return self._stream.outcome

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Annotated:
        item = await self.receive()
        if item is None:
            raise StopAsyncIteration
        return item

    async def receive(self, *, idle_timeout: float | None = None) -> Annotated | None:
        """The next item, or ``None`` once the stream has ended; nothing for ``idle_timeout``
        seconds kills the call (``inactivity``) and raises :class:`~dynamo_trio.ResponseTimeout`."""
        frame = await self._next(ClientStream.receive, idle_timeout)
        if frame is None:
            return None
        return Annotated(frame.data, id=frame.id, event=frame.event, comment=frame.comment)

    async def receive_batch(
        self, *, idle_timeout: float | None = None, keep_if_cancelled: bool = False
    ) -> list[Any]:
        """The data of every item that has arrived (at least one, annotations dropped);
        ``[]`` once ended, or when :meth:`nudge` woke the wait (then :attr:`done` is false).
        ``keep_if_cancelled``: a cancellation while waiting leaves the stream open."""
        frames = await self._next(ClientStream.receive_many, idle_timeout, keep_if_cancelled)
        return [] if frames is None else [frame.data for frame in frames]

    def nudge(self) -> None:
        """Make a :meth:`receive_batch` waiting for items (now or next) return ``[]``."""
        if self._stream is not None and not self._done:
            self._stream.nudge()

    @property
    def done(self) -> bool:
        """The stream has ended (or was abandoned): nothing more will be received."""
        return self._done

    async def _next(
        self,
        receive: Callable[[ClientStream], Awaitable[_R | None]],
        idle_timeout: float | None = None,
        keep_if_cancelled: bool = False,
    ) -> _R | None:
        stream = self._stream
        if stream is None or self._done:
            await trio.lowlevel.checkpoint()
            return None
        context = self.context
        try:
            deadline = context.deadline
            if deadline is None and idle_timeout is None:
                got = await receive(stream)
            else:
                now = trio.current_time()
                wake_at = math.inf if deadline is None else now + (deadline - time.monotonic())
                if idle_timeout is not None:
                    wake_at = min(wake_at, now + idle_timeout)
                with trio.move_on_at(wake_at) as waiting:
                    got = await receive(stream)
                # Past the deadline (reading the state kills), or silent too long: kill.
                if waiting.cancelled_caught:
                    if not context.is_killed():
                        context.kill(CancelReason.INACTIVITY)
                    got = await receive(stream)
        except DynamoError as exc:
            self._finish()
            if context.is_stopped():
                return None  # we cancelled; how it ended is moot
            if isinstance(exc, Disconnected) and self._on_lost is not None:
                self._on_lost(str(exc))
            raise
        except BaseException as exc:  # the consumer was cancelled (or failed) while waiting
            if not (keep_if_cancelled and isinstance(exc, trio.Cancelled)):
                self._abandon(_abandon_reason(exc))
            raise
        if got is None:
            self._ended(stream)
            if context.reason is CancelReason.INACTIVITY and idle_timeout is not None:
                raise ResponseTimeout(f"the worker sent nothing for {idle_timeout:g}s")
        return got

    def _ended(self, stream: ClientStream) -> None:
        """Raise unless the worker ended the stream as this caller asked."""
        self._finish()
        context = self.context
        if context.is_killed():
            return  # ours: nothing more was wanted
        outcome, reason = stream.outcome, stream.end_reason or "unknown"
        if context.is_stopped():
            if outcome == "killed":
                raise StreamIncomplete(f"the worker cut the drain short ({reason})")
            return
        if outcome == "killed":
            if reason == CancelReason.SHUTDOWN.value:
                raise EngineShutdown(f"the worker shut down during the request ({reason})")
            raise Cancelled(f"the worker cancelled the request ({reason})")
        if outcome == "stopped" and reason == CancelReason.SHUTDOWN.value:
            raise StreamIncomplete("the worker stopped the request to shut down")

    def _finish(self) -> None:
        if not self._done:
            self._done = True
            self.context.remove_cancel_callback(self._cancel_callback)
            self.context.finish()

    def _abandon(self, reason: CancelReason = CancelReason.STREAM_CLOSED) -> None:
        if not self._done and self._stream is not None and not self._stream.done:
            self.context.kill(reason)
        self._finish()

    async def aclose(self) -> None:
        """Close the stream; if the worker is still producing, kill its work now."""
        self._abandon()
        await trio.lowlevel.checkpoint()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._abandon(CancelReason.STREAM_CLOSED if exc is None else _abandon_reason(exc))

    def __del__(self) -> None:
        # Dropped unclosed: kill the work (thread-safe), unless stopped: then let it drain.
        if not self._done and self._stream is not None and not self._stream.done:
            if self.context.is_stopped():
                self.context._run_in_trio(self._stream.discard)
            else:
                self.context.kill(CancelReason.STREAM_CLOSED)


@final
class DataStream(ResponseStream):
    """A :class:`ResponseStream` of each item's data (``annotated=False``); as in Dynamo,
    annotation-only items are skipped."""

    async def __anext__(self) -> Any:
        while True:
            item = await super().__anext__()
            data = item.data()
            if data is None and (item.id is not None or item.event is not None or item.comment):
                continue
            return data


def _abandon_reason(exc: BaseException) -> CancelReason:
    """Why a stream left by ``exc`` is killed: a cancelled consumer scope, or just closed."""
    cancelled = find_cancelled(exc)
    return CancelReason.STREAM_CLOSED if cancelled is None else reason_for_cancelled(cancelled)


@final
class Client:
    """Calls one endpoint's instances, as Dynamo's ``Client``; the router chooses which."""

    def __init__(
        self,
        path: str,
        view: PrefixView[Instance],
        router: Router,
        connect: Callable[[str], Awaitable[ClientConnection]],
    ) -> None:
        self._path = path
        self._view = view
        self._router = router
        self._connect = connect

    def _instances(self) -> dict[int, Instance]:
        return {instance.instance_id: instance for instance in self._view.items().values()}

    def targets(self) -> dict[Target, str]:
        """``{(path, instance id): address}`` of the listed instances, by id."""
        instances = self._instances()
        self._router.forget(self._path, instances)
        return {(self._path, i): instances[i].address for i in sorted(instances)}

    def instance_ids(self) -> list[int]:
        """Ids of the instances discovery currently lists for the endpoint, sorted."""
        return sorted(self._instances())

    async def wait_for_instances(self) -> list[int]:
        """Wait until at least one instance is registered; return their ids."""
        await self._view.wait_until(bool)
        return self.instance_ids()

    def live_instance_ids(self) -> list[int]:
        """Ids of the instances in rotation (not out after a recent failure), sorted."""
        return [target[1] for target in self._router.live(self.targets())]

    async def wait_for_instance(self, instance_id: int) -> None:
        """Wait until discovery lists the instance ``instance_id`` for this endpoint."""
        await self._view.wait_until(
            lambda items: any(i.instance_id == instance_id for i in items.values())
        )

    @overload
    async def random(
        self, request: Any, annotated: Literal[True] = True, context: Context | None = None
    ) -> ResponseStream: ...
    @overload
    async def random(
        self, request: Any, annotated: bool | None, context: Context | None = None
    ) -> ResponseStream | DataStream: ...
    async def random(
        self, request: Any, annotated: bool | None = True, context: Context | None = None
    ) -> ResponseStream | DataStream:
        """Send ``request`` to a random live instance."""
        return await self._routed(request, _stream_type(annotated), context, "random")

    generate = random
    """Same as :meth:`random` (Dynamo's default)."""

    @overload
    async def round_robin(
        self, request: Any, annotated: Literal[True] = True, context: Context | None = None
    ) -> ResponseStream: ...
    @overload
    async def round_robin(
        self, request: Any, annotated: bool | None, context: Context | None = None
    ) -> ResponseStream | DataStream: ...
    async def round_robin(
        self, request: Any, annotated: bool | None = True, context: Context | None = None
    ) -> ResponseStream | DataStream:
        """Send ``request`` to the next live instance in turn."""
        return await self._routed(request, _stream_type(annotated), context, "round-robin")

    @overload
    async def direct(
        self,
        request: Any,
        instance_id: int,
        annotated: Literal[True] = True,
        context: Context | None = None,
    ) -> ResponseStream: ...
    @overload
    async def direct(
        self, request: Any, instance_id: int, annotated: bool | None, context: Context | None = None
    ) -> ResponseStream | DataStream: ...
    async def direct(
        self,
        request: Any,
        instance_id: int,
        annotated: bool | None = True,
        context: Context | None = None,
    ) -> ResponseStream | DataStream:
        """Send ``request`` to one instance (``NoInstances`` if it is not listed)."""
        return await self._routed(request, _stream_type(annotated), context, instance_id)

    async def _routed(
        self,
        request: Any,
        stream_type: type[ResponseStream],
        context: Context | None,
        to: RouterMode | int,
    ) -> ResponseStream:
        """Send where the router chooses in mode ``to``, or to the instance ``to``, under a child
        of ``context`` in its trace (else the current request's)."""
        if context is None:
            child = Context(trace=_current_trace())
        elif context.is_stopped():
            return stream_type(Context(context.id()), None, instance_id=None)
        else:
            metadata = context.metadata.copy()
            check_metadata(metadata)
            child = Context(context.id(), metadata, trace=context.trace or _current_trace())
            context.link_child(child)
        addresses: dict[Target, str] = {}

        async def targets() -> dict[Target, str]:
            addresses.update(self.targets())
            return addresses

        async def send(target: Target) -> ResponseStream:
            instance_id = target[1]
            try:
                connection = await self._connect(addresses[target])
            except CannotConnect as exc:
                self._router.failed(target, str(exc))
                raise
            self._router.connected(target)
            if child.is_stopped():
                return stream_type(child, None, instance_id=None)
            child.attributes.update(endpoint=self._path, instance=f"{instance_id:x}")
            remaining = child.time_remaining()
            try:
                stream = connection.open_stream(
                    endpoint=self._path,
                    instance_id=instance_id,
                    request_id=child.id(),
                    payload=request,
                    timeout=None if remaining is None or math.isinf(remaining) else remaining,
                    headers=request_headers(child.trace, child.metadata.copy()),
                )
            except (Disconnected, EngineShutdown) as exc:
                self._router.failed(target, str(exc))
                raise CannotConnect(str(exc)) from None
            on_lost = functools.partial(self._router.failed, target)
            return stream_type(child, stream, instance_id=instance_id, on_lost=on_lost)

        try:  # on any error, the call is over: finish its context
            if isinstance(to, int):
                if (self._path, to) not in await targets():
                    raise NoInstances(f"no instance {to:x} serves {self._path}")
                return await send((self._path, to))
            return await self._router.send(
                targets,
                send,
                set(),
                mode=to,
                turn=self._path,
                attempts=_CONNECT_ATTEMPTS,
                nobody=f"no live instance serves {self._path}",
            )
        except BaseException:
            child.finish()
            raise


def _stream_type(annotated: object) -> type[ResponseStream]:
    """The stream for Dynamo's ``annotated``: ``True``, ``False``, or ``None`` (``False``)."""
    if annotated is None or isinstance(annotated, bool):
        return ResponseStream if annotated else DataStream
    raise TypeError(
        f"annotated must be a bool or None, not {type(annotated).__name__}"
        + (": pass the context as context=..." if isinstance(annotated, Context) else "")
    )


def _current_trace() -> TraceContext | None:
    request = current_request()
    return None if request is None else request.trace
