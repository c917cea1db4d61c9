"""Calling an endpoint: instance selection, linked contexts, and response streams.

A call ``client.round_robin(request, context=ctx)``:

1. sends nothing, and returns an already-ended stream, if ``ctx`` is stopped
   or killed;
2. makes a child context with the same request id and links it under ``ctx``
   (so the child inherits ``ctx``'s deadline, and stopping or killing ``ctx``
   reaches it);
3. picks a live instance (skipping ones out of rotation, see below),
   connects through the runtime's pool if needed, and sends the request;
4. returns a :class:`ResponseStream` wired to the child context: ``stop`` on
   the child sends a ``stop`` control frame and the stream drains to its
   terminal frame; ``kill`` sends ``kill`` and ends the stream at once.

The stream belongs to the scope of the context it was opened with: when
``ctx.scope()`` is left (normally, by an error, or by a cancellation) while
the stream is unfinished, the child is killed at that moment (reason ``parent
finished``, or the enclosing scope's ``scope timeout``/``scope cancelled``)
and a ``ctl kill`` goes out at once.  Leaving the stream early (``aclose()``,
leaving ``async with``) kills the child immediately with reason ``stream
closed``; a consumer whose own scope is cancelled while it waits for an item
kills it with that scope's reason (``scope timeout``/``scope cancelled``);
dropping the object unclosed kills it from the finaliser, as a last resort for
streams opened without a context (unless its owner had asked it to stop: then
the worker's drain, which its drain grace bounds, is left to finish and
dropped).  Either way the worker is told at once, whether or not it is
producing.  A worker that vanishes mid-stream raises
:class:`~dynamo_trio.Disconnected` and the instance leaves rotation, unless the
caller had itself cancelled, in which case the stream just ends.

Rotation
========

An instance leaves rotation when a connection to it cannot be made or is
lost (refused, timed out, heartbeats missed, the worker going away), and
stays out for ``_DOWN_FOR`` seconds.  It does not come back on a user's
request: when its time is up, a *probe* (a connection attempt in the
runtime's nursery) decides.  If the probe connects, the instance is back at
once, with that connection ready; if not, it rests twice as long (up to
``_MAX_DOWN_FOR``) before the next probe.  So an instance discovery still
lists but this process cannot reach (a network split: its lease is alive,
other processes reach it) costs requests nothing after it was first found
out, and comes back within ``_MAX_DOWN_FOR`` of the split healing.  Several
failures at once (every stream of a lost connection) count as one.

If no listed instance is in rotation, a call tries those whose rest is over
(their probe is under way: the call shares its connection attempt) rather
than failing; one that failed a moment ago is not tried again, so a model
whose only instance is unreachable answers a fast, clear error.  An
instance that leaves discovery is forgotten.
"""

from __future__ import annotations

import logging
import math
import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal, Self, TypeVar, final, overload

import trio

from .._context import (
    CancelReason,
    Context,
    ContextState,
    find_cancelled,
    reason_for_cancelled,
)
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
from ._annotated import Annotated

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from types import TracebackType

    from .._tracing import TraceContext
    from ..discovery import Instance, PrefixView
    from ._runtime import DistributedRuntime, Endpoint

__all__ = ["Client", "DataStream", "ResponseStream"]

_log = logging.getLogger("dynamo_trio.runtime")

_R = TypeVar("_R")

# How long an instance whose connection failed stays out of rotation before a probe
# tries it again; each failed probe doubles it, up to _MAX_DOWN_FOR (discovery
# removes the instance for good if its process is gone).
_DOWN_FOR: Final = 2.0
_MAX_DOWN_FOR: Final = 8.0
# Distinct instances a routed call tries before giving up on CannotConnect.
_CONNECT_ATTEMPTS: Final = 3


class ResponseStream:
    """The items of one call, as an async iterator of :class:`Annotated`.

    Also an async context manager: leaving the block closes the stream (and
    kills the remote work if it has not finished).

    Iteration ends cleanly only when the stream ended as this caller wanted: the
    worker completed it, finished the drain this caller asked for with a stop, or
    this caller killed it.  A truncated stream raises once its items are read:
    :class:`~dynamo_trio.StreamIncomplete` when the worker cut a drain short (its
    drain grace ran out) or stopped the work to shut down,
    :class:`~dynamo_trio.EngineShutdown` or :class:`~dynamo_trio.Cancelled` when
    it killed the work unasked.  A handler that stops its own work ends cleanly:
    :attr:`outcome` is then ``"stopped"``.
    """

    def __init__(
        self,
        context: Context,
        stream: ClientStream | None,
        *,
        instance_id: int | None,
        client: Client | None,
    ) -> None:
        self._context = context
        self._stream = stream
        self._client = client
        self.instance_id: Final = instance_id
        """The instance serving the call (``None`` if nothing was sent)."""
        self._done = stream is None
        if stream is None:
            context.finish()
            return
        # The callback holds the wire stream, not this object: the context must not
        # keep this object alive, so that dropping it finalises it (and kills its work)
        # at once; and a finaliser run by the cycle collector, which clears weak
        # references first, still reaches the wire.
        self._cancel_callback = _wire_callback(stream)
        context.add_cancel_callback(self._cancel_callback)
        if context.is_stopped():  # cancelled while we were connecting
            self._cancel_callback(
                context, context.state, context.reason or CancelReason.KILL_REQUESTED
            )

    @property
    def context(self) -> Context:
        """The call's own context (a child of the caller's, with the same id)."""
        return self._context

    @property
    def end_reason(self) -> str | None:
        """The reason the worker gave in its ``stopped``/``killed`` terminal frame
        (``"shutdown"``...), if the stream ended with one."""
        return None if self._stream is None else self._stream.end_reason

    @property
    def outcome(self) -> str | None:
        """How the stream ended: ``complete``, ``stopped`` or ``killed`` (``None`` while
        it runs, or if nothing was sent).  A stream this caller killed is ``killed``."""
        if self._stream is None:
            return None
        if self._stream.outcome is None and self._context.is_killed():
            return "killed"
        return self._stream.outcome

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Annotated:
        return await self._next_item()

    async def _next_item(self) -> Annotated:
        frame = await self._next(ClientStream.receive)
        if frame is None:
            raise StopAsyncIteration
        return Annotated(frame.data, id=frame.id, event=frame.event, comment=frame.comment)

    async def receive(self, *, idle_timeout: float | None = None) -> Annotated | None:
        """The next item, or ``None`` once the stream has ended (what iterating gives).

        ``idle_timeout``: if no item (nor the end) arrives within that many
        seconds, the call is killed with reason ``inactivity`` (its worker is
        told at once) and :class:`~dynamo_trio.ResponseTimeout` is raised.
        """
        frame = await self._next(ClientStream.receive, idle_timeout)
        if frame is None:
            return None
        return Annotated(frame.data, id=frame.id, event=frame.event, comment=frame.comment)

    async def receive_batch(self, *, idle_timeout: float | None = None) -> list[Any]:
        """The data of every item that has arrived, at least one (waiting for it), in
        order; ``[]`` once the stream has ended.

        The same stream as iterating (same errors, same cancellation rules), taken
        in batches: a consumer that turns items into one write per batch (an SSE
        body under load) pays its per-wakeup costs once per batch.  Annotations
        are dropped: iterate to see them.  ``idle_timeout`` as in :meth:`receive`.
        """
        frames = await self._next(ClientStream.receive_many, idle_timeout)
        return [] if frames is None else [frame.data for frame in frames]

    async def _next(
        self,
        receive: Callable[[ClientStream], Awaitable[_R | None]],
        idle_timeout: float | None = None,
    ) -> _R | None:
        stream = self._stream
        if stream is None or self._done:
            await trio.lowlevel.checkpoint()
            return None
        context = self._context
        try:
            got = await self._receive(stream, context, receive, idle_timeout)
        except DynamoError as exc:
            self._finish()
            if context.is_stopped():
                return None  # we cancelled; how it ended is moot
            if isinstance(exc, Disconnected) and self._client is not None:
                self._client._instance_failed(self.instance_id, str(exc))
            raise
        except BaseException as exc:
            # The consumer was cancelled (or failed) while waiting: abandon the stream.
            self._abandon(_abandon_reason(exc))
            raise
        if got is None:
            self._ended(stream)
            if context.reason is CancelReason.INACTIVITY and idle_timeout is not None:
                raise ResponseTimeout(f"the worker sent nothing for {idle_timeout:g}s")
        return got

    @staticmethod
    async def _receive(
        stream: ClientStream,
        context: Context,
        receive: Callable[[ClientStream], Awaitable[_R | None]],
        idle_timeout: float | None,
    ) -> _R | None:
        deadline = context.deadline
        if deadline is None and idle_timeout is None:
            return await receive(stream)
        now = trio.current_time()
        wake_at = math.inf if deadline is None else now + (deadline - time.monotonic())
        if idle_timeout is not None:
            wake_at = min(wake_at, now + idle_timeout)
        with trio.move_on_at(wake_at):
            return await receive(stream)
        # Reading the state enforces the deadline; if it has not passed, the worker
        # was silent for too long.  Either way the call is killed before its stream
        # is read again (which then ends at once).
        if not context.is_killed():
            context.kill(CancelReason.INACTIVITY)
        return await receive(stream)

    def _ended(self, stream: ClientStream) -> None:
        """Raise unless the worker ended the stream as this caller asked (see the class)."""
        self._finish()
        context = self._context
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
            self._context.remove_cancel_callback(self._cancel_callback)
            self._context.finish()

    def _abandon(self, reason: CancelReason = CancelReason.STREAM_CLOSED) -> None:
        if self._done:
            return
        stream = self._stream
        if stream is not None and not stream.done:
            self._context.kill(reason)
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
        # Dropped without being closed: kill the remote work rather than leak it.
        # kill() is synchronous and thread-safe, so this is safe from a finaliser.
        # A stream its owner already asked to stop (Dynamo's `stop_generating();
        # break`) is left to finish its drain: the worker's drain grace bounds it,
        # and its frames are dropped as they arrive.
        if not self._done and self._stream is not None and not self._stream.done:
            if self._context.is_stopped():
                # (In the run that owns the stream: the finaliser may run in any thread.)
                self._context._run_in_trio(self._stream.discard)
            else:
                self._context.kill(CancelReason.STREAM_CLOSED)


@final
class DataStream(ResponseStream):
    """The items of one call made with ``annotated=False``: each item's data alone.

    As in Dynamo, items that carry only annotations (an ``event``, an ``id``
    or comments, and no data) are skipped.  Everything else (closing,
    cancellation, errors) is as for :class:`ResponseStream`.
    """

    async def __anext__(self) -> Any:
        while True:
            item = await self._next_item()
            data = item.data()
            if data is None and (item.id is not None or item.event is not None or item.comment):
                continue
            return data


def _wire_callback(stream: ClientStream) -> Callable[[Context, ContextState, CancelReason], None]:
    """The call context's cancel callback: ``stop``/``kill`` on the wire (no-ops once the
    stream has ended)."""

    def on_cancel(context: Context, state: ContextState, reason: CancelReason) -> None:
        if state is ContextState.KILLED:
            stream.kill(reason)
        else:
            stream.stop(reason)

    return on_cancel


def _abandon_reason(exc: BaseException) -> CancelReason:
    """Why a stream left by ``exc`` is killed: a cancelled consumer scope, or just closed."""
    cancelled = find_cancelled(exc)
    return CancelReason.STREAM_CLOSED if cancelled is None else reason_for_cancelled(cancelled)


@dataclass(slots=True)
class _Resting:
    """An instance out of rotation (see the module docstring)."""

    until: float
    """When (``time.monotonic()``) a probe may try it again."""
    failures: int = 1
    """Failures in a row (the first, then each failed probe)."""
    probing: bool = False


@final
class Client:
    """Calls one endpoint's instances, as Dynamo's ``Client``."""

    def __init__(
        self, runtime: DistributedRuntime, endpoint: Endpoint, view: PrefixView[Instance]
    ) -> None:
        self._runtime = runtime
        self._endpoint = endpoint
        self._view = view
        self._next = 0
        self._resting: dict[int, _Resting] = {}

    @property
    def endpoint(self) -> Endpoint:
        return self._endpoint

    def _instances(self) -> dict[int, Instance]:
        return {instance.instance_id: instance for instance in self._view.items().values()}

    def instance_ids(self) -> list[int]:
        """Ids of the instances discovery currently lists for the endpoint, sorted."""
        return sorted(self._instances())

    async def wait_for_instances(self) -> list[int]:
        """Wait until at least one instance is registered; return their ids."""
        await self._view.wait_until(lambda items: bool(items))
        return self.instance_ids()

    def live_instance_ids(self) -> list[int]:
        """Ids of the instances in rotation (listed, and not taken out by a recent
        failure), sorted: the ones :meth:`round_robin` and :meth:`random` choose from."""
        return [instance.instance_id for instance in self._live()]

    async def wait_for_instance(self, instance_id: int) -> None:
        """Wait until discovery lists the instance ``instance_id`` for this endpoint."""
        await self._view.wait_until(
            lambda items: any(i.instance_id == instance_id for i in items.values())
        )

    def due_instance_ids(self) -> list[int]:
        """Ids of the listed instances out of rotation whose rest is over (a probe is
        trying them), the longest due first: worth a try when none is in rotation."""
        now = time.monotonic()
        instances = self._instances()
        due = [(r.until, i) for i, r in self._resting.items() if i in instances and r.until <= now]
        return [instance_id for _, instance_id in sorted(due)]

    def _live(self) -> list[Instance]:
        """The listed instances in rotation; starts the probes that are due."""
        now = time.monotonic()
        instances = self._instances()
        for gone in [i for i in self._resting if i not in instances]:
            del self._resting[gone]
        live = []
        for instance_id, instance in sorted(instances.items()):
            resting = self._resting.get(instance_id)
            if resting is None:
                live.append(instance)
            elif resting.until <= now and not resting.probing:
                self._start_probe(instance, resting)
        return live

    def _start_probe(self, instance: Instance, resting: _Resting) -> None:
        try:
            nursery = self._runtime._require_nursery()
            nursery.start_soon(self._probe, instance, name=f"probe {instance.address}")
        except RuntimeError:
            return  # the runtime is closing
        resting.probing = True

    async def _probe(self, instance: Instance) -> None:
        """Try to connect to a resting instance: back in rotation, or rest longer."""
        try:
            await self._runtime._pool().connect(instance.address)
        except CannotConnect as exc:
            resting = self._resting.get(instance.instance_id)
            if resting is None:
                return  # it came back (or left discovery) meanwhile
            resting.failures += 1
            resting.until = time.monotonic() + _rest_for(resting.failures)
            resting.probing = False
            _log.info(
                "instance %x of %s still unreachable (%s); next try in %.0fs",
                instance.instance_id,
                self._endpoint.path,
                exc,
                resting.until - time.monotonic(),
            )
        else:
            self._back_in_rotation(instance.instance_id)

    def _back_in_rotation(self, instance_id: int) -> None:
        if self._resting.pop(instance_id, None) is not None:
            _log.info("instance %x of %s back in rotation", instance_id, self._endpoint.path)

    def _instance_failed(
        self, instance_id: int | None, reason: str, *, expected: bool = False
    ) -> None:
        if instance_id is None:
            return
        now = time.monotonic()
        resting = self._resting.get(instance_id)
        if resting is not None and (resting.probing or resting.until > now):
            return  # already out: one event (every stream of a lost connection) counts once
        failures = 1 if resting is None else resting.failures + 1
        log = _log.info if expected else _log.warning
        log("instance %x of %s taken out of rotation: %s", instance_id, self._endpoint.path, reason)
        self._resting[instance_id] = _Resting(now + _rest_for(failures), failures)

    def _address_lost(self, address: str, reason: str, *, drained: bool) -> None:
        if drained:
            reason = f"it shut down ({reason})"
        for instance in self._instances().values():
            if instance.address == address:
                self._instance_failed(instance.instance_id, reason, expected=drained)

    # The calls take Dynamo 1.6.1's arguments, in its order: (request, [instance_id,]
    # annotated=True, context=None).  With annotated=False (or None, as in Dynamo)
    # the stream yields each item's data instead of an Annotated.

    @overload
    async def generate(
        self, request: Any, annotated: Literal[True] = True, context: Context | None = None
    ) -> ResponseStream: ...
    @overload
    async def generate(
        self, request: Any, annotated: bool | None, context: Context | None = None
    ) -> ResponseStream | DataStream: ...
    async def generate(
        self, request: Any, annotated: bool | None = True, context: Context | None = None
    ) -> ResponseStream | DataStream:
        """Same as :meth:`random` (Dynamo's default)."""
        return await self.random(request, annotated, context)

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
        return await self._routed(request, _annotated(annotated), context, random.choice)

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

        def pick(live: list[Instance]) -> Instance:
            self._next = (self._next + 1) % (1 << 62)
            return live[self._next % len(live)]

        return await self._routed(request, _annotated(annotated), context, pick)

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
        self,
        request: Any,
        instance_id: int,
        annotated: bool | None,
        context: Context | None = None,
    ) -> ResponseStream | DataStream: ...
    async def direct(
        self,
        request: Any,
        instance_id: int,
        annotated: bool | None = True,
        context: Context | None = None,
    ) -> ResponseStream | DataStream:
        """Send ``request`` to one instance.

        Raises:
            NoInstances: discovery lists no instance with that id.
            CannotConnect: the instance cannot be reached.
            InvalidArgument: the context's metadata cannot travel (too many or
                too long entries); nothing is sent.
        """
        annotated = _annotated(annotated)
        child = self._child_context(context)
        if child is None:
            return self._empty(context, annotated)
        instance = self._instances().get(instance_id)
        if instance is None:
            child.finish()
            raise NoInstances(f"no instance {instance_id:x} serves {self._endpoint.path}")
        return await self._send(request, annotated, child, instance)

    async def _routed(
        self,
        request: Any,
        annotated: bool,
        context: Context | None,
        pick: Callable[[list[Instance]], Instance],
    ) -> ResponseStream | DataStream:
        child = self._child_context(context)
        if child is None:
            return self._empty(context, annotated)
        tried: set[int] = set()
        last_error: CannotConnect | None = None
        for _ in range(_CONNECT_ATTEMPTS):
            live = [i for i in self._live() if i.instance_id not in tried]
            if live:
                instance: Instance = pick(live)
            else:
                # None in rotation: try one whose rest is over (see the module docstring).
                instances = self._instances()
                due = [i for i in self.due_instance_ids() if i not in tried]
                if not due:
                    break
                instance = instances[due[0]]
            tried.add(instance.instance_id)
            try:
                return await self._send(request, annotated, child, instance, finish_on_error=False)
            except CannotConnect as exc:
                last_error = exc
        child.finish()
        if last_error is not None:
            raise last_error
        raise NoInstances(f"no live instance serves {self._endpoint.path}")

    def _child_context(self, parent: Context | None) -> Context | None:
        """The call's context, linked under ``parent``; ``None`` if ``parent`` is cancelled.

        It carries ``parent``'s id, metadata and trace.  A call made without a
        context, or with one that has no trace, inside a request's handler
        continues that request's trace (as an implicit current span does).
        """
        if parent is None:
            return Context(trace=_current_trace())
        if parent.is_stopped():
            return None
        metadata = parent.metadata.copy()
        check_metadata(metadata)
        child = Context(parent.id(), metadata, trace=parent.trace or _current_trace())
        parent.link_child(child)
        return child

    def _empty(self, context: Context | None, annotated: bool) -> ResponseStream | DataStream:
        stream_type = ResponseStream if annotated else DataStream
        return stream_type(
            Context(context.id() if context else None), None, instance_id=None, client=None
        )

    async def _send(
        self,
        request: Any,
        annotated: bool,
        child: Context,
        instance: Instance,
        *,
        finish_on_error: bool = True,
    ) -> ResponseStream | DataStream:
        stream_type = ResponseStream if annotated else DataStream
        try:
            connection = await self._runtime._pool().connect(instance.address)
        except BaseException as exc:
            if isinstance(exc, CannotConnect):
                self._instance_failed(instance.instance_id, str(exc))
            if finish_on_error:
                child.finish()
            raise
        self._back_in_rotation(instance.instance_id)
        if child.is_stopped():
            return stream_type(child, None, instance_id=None, client=None)
        child.attributes["endpoint"] = self._endpoint.path
        child.attributes["instance"] = f"{instance.instance_id:x}"
        remaining = child.time_remaining()
        try:
            stream = connection.open_stream(
                endpoint=self._endpoint.path,
                instance_id=instance.instance_id,
                request_id=child.id(),
                payload=request,
                timeout=None if remaining is None or math.isinf(remaining) else remaining,
                headers=request_headers(child.trace, child.metadata.copy()),
            )
        except (Disconnected, EngineShutdown) as exc:
            self._instance_failed(instance.instance_id, str(exc))
            if finish_on_error:
                child.finish()
            raise CannotConnect(str(exc)) from None
        except BaseException:
            child.finish()
            raise
        return stream_type(child, stream, instance_id=instance.instance_id, client=self)


def _annotated(value: object) -> bool:
    """Dynamo's ``annotated``: ``True``, ``False``, or ``None`` (which means ``False``)."""
    if value is None or isinstance(value, bool):
        return bool(value)
    raise TypeError(
        f"annotated must be a bool or None, not {type(value).__name__}"
        + (": pass the context as context=..." if isinstance(value, Context) else "")
    )


def _current_trace() -> TraceContext | None:
    """The trace of the request the current task works for, if any."""
    request = current_request()
    return None if request is None else request.trace


def _rest_for(failures: int) -> float:
    """How long an instance rests out of rotation after ``failures`` failures in a row."""
    doubled: float = _DOWN_FOR * 2.0 ** min(failures - 1, 16)
    return min(doubled, _MAX_DOWN_FOR)
