"""The request context: one per request stream, the unit of cancellation.

Contexts move forward only (live, stopped, killed) and form a tree that
``ctx.scope()`` makes one with trio's cancel-scope tree (docs/cancellation.md).
"""

from __future__ import annotations

import enum
import logging
import math
import os
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, nullcontext, suppress
from functools import partial
from itertools import groupby
from typing import TYPE_CHECKING, Any, Final, TypeVar, final

import trio

from ._contain import collapse
from ._tracing import REQUEST_ID, TraceContext

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

_log = logging.getLogger("dynamo_trio.context")

_T = TypeVar("_T")

# One lock for all state marking: a subtree's transition is atomic against links.
_LOCK: Final = threading.RLock()


class ContextState(enum.IntEnum):
    """The three states of a context, ordered so that ``max`` is "most cancelled"."""

    LIVE = 0
    STOPPED = 1
    KILLED = 2


class CancelReason(enum.StrEnum):
    """Why a context was stopped or killed; travels unchanged down the tree and over the wire."""

    STOP_REQUESTED = "stop requested"
    """Someone called ``stop()``/``stop_generating()`` with no more specific reason."""
    KILL_REQUESTED = "kill requested"
    """Someone called ``kill()`` with no more specific reason."""
    CLIENT_DISCONNECT = "client disconnect"
    """The HTTP client hung up."""
    STREAM_CLOSED = "stream closed"
    """The caller closed or abandoned a response stream before its end."""
    TRANSPORT_LOST = "transport lost"
    """The connection that carried the request was lost (EOF, reset, missed heartbeats)."""
    DEADLINE = "deadline"
    """The context's deadline passed."""
    INACTIVITY = "inactivity"
    """The worker sent nothing for longer than the caller's inactivity bound."""
    DRAIN_TIMEOUT = "drain timeout"
    """A stopped context's work did not finish within its drain grace, so it was killed."""
    SHUTDOWN = "shutdown"
    """The process is shutting down."""
    SCOPE_TIMEOUT = "scope timeout"
    """A trio scope around the work timed out (``move_on_after``, ``fail_after``, ...)."""
    SCOPE_CANCELLED = "scope cancelled"
    """A trio scope around the work was cancelled (``cancel()``, a failed sibling task, ...)."""
    PARENT_FINISHED = "parent finished"
    """The parent's scope was left while this linked work was still unfinished."""


CancelCallback = Callable[["Context", ContextState, CancelReason], None]
"""Called in the trio thread on each effective transition: ``(context, new_state, reason)``."""


_ID_BATCH: Final = 256
_VARIANT: Final = {f"{n:x}": f"{n & 0x3 | 0x8:x}" for n in range(16)}
_ids: list[str] = []  # ready ids, taken from the end (list.pop is atomic)


def _new_id() -> str:
    """A fresh random UUIDv4 as text (one system call per batch)."""
    try:
        return _ids.pop()
    except IndexError:
        pass
    digits = os.urandom(16 * _ID_BATCH).hex()
    # uuid.uuid4()'s bits: version 4, RFC 4122 variant (0b10xx in the 17th digit).
    _ids.extend(
        f"{d[:8]}-{d[8:12]}-4{d[13:16]}-{_VARIANT[d[16]]}{d[17:20]}-{d[20:32]}"
        for d in (digits[i : i + 32] for i in range(0, len(digits), 32))
    )
    return _ids.pop()


# A forked child must not hand out the ids its parent holds ready.
os.register_at_fork(after_in_child=_ids.clear)


def _current_token() -> trio.lowlevel.TrioToken | None:
    try:
        return trio.lowlevel.current_trio_token()
    except RuntimeError:
        return None


@final
class Context:
    """Cancellation state for one request stream, shared by the frontend, workers and sub-requests.

    ``id`` (default a fresh UUIDv4) is reused end to end; ``timeout`` is seconds from now
    (:meth:`set_deadline`); ``trace`` is ``None`` for a context made by hand.  ``stop()``,
    ``kill()`` and the ``is_*`` queries are synchronous and safe from any thread; all else
    belongs to the trio run that owns the context (its maker's, else the first to use it).
    """

    __slots__ = tuple(
        "__weakref__ _callbacks _children _deadline _drain_grace _exiting _finished _id _metadata "  # noqa: SIM905
        "_nursery _parent _reason _scope _scope_task _scope_used _state _state_changed_at _token "
        "_trace _wakeup _wants_watcher _watcher _watchers attributes created_at".split()
    )

    def __init__(
        self,
        id: str | None = None,
        metadata: Mapping[str, str] | None = None,
        *,
        timeout: float | None = None,
        trace: TraceContext | None = None,
    ) -> None:
        self._id: Final = _new_id() if id is None else id
        self._metadata: dict[str, str] = _checked_metadata(metadata) if metadata else {}
        self._trace = trace
        self._state = ContextState.LIVE
        self._reason: CancelReason | None = None
        self._state_changed_at: float | None = None
        self._parent: Context | None = None
        self._children: dict[Context, None] = {}
        self._callbacks: list[CancelCallback] = []
        self._finished = False
        self._deadline: float | None = None  # time.monotonic() seconds
        self._token = _current_token()
        self._wakeup: trio.Event | None = None  # set and dropped on each change
        self._scope: trio.CancelScope | None = None
        self._scope_used = False
        self._exiting = False  # scope() is leaving on its own: its watcher's end is expected
        self._nursery: trio.Nursery | None = None
        self._watchers: trio.Nursery | None = None  # open while scope() runs
        self._watcher: trio.CancelScope | None = None  # the watcher's, once started
        self._wants_watcher = False  # a child, waiter or callback came before scope()
        self._drain_grace: float | None = None
        self._scope_task: trio.lowlevel.Task | None = None  # the task that entered scope()
        self.created_at: Final = time.monotonic()
        """``time.monotonic()`` when the context was made; used for ages in introspection."""
        self.attributes: dict[str, str] = {}
        """Free-form labels the runtime attaches (endpoint, instance, ...) for introspection."""
        if timeout is not None:
            self.set_deadline(time.monotonic() + timeout)

    def __repr__(self) -> str:
        reason = f" reason={self._reason.value!r}" if self._reason else ""
        return f"<Context {self._id} {self._state.name}{reason}>"

    def id(self) -> str:
        """The user request id, shared by every context serving the same request."""
        return self._id

    @property
    def metadata(self) -> ContextMetadata:
        """Dynamo's propagated metadata: a live ``str -> str`` mapping that travels with calls;
        assigning a dict replaces the contents (views already taken see them)."""
        return ContextMetadata(self._metadata)

    @metadata.setter
    def metadata(self, metadata: Mapping[str, str]) -> None:
        checked = _checked_metadata(metadata)  # before clearing: a bad mapping changes nothing
        self._metadata.clear()
        self._metadata.update(checked)

    @property
    def trace(self) -> TraceContext | None:
        """This context's place in its W3C trace, or ``None`` (a context made by hand)."""
        return self._trace

    @property
    def trace_id(self) -> str | None:
        """The W3C trace id (32 hex digits), the same on every hop; ``None`` without a trace."""
        return None if self._trace is None else self._trace.trace_id

    @property
    def span_id(self) -> str | None:
        """This hop's span id (16 hex digits); ``None`` without a trace."""
        return None if self._trace is None else self._trace.span_id

    @property
    def parent_span_id(self) -> str | None:
        """The calling hop's span id; ``None`` where the trace began or without a trace."""
        return None if self._trace is None else self._trace.parent_span_id

    def trace_headers(self) -> dict[str, str] | None:
        """W3C trace headers (and ``request-id``) for a downstream engine; None without a trace."""
        return None if self._trace is None else {**self._trace.headers(), REQUEST_ID: self._id}

    def detached(self, id: str) -> Context:
        """A new, independent context with request id ``id``: same trace, a copy of the
        metadata, its own cancellation (not linked to this one), as Dynamo's ``detached``."""
        return Context(id, self._metadata, trace=self._trace)

    def _set_trace(self, trace: TraceContext | None) -> None:
        self._trace = trace

    @property
    def state(self) -> ContextState:
        """The current state (a passed deadline counts as killed)."""
        self._check_deadline()
        return self._state

    @property
    def reason(self) -> CancelReason | None:
        """Why the context was last moved forward, or ``None`` while it is live."""
        self._check_deadline()
        return self._reason

    @property
    def state_changed_at(self) -> float | None:
        """``time.monotonic()`` of the last effective transition, or ``None`` while live."""
        return self._state_changed_at

    @property
    def parent(self) -> Context | None:
        """The context this one is linked under, if any."""
        return self._parent

    @property
    def children(self) -> tuple[Context, ...]:
        """The linked, unfinished children, in link order."""
        return tuple(self._children)

    @property
    def finished(self) -> bool:
        """True once the work for this context is over (see :meth:`finish`)."""
        return self._finished

    def is_stopped(self) -> bool:
        """True once stop **or** kill was requested (killed implies stopped).  Thread-safe."""
        return self.state >= ContextState.STOPPED

    def is_killed(self) -> bool:
        """True once kill was requested.  Thread-safe."""
        return self.state is ContextState.KILLED

    @property
    def deadline(self) -> float | None:
        """The deadline in ``time.monotonic()`` seconds, or ``None``."""
        return self._deadline

    def time_remaining(self) -> float | None:
        """Seconds until the deadline (never negative), or ``None`` without a deadline."""
        return None if self._deadline is None else max(0.0, self._deadline - time.monotonic())

    def set_deadline(self, deadline: float) -> None:
        """Give the context a deadline in ``time.monotonic()`` seconds (only ever earlier);
        linked children inherit it; when it passes the context is killed (``DEADLINE``)."""
        with _LOCK:
            changed = self._tighten_deadlines(deadline)
        _dispatch_effects(changed, _deadlines_changed)

    def _tighten_deadlines(self, deadline: float) -> list[Context]:
        changed = []
        for ctx in (tree := [self]):  # (the list grows as it is read)
            if ctx._deadline is None or deadline < ctx._deadline:
                ctx._deadline = deadline
                changed.append(ctx)
            tree += ctx._children
        return changed

    def _check_deadline(self) -> None:
        deadline = self._deadline
        if (
            deadline is not None
            and self._state is not ContextState.KILLED
            and time.monotonic() >= deadline
        ):
            self._transition(ContextState.KILLED, CancelReason.DEADLINE)

    def stop_generating(self, reason: CancelReason = CancelReason.STOP_REQUESTED) -> None:
        """Graceful cancel: ask the work to finish early.  Idempotent and thread-safe."""
        self._transition(ContextState.STOPPED, reason)

    stop = stop_generating

    def kill(self, reason: CancelReason = CancelReason.KILL_REQUESTED) -> None:
        """Hard cancel: abandon the remaining output now.  Idempotent and thread-safe.
        Cancels the context's scope, after every linked child's, in link order."""
        self._transition(ContextState.KILLED, reason)

    def _transition(self, target: ContextState, reason: CancelReason) -> None:
        with _LOCK:
            changed = self._mark(target, reason)
        _dispatch_effects(changed)

    def _mark(self, target: ContextState, reason: CancelReason) -> list[Context]:
        """Move this subtree to ``target`` (iterative post-order, skipping what is there already);
        return the contexts that changed, children first."""
        if self._state >= target:
            return []
        now = time.monotonic()
        changed: list[Context] = []
        stack: list[tuple[Context, Iterator[Context]]] = [(self, iter(tuple(self._children)))]
        while stack:
            ctx, pending = stack[-1]
            for child in pending:
                if child._state < target:
                    stack.append((child, iter(tuple(child._children))))
                    break
            else:
                stack.pop()
                ctx._state = target
                ctx._reason = reason
                ctx._state_changed_at = now
                changed.append(ctx)
        return changed

    def _run_in_trio(self, fn: Callable[..., object], *args: Any) -> None:
        _run_in(self._token, fn, *args)

    def link_child(self, child: Context) -> None:
        """Put ``child`` in this context's scope: stop/kill of this context then reaches it.

        The child takes an earlier deadline and a cancelled state at once, and is killed
        (``PARENT_FINISHED``) if unfinished when this context finishes.  ValueError for a
        cycle or a child linked elsewhere.
        """
        if child is self:
            raise ValueError(f"cannot link context {self._id} to itself")
        here = _current_token()
        if here is not None:
            self._learn_run(here)
            child._learn_run(here)
        with _LOCK:
            if child._parent is self:
                return
            if child._parent is not None:
                raise ValueError(
                    f"context {child._id} is already linked under {child._parent._id}; "
                    "a context has at most one parent"
                )
            if _is_ancestor(child, self):
                raise ValueError(
                    f"linking {child._id} under {self._id} would create a cycle: "
                    f"{child._id} is an ancestor of {self._id}"
                )
            if self._finished:  # nothing linked outlives its parent's scope
                changed = child._mark(ContextState.KILLED, CancelReason.PARENT_FINISHED)
                deadline_changed = []
            else:
                child._parent = self
                self._children[child] = None
                self._wants_watcher = True
                deadline = self._deadline
                deadline_changed = [] if deadline is None else child._tighten_deadlines(deadline)
                changed = child._mark(self._state, self._reason) if self._reason else []
        _dispatch_effects(deadline_changed, _deadlines_changed)
        _dispatch_effects(changed)
        if self._watchers is not None:
            self._run_in_trio(self._start_watcher)

    def unlink_child(self, child: Context) -> None:
        """Remove ``child`` from this context's children (its state is left as is)."""
        with _LOCK:
            if child._parent is self:
                del self._children[child]
                child._parent = None

    def finish(self) -> None:
        """Declare the work for this context over (idempotent; :meth:`scope` does on exit):
        unfinished linked children are killed (``PARENT_FINISHED``); it leaves its parent."""
        with _LOCK:
            changed: list[Context] = []
            for child in tuple(self._children):
                changed += child._mark(ContextState.KILLED, CancelReason.PARENT_FINISHED)
            self._finished = True
            if self._parent is not None:
                self._parent.unlink_child(self)
        _dispatch_effects(changed)

    def add_cancel_callback(self, callback: CancelCallback) -> None:
        """Call ``callback(context, state, reason)`` in the trio thread on each later transition
        (quick and non-blocking; an exception is logged)."""
        self._callbacks.append(callback)
        self._wants_watcher = True
        if self._watchers is not None:
            self._run_in_trio(self._start_watcher)

    def _add_exit_callback(self, callback: CancelCallback) -> None:
        """:meth:`add_cancel_callback` without a watcher: an outside cancel is heard on exit."""
        self._callbacks.append(callback)

    def remove_cancel_callback(self, callback: CancelCallback) -> None:
        """Forget a callback added with :meth:`add_cancel_callback` (no error if absent)."""
        with suppress(ValueError):
            self._callbacks.remove(callback)

    def _bind_token(self) -> None:
        token = _current_token()
        if token is None:
            raise RuntimeError("this Context method must be called from inside trio")
        if not self._learn_run(token):
            raise RuntimeError(
                f"context {self._id} belongs to another trio run that is still going; "
                "wait on it there, or stop/kill it from here (those are safe anywhere)"
            )

    def _learn_run(self, token: trio.lowlevel.TrioToken) -> bool:
        """Make the run of ``token`` this context's owner, unless another live run owns it."""
        owner = self._token
        if owner is not None and owner is not token:
            with suppress(trio.RunFinishedError):  # only a finished run refuses new work
                owner.run_sync_soon(lambda: None)
                return False
        self._token = token
        return True

    def _wake(self) -> None:
        wakeup, self._wakeup = self._wakeup, None
        if wakeup is not None:
            wakeup.set()

    async def _wait(self, target: ContextState) -> None:
        self._bind_token()
        if trio.lowlevel.current_task() is not self._scope_task:
            # (The work's own task gets an outside Cancelled itself; scope() notes it.)
            self._wants_watcher = True
            self._start_watcher()
        if self.state >= target:
            await trio.lowlevel.checkpoint()
        while self.state < target:  # reading .state also enforces the deadline
            if self._wakeup is None:
                self._wakeup = trio.Event()
            wakeup = self._wakeup
            at, deadline = math.inf, self._deadline
            if deadline is not None:
                at = trio.current_time() + (deadline - time.monotonic())
            with trio.move_on_at(at):
                await wakeup.wait()

    async def stopped(self) -> None:
        """Return once the context is stopped or killed (at once if it already is)."""
        await self._wait(ContextState.STOPPED)

    async def killed(self) -> None:
        """Return once the context is killed (at once if it already is)."""
        await self._wait(ContextState.KILLED)

    async def async_killed_or_stopped(self) -> bool:
        """Dynamo's name: wait until stopped or killed, then return ``True``."""
        await self._wait(ContextState.STOPPED)
        return True

    @asynccontextmanager
    async def scope(
        self, *, drain_grace: float | None = None, watchers: trio.Nursery | None = None
    ) -> AsyncIterator[trio.Nursery]:
        """Run the request's work under the context's cancel scope; yield its nursery (once).

        ``kill()`` cancels the scope (the block exits normally); work still running
        ``drain_grace`` seconds after ``stop()`` is killed; a cancellation from outside
        kills the context, then propagates; on exit the context is finished.
        ``watchers``: a nursery around this call, with no cancel scope in between, to run
        the watcher task in instead of a nursery of its own (docs/cancellation.md).
        """
        # The steps are run()'s around a yield: keep the two alike.
        self._enter_scope(drain_grace)
        body_failed = False
        try:
            async with (
                trio.open_nursery() if watchers is None else nullcontext(watchers)
            ) as self._watchers:
                self._watch_if_needed()
                try:
                    # The nursery's own scope is the context's: one scope fewer per level keeps
                    # deep running trees within trio's limits.
                    async with trio.open_nursery() as nursery:
                        self._work_started(nursery)
                        try:
                            yield nursery
                        except BaseException as exc:
                            body_failed = _is_failure(exc)
                            raise
                    # An outside cancellation the work swallowed still ends the context.
                    await trio.lowlevel.checkpoint_if_cancelled()
                except BaseException as exc:
                    self._work_failed(exc, body_failed)
                    raise
                finally:
                    self._work_over()
        except BaseExceptionGroup as group:
            raise collapse(group) or group from None
        finally:
            self.finish()

    async def run(
        self,
        fn: Callable[..., Awaitable[_T]],
        *args: Any,
        drain_grace: float | None = None,
        watchers: trio.Nursery | None = None,
    ) -> _T | None:
        """``async with scope(...): return await fn(*args)`` without the context manager's
        own machinery (paid once per request); ``None`` if the context was killed."""
        self._enter_scope(drain_grace)
        body_failed = False
        result: _T | None = None
        try:
            async with (
                trio.open_nursery() if watchers is None else nullcontext(watchers)
            ) as self._watchers:
                self._watch_if_needed()
                try:
                    async with trio.open_nursery() as nursery:
                        self._work_started(nursery)
                        try:
                            result = await fn(*args)
                        except BaseException as exc:
                            body_failed = _is_failure(exc)
                            raise
                    await trio.lowlevel.checkpoint_if_cancelled()
                except BaseException as exc:
                    self._work_failed(exc, body_failed)
                    raise
                finally:
                    self._work_over()
        except BaseExceptionGroup as group:
            raise collapse(group) or group from None
        finally:
            self.finish()
        return result  # None if killed: the scope absorbed the cancellation

    def _enter_scope(self, drain_grace: float | None) -> None:
        self._bind_token()
        if self._scope_used:
            raise RuntimeError(f"the scope of context {self._id} was already entered")
        self._scope_used = True
        self._drain_grace = drain_grace
        self._scope_task = trio.lowlevel.current_task()

    def _watch_if_needed(self) -> None:
        if self._wants_watcher or self._deadline is not None or self._reason is not None:
            self._start_watcher()

    def _work_started(self, nursery: trio.Nursery) -> None:
        self._scope = nursery.cancel_scope
        if self.is_killed():
            nursery.cancel_scope.cancel(reason=self._cancel_message())
        self._nursery = nursery

    def _work_failed(self, exc: BaseException, body_failed: bool) -> None:
        # The nursery absorbs its own scope's cancel (a kill): a live Cancelled that
        # leaves it is an enclosing scope's.
        if trio.current_effective_deadline() == -math.inf:
            self._killed_by_enclosing(find_cancelled(exc))
        elif not body_failed and _is_failure(exc) and self._state is not ContextState.KILLED:
            # A task in the context's nursery failed: as a failed sibling around the scope.
            self.kill(CancelReason.SCOPE_CANCELLED)

    def _work_over(self) -> None:
        self._nursery = None
        self._watchers = None
        self._scope_task = None
        self._exiting = True
        if self._watcher is not None:
            self._watcher.cancel()

    def start_soon(self, fn: Callable[..., Awaitable[object]], *args: Any) -> None:
        """Start a task in this context's nursery (only while :meth:`scope` is open)."""
        if self._nursery is None:
            raise RuntimeError(f"context {self._id} has no open scope to start work in")
        self._nursery.start_soon(fn, *args)

    def start_child(
        self,
        child: Context,
        fn: Callable[..., Awaitable[object]],
        *args: Any,
        drain_grace: float | None = None,
    ) -> None:
        """Link ``child`` and run ``fn(*args)`` under the child's scope, in this context's
        nursery: killing this context then cancels it through the link and the scope."""
        self.link_child(child)
        self.start_soon(partial(child.run, fn, *args, drain_grace=drain_grace))

    def _start_watcher(self) -> None:
        watchers = self._watchers
        if watchers is None or self._watcher is not None:
            return
        # Its own scope ends it: a cancelled nursery scope would swallow the body's Cancelled.
        self._watcher = scope = trio.CancelScope()
        watchers.start_soon(self._watch, self._drain_grace, scope)

    async def _watch(self, drain_grace: float | None, scope: trio.CancelScope) -> None:
        """Enforce the deadline and the drain grace; notice an enclosing scope's cancel."""
        with scope:
            try:
                await self.stopped()
                if drain_grace is not None and not self.is_killed():
                    with trio.move_on_after(drain_grace):
                        await self.killed()
                    if not self.is_killed():
                        _log.warning(
                            "context %s did not finish within its %.3fs drain grace; killing it",
                            self._id,
                            drain_grace,
                        )
                        self.kill(CancelReason.DRAIN_TIMEOUT)
                await self.killed()
            except trio.Cancelled as cancelled:
                if not self._exiting:  # not scope() ending on its own: a scope around it was
                    self._killed_by_enclosing(cancelled)
                raise

    def _killed_by_enclosing(self, cancelled: trio.Cancelled | None) -> None:
        if cancelled is not None and self._state is not ContextState.KILLED:
            self.kill(reason_for_cancelled(cancelled))

    def _cancel_message(self) -> str:
        return f"context {self._id} killed: {self._reason.value if self._reason else 'unknown'}"

    def snapshot(self) -> dict[str, Any]:
        """This context and its subtree as plain data (for the in-flight request listing)."""
        now = time.monotonic()
        top: list[dict[str, Any]] = []
        work = [(self, top)]
        for ctx, siblings in work:  # breadth first: the list grows as it is read
            node: dict[str, Any] = {
                "id": ctx._id,
                "state": ctx._state.name.lower(),
                "reason": ctx._reason.value if ctx._reason else None,
                "age_s": round(now - ctx.created_at, 6),
                "trace_id": ctx.trace_id,
                "attributes": dict(ctx.attributes),
                "children": [],
            }
            siblings.append(node)
            work += [(child, node["children"]) for child in tuple(ctx._children)]
        return top[0]


def _checked_metadata(metadata: Mapping[str, str]) -> dict[str, str]:
    checked = dict(metadata)
    for key, value in checked.items():
        if not isinstance(key, str):
            raise TypeError(f"context metadata keys must be str, not {type(key).__name__}")
        if not isinstance(value, str):
            kind = type(value).__name__
            raise TypeError(f"context metadata values must be str, not {kind} (key {key!r})")
    return checked


@final
class ContextMetadata:
    """A live ``str -> str`` view of a context's metadata (Dynamo's ``ContextMetadata``);
    ``keys()``, ``values()`` and ``items()`` return snapshot lists, as in Dynamo."""

    __slots__ = ("_items",)

    def __init__(self, items: dict[str, str]) -> None:
        self._items = items

    def __getitem__(self, key: str) -> str:
        return self._items[key]

    def __setitem__(self, key: str, value: str) -> None:
        self._items.update(_checked_metadata({key: value}))

    def __delitem__(self, key: str) -> None:
        del self._items[key]

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._items))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ContextMetadata | Mapping):
            return self._items == dict(other)  # (a ContextMetadata has keys() too)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def get(self, key: str, default: str | None = None) -> str | None:
        return self._items.get(key, default)

    def pop(self, key: str, *default: str | None) -> str | None:
        """Remove ``key`` and return its value; ``default`` if absent (``KeyError`` without one)."""
        return self._items.pop(key, *default)

    def keys(self) -> list[str]:
        return list(self._items)

    def values(self) -> list[str]:
        return list(self._items.values())

    def items(self) -> list[tuple[str, str]]:
        return list(self._items.items())

    def update(self, other: Mapping[str, str]) -> None:
        self._items.update(_checked_metadata(other))

    def clear(self) -> None:
        self._items.clear()

    def copy(self) -> dict[str, str]:
        return dict(self._items)

    def __repr__(self) -> str:
        return repr(self._items)


def _run_in(token: trio.lowlevel.TrioToken | None, fn: Callable[..., object], *args: Any) -> None:
    """Run ``fn(*args)`` in ``token``'s run: now if in it or unowned, else handed over
    (dropped if that run is over: nobody is left to wake)."""
    if token is None or _current_token() is token:
        fn(*args)
        return
    with suppress(trio.RunFinishedError):
        token.run_sync_soon(fn, *args)


def _deadlines_changed(changed: list[Context]) -> None:
    for ctx in changed:
        ctx._wake()
        ctx._start_watcher()  # (if scope() runs: it enforces the deadline)


def _apply_effects(changed: list[Context]) -> None:
    """The trio-thread half of a transition."""
    for ctx in changed:
        state, reason = ctx._state, ctx._reason
        assert reason is not None
        ctx._wake()
        if state is ContextState.KILLED:
            if ctx._scope is not None:
                ctx._scope.cancel(reason=ctx._cancel_message())
        else:
            ctx._start_watcher()  # (if scope() runs: it enforces the drain grace)
        for callback in tuple(ctx._callbacks):
            try:
                callback(ctx, state, reason)
            except Exception:
                _log.exception("cancel callback %r of context %s failed", callback, ctx._id)


def _dispatch_effects(changed: list[Context], apply: Callable[..., None] = _apply_effects) -> None:
    """Apply the effects of ``changed`` (children first), each in its own run; consecutive
    contexts of one run go together, so one run's tree keeps its order."""
    for token, group in groupby(changed, key=lambda ctx: ctx._token):
        _run_in(token, apply, list(group))


def _is_ancestor(candidate: Context, ctx: Context) -> bool:
    """Whether ``candidate`` is ``ctx`` or above it (walking up from ``ctx`` and down from
    ``candidate`` in lock step: whichever is smaller ends the search)."""
    up: Context | None = ctx
    down = [candidate]
    while up is not None and down:
        if up is candidate:
            return True
        up = up._parent
        node = down.pop()
        if node is ctx:
            return True
        down.extend(node._children)
    return False


def reason_for_cancelled(cancelled: trio.Cancelled) -> CancelReason:
    """The reason a context records when ``cancelled`` (from a scope around it) ends its work."""
    known = {"deadline": CancelReason.SCOPE_TIMEOUT, "KeyboardInterrupt": CancelReason.SHUTDOWN}
    return known.get(cancelled.source, CancelReason.SCOPE_CANCELLED)


def find_cancelled(exc: BaseException | None) -> trio.Cancelled | None:
    """The first :class:`trio.Cancelled` in ``exc`` (which may be an exception group)."""
    if isinstance(exc, BaseExceptionGroup):
        return next(filter(None, map(find_cancelled, exc.exceptions)), None)
    return exc if isinstance(exc, trio.Cancelled) else None


def _is_failure(exc: BaseException) -> bool:
    """Whether ``exc`` holds anything but cancellations."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(trio.Cancelled)[1] is not None
    return not isinstance(exc, trio.Cancelled)
