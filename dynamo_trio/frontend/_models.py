"""The models the frontend serves, and which workers each request for them goes to.

A worker announces a model with ``endpoint.register_model(name, type)``: a
:class:`~dynamo_trio.discovery.ModelCard` tied to the worker's lease, naming
the endpoint *and the instance* that serves it.  The registry watches the
cards of its namespace, so a model appears when its first worker registers
it and vanishes when its last one goes (shuts down, or dies and its lease
expires).

Routing is by model, per request
================================

A request for model *M* of type *T* (chat, completions, embeddings) goes only
to an instance that registered a card for *(M, T)*, on the endpoint that
card names.  Several endpoints may serve one model (one component per
hardware pool, say) and several models may share one endpoint (two mockers
started with different ``--model-name`` on the default component): the
candidates are the *(endpoint, instance)* pairs of the model's cards, never
the endpoint's other instances.

Each request picks among the candidates that are *live*: listed by discovery
and not taken out of rotation by a recent failure (a refused connection, a
connection lost, a worker going away).  ``round-robin`` (the default) takes
them in turn per model, ``random`` at random.  If the chosen instance cannot
be reached, or its stream fails before its first item (the worker died or
is shutting down), the request is sent at once to another candidate it has
not tried, so a model served by a live instance anywhere is answered even
while a dead one's cards wait for its lease to expire.

Faults after the first item: migration
======================================

Once items have arrived, a lost worker (its connection gone: ``Disconnected``;
it abandoned the request to shut down: ``EngineShutdown``, or it stopped the
request to shut down, ending it early) is handled by the request's
:class:`StreamFaults`:

* with ``migration_limit`` N > 0, the request is sent again, at most N times,
  to a live instance whose card accepts continuations, carrying what was
  generated so far as its ``continuation`` (see :mod:`dynamo_trio.llm`): the
  new worker goes on from there, so the consumer reads one uninterrupted
  stream (Dynamo's request migration);
* otherwise, or once no instance can take it, the failure is the request's
  error: the lost connection, or :class:`~dynamo_trio.StreamIncomplete` for a
  worker that stopped the request to shut down (its partial output must not
  read as a complete answer).

A request whose context is stopped or killed is never moved: it was
cancelled, and a cancellation during a migration reaches the new attempt
(its call is linked under the request's context like the first one).  A
generation whose last item had arrived before the connection was lost is
complete: the stream just ends.  Each move is counted in
``dynamo_frontend_model_migration_total{model, migration_type, reason}``
(``new_request`` before the first item, ``ongoing_request`` after it).

With ``idle_timeout``, a worker that sends nothing for that long (before its
first item, or between two) has its call killed with reason ``inactivity``
and leaves this registry's rotation for a while;
:class:`~dynamo_trio.ResponseTimeout` is the request's error.

A card can be seen a moment before the instance record it names (they are
separate watches): a request that finds no live candidate but some not yet
listed waits up to ``_INSTANCE_WAIT`` for one to appear.

Name clashes between model types
================================

One name may be registered as different types by different workers (``m``
as chat by one, as embeddings by another).  That is served correctly, not
refused: every request type is routed only to the cards of its own type, so
a chat request for ``m`` reaches the chat worker and an embeddings request
the embeddings worker; ``/v1/models`` lists ``m`` once.  A request of a type
no worker serves the model as is a 404 that says which types it is served as.
"""

from __future__ import annotations

import math
import random
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Self, final

import trio

from .._context import CancelReason
from .._errors import (
    CannotConnect,
    Disconnected,
    DynamoError,
    EngineShutdown,
    NoInstances,
    ResponseTimeout,
    StreamIncomplete,
)
from ..discovery import ModelCard, decode_model_card, model_prefix
from ..llm import RequestError

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import TracebackType

    from .._config import RouterMode
    from .._context import Context
    from ..discovery import ModelType, PrefixView
    from ..runtime import Annotated, Client, DistributedRuntime, ResponseStream

__all__ = ["ModelRegistry", "ModelRoute", "ModelStream", "StreamFaults"]

_INSTANCE_WAIT: Final = 2.0
"""How long a request for a known model waits for one of its instances to be listed."""

_DOWN_FOR: Final = 2.0
"""How long an instance a request failed on stays out of this model's rotation."""

_RETRYABLE: Final = (CannotConnect, Disconnected, EngineShutdown, StreamIncomplete)
"""Failures of the instance after which another instance may take the request."""

_TEXT_REQUESTS: Final = frozenset({"chat", "completion"})

Target = tuple[str, int]
"""``(endpoint path, instance id)``: one place a model's request can go."""

Moved = tuple[str, str]
"""``(migration_type, reason)`` of a move to another instance (the metric's labels)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamFaults:
    """What a model request does when the worker serving it fails (module docstring)."""

    migration_limit: int = 0
    """Moves allowed after the first item (0: a lost worker fails the request)."""
    idle_timeout: float | None = None
    """Seconds the worker may send nothing before the request fails (``None``: no bound)."""
    on_migration: Callable[[str, str, str], None] | None = None
    """Told ``(model, migration_type, reason)`` each time the request moves."""


_NO_FAULT_HANDLING: Final = StreamFaults()


def _reason(exc: BaseException) -> str:
    """The ``reason`` label of a move away from an instance that failed with ``exc``."""
    if isinstance(exc, EngineShutdown | StreamIncomplete):
        return "engine_shutdown"
    if isinstance(exc, Disconnected):
        return "disconnected"
    return "cannot_connect"


def _path(card: ModelCard) -> str:
    return f"{card.namespace}/{card.component}/{card.endpoint}"


@final
class ModelRoute:
    """Requests for one model as one type: which cards serve it, and sending to them.

    Made by :meth:`ModelRegistry.route` for each request; the candidates are
    read when the request is sent, so they are always current.
    """

    def __init__(
        self, registry: ModelRegistry, name: str, model_type: ModelType, card: ModelCard
    ) -> None:
        self._registry = registry
        self.name: Final = name
        self.model_type: Final = model_type
        self.card: Final = card
        """One of the model's cards (the first by key), for what all its cards share."""

    @property
    def cards(self) -> list[ModelCard]:
        """Every card currently registered for the model as this type."""
        return self._registry.cards(self.name, self.model_type)

    async def call(
        self, request: Any, context: Context, faults: StreamFaults = _NO_FAULT_HANDLING
    ) -> ModelStream:
        """Send ``request`` to one of the model's instances, linked under ``context``.

        ``faults`` says what a failure of the instance does once the request
        is under way (migration, an inactivity bound; see the module docstring).

        Raises:
            NoInstances: no instance of the model is live (503).
            CannotConnect: no live instance could be reached (503).
        """
        tried: set[Target] = set()
        target, stream = await self._registry._send(
            self, request, context, tried, wait=True, faults=faults
        )
        return ModelStream(self, request, context, tried, target, stream, faults)


@final
class ModelStream:
    """The items of one model request (an async iterator of ``Annotated``, like a
    :class:`~dynamo_trio.runtime.ResponseStream`, which it wraps).

    A failure of the instance serving it sends the request to another
    instance instead, as the module docstring says: before the first item
    always, after it as :class:`StreamFaults` allows (migration).  Leaving
    ``async with`` or :meth:`aclose` closes the current stream (and kills the
    remote work if it has not finished).
    """

    def __init__(
        self,
        route: ModelRoute,
        request: Any,
        context: Context,
        tried: set[Target],
        target: Target | None,
        stream: ResponseStream,
        faults: StreamFaults = _NO_FAULT_HANDLING,
    ) -> None:
        self._route = route
        self._request = request
        self._context = context
        self._tried = tried
        self._target = target
        self._stream = stream
        self._faults = faults
        self._started = False
        self._is_text = isinstance(request, dict) and request.get("request_type") in _TEXT_REQUESTS
        self._migrations_left = faults.migration_limit if self._is_text else 0
        self._text: list[str] = []
        self._token_ids: list[int] = []
        self._finished = False  # the item with the finish reason has arrived
        self._held: Any = None  # a "cancelled" last item the worker chose to end with

    @property
    def instance_id(self) -> int | None:
        """The instance serving the request now (``None`` if nothing was sent)."""
        return self._stream.instance_id

    @property
    def context(self) -> Context:
        """The current call's own context (a child of the request's)."""
        return self._stream.context

    @property
    def migrations(self) -> int:
        """How many times the request moved after its first item."""
        return self._faults.migration_limit - self._migrations_left if self._is_text else 0

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Annotated:
        while True:
            if self._held is not None:
                held = await self._worker_ended_early()
                if held is None:
                    continue  # moved to another instance
                item: Annotated = held[0]
                return item
            try:
                got = await self._stream.receive(idle_timeout=self._faults.idle_timeout)
            except _RETRYABLE as exc:
                if self._finished:
                    raise StopAsyncIteration from None
                await self._recover(exc)
                continue
            except ResponseTimeout:
                self._route._registry._failed(self._target)
                raise
            self._started = True
            if got is None:
                await self._ended()
                raise StopAsyncIteration
            if self._is_text and not self._seen([got.data()]):
                self._held = got  # decided on the next call
                continue
            return got

    async def receive_batch(self) -> list[Any]:
        """The data of every item that has arrived, at least one; ``[]`` at the end
        (see :meth:`~dynamo_trio.runtime.ResponseStream.receive_batch`)."""
        while True:
            if self._held is not None:
                batch = await self._worker_ended_early()
                if batch is None:
                    continue  # moved to another instance
                return batch
            try:
                batch = await self._stream.receive_batch(idle_timeout=self._faults.idle_timeout)
            except _RETRYABLE as exc:
                if self._finished:
                    return []  # the generation was complete; only its end was lost
                await self._recover(exc)
                continue
            except ResponseTimeout:
                self._route._registry._failed(self._target)
                raise
            self._started = True
            if not batch:
                await self._ended()
                return batch
            if not self._is_text:
                return batch
            batch = self._seen(batch)
            if batch:
                return batch

    async def _ended(self) -> None:
        """At the end of the stream: if it ended because the request was killed (its
        deadline may have reached the call first), let that cancellation land now,
        so the end is never mistaken for a complete generation."""
        if self._context.is_killed():  # reading the state enforces the deadline
            await trio.lowlevel.checkpoint()

    def _seen(self, batch: list[Any]) -> list[Any]:
        """Note what a text generation's items carry; hold back a last item that says
        the worker ended the generation early on its own (see :meth:`_worker_ended_early`)."""
        track = self._migrations_left > 0
        for data in batch:
            if type(data) is not dict:
                continue
            if track:
                text = data.get("text")
                if type(text) is str and text:
                    self._text.append(text)
                token_ids = data.get("token_ids")
                if type(token_ids) is list:
                    self._token_ids.extend(token_ids)
            finish = data.get("finish_reason")
            if finish is not None:
                self._finished = True
                if finish == "cancelled" and data is batch[-1] and not self._context.is_stopped():
                    # Not our stop: the worker's.  Why it stopped decides what we do.
                    self._held = batch.pop()
                    self._finished = False
        return batch

    async def _worker_ended_early(self) -> list[Any] | None:
        """The worker stopped the generation on its own: read its end and see why.

        A worker that stopped it to shut down left it incomplete: the request
        moves to another instance (``None``), or fails with
        :class:`~dynamo_trio.StreamIncomplete`.  Any other reason is the
        worker's own clean end: its last item is delivered as it is.
        """
        held, self._held = self._held, None
        idle = self._faults.idle_timeout
        while await self._stream.receive_batch(idle_timeout=idle):
            pass  # nothing follows a finish reason but the end (later items are ignored)
        stream = self._stream
        if stream.outcome != "stopped" or stream.end_reason != CancelReason.SHUTDOWN:
            self._finished = True
            return [held]
        await self._recover(
            StreamIncomplete("the worker shut down before the generation completed")
        )
        return None

    async def _recover(self, exc: DynamoError) -> None:
        """Send the request to another instance after ``exc``, or raise ``exc``."""
        registry = self._route._registry
        registry._failed(self._target)
        if not self._started:
            self._target, self._stream = await registry._send(
                self._route,
                self._request,
                self._context,
                self._tried,
                wait=True,
                last_error=exc,
                faults=self._faults,
                moved=("new_request", _reason(exc)),
            )
            return
        if self._migrations_left <= 0 or self._context.is_stopped():
            raise exc
        self._migrations_left -= 1
        request = dict(self._request)
        request["continuation"] = {"text": "".join(self._text), "token_ids": list(self._token_ids)}
        self._target, self._stream = await registry._send(
            self._route,
            request,
            self._context,
            self._tried,
            wait=True,
            last_error=exc,
            faults=self._faults,
            moved=("ongoing_request", _reason(exc)),
            continuing=True,
        )

    async def aclose(self) -> None:
        """Close the stream; if the worker is still producing, kill its work now."""
        await self._stream.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._stream.__aexit__(exc_type, exc, tb)


class ModelRegistry:
    """A live view of the namespace's model cards, answering "where does model X go?"."""

    def __init__(self, runtime: DistributedRuntime, namespace: str, router_mode: RouterMode):
        self._runtime = runtime
        self._namespace = namespace
        self._router_mode = router_mode
        self._cards: PrefixView[ModelCard] | None = None
        self._first_seen: dict[str, int] = {}
        self._index_version = -1
        self._index: dict[tuple[str, ModelType], list[ModelCard]] = {}
        self._types: dict[str, set[ModelType]] = {}
        self._clients: dict[str, Client] = {}
        self._turns: dict[tuple[str, ModelType], int] = defaultdict(int)
        self._down_until: dict[Target, float] = {}

    async def start(self) -> None:
        """Begin watching discovery (the watch lives as long as the runtime)."""
        self._cards = await self._runtime.watch_prefix(
            model_prefix(self._namespace), decode_model_card
        )

    def _view(self) -> PrefixView[ModelCard]:
        if self._cards is None:
            raise RuntimeError("the model registry has not been started")
        return self._cards

    def _refresh(self) -> None:
        """Rebuild the index if the cards changed since it was built."""
        view = self._view()
        if view.version == self._index_version:
            return
        index: dict[tuple[str, ModelType], list[ModelCard]] = defaultdict(list)
        types: dict[str, set[ModelType]] = defaultdict(set)
        cards = view.items()
        for key in sorted(cards):
            card = cards[key]
            index[card.name, card.model_type].append(card)
            types[card.name].add(card.model_type)
        self._index, self._types = dict(index), dict(types)
        self._index_version = view.version

    def models(self) -> list[tuple[str, int]]:
        """``(name, created)`` for every model with at least one card, by name."""
        self._refresh()
        now = int(time.time())
        names = sorted(self._types)
        for name in names:
            self._first_seen.setdefault(name, now)
        return [(name, self._first_seen[name]) for name in names]

    def cards(self, name: str, model_type: ModelType) -> list[ModelCard]:
        """The cards of ``name`` as ``model_type``, by key."""
        self._refresh()
        return list(self._index.get((name, model_type), ()))

    def route(self, name: str, model_type: ModelType) -> ModelRoute:
        """The route for ``name`` as a ``model_type`` model.

        Raises:
            RequestError: 404 if no worker serves the model, or serves it as
                another type (say, a chat request for an embeddings model).
        """
        self._refresh()
        served = self._types.get(name)
        if not served:
            raise RequestError(
                404,
                f"The model `{name}` does not exist.",
                code="model_not_found",
                param="model",
            )
        cards = self._index.get((name, model_type))
        if not cards:
            raise RequestError(
                404,
                f"The model `{name}` does not serve {model_type} requests "
                f"(it serves {', '.join(sorted(served))}).",
                code="model_not_found",
                param="model",
            )
        return ModelRoute(self, name, model_type, cards[0])

    # -- sending ------------------------------------------------------------------

    async def _client(self, card: ModelCard) -> Client:
        path = _path(card)
        client = self._clients.get(path)
        if client is None:
            endpoint = (
                self._runtime.namespace(card.namespace)
                .component(card.component)
                .endpoint(card.endpoint)
            )
            client = self._clients.setdefault(path, await endpoint.client())
        return client

    async def _candidates(
        self, route: ModelRoute, tried: set[Target], *, continuing: bool = False
    ) -> tuple[list[tuple[Target, Client]], list[tuple[int, Client]]]:
        """The live, untried targets of the model (only those that accept continuations,
        if ``continuing``), and its instances not listed yet."""
        now = time.monotonic()
        live: list[tuple[Target, Client]] = []
        unlisted: list[tuple[int, Client]] = []
        seen: dict[str, tuple[set[int], set[int]]] = {}
        for card in self.cards(route.name, route.model_type):
            target = (_path(card), card.instance_id)
            if target in tried or self._down_until.get(target, 0.0) > now:
                continue
            if continuing and not card.accepts_continuation:
                continue
            client = await self._client(card)
            if target[0] not in seen:
                seen[target[0]] = (set(client.live_instance_ids()), set(client.instance_ids()))
            in_rotation, listed = seen[target[0]]
            if card.instance_id in in_rotation:
                live.append((target, client))
            elif card.instance_id not in listed:
                unlisted.append((card.instance_id, client))
        return live, unlisted

    def _pick(self, route: ModelRoute, live: list[tuple[Target, Client]]) -> tuple[Target, Client]:
        if self._router_mode == "random":
            return random.choice(live)
        turn = self._turns[route.name, route.model_type]
        self._turns[route.name, route.model_type] = (turn + 1) % (1 << 62)
        return live[turn % len(live)]

    async def _send(
        self,
        route: ModelRoute,
        request: Any,
        context: Context,
        tried: set[Target],
        *,
        wait: bool = False,
        last_error: DynamoError | None = None,
        faults: StreamFaults = _NO_FAULT_HANDLING,
        moved: Moved | None = None,
        continuing: bool = False,
    ) -> tuple[Target | None, ResponseStream]:
        """Send to a live instance of the model not tried yet, moving on from any that fails.

        ``moved``: this send moves the request away from an instance that failed
        it; counted (``faults.on_migration``) once the request reaches another.
        ``continuing``: only to instances that accept continuations.

        Raises:
            ``last_error`` (or the last connection error, or :class:`NoInstances`)
            when no candidate is left.
        """
        wait_until = trio.current_time() + _INSTANCE_WAIT if wait else -math.inf
        while True:
            live, unlisted = await self._candidates(route, tried, continuing=continuing)
            if not live and unlisted and trio.current_time() < wait_until:
                await self._wait_for_any(unlisted, wait_until)
                continue
            if not live:
                if last_error is not None:
                    raise last_error
                raise NoInstances(
                    f"no live instance serves the {route.model_type} model `{route.name}`"
                )
            target, client = self._pick(route, live)
            tried.add(target)
            try:
                stream = await client.direct(request, target[1], context=context)
            except NoInstances as exc:
                last_error = exc  # it left discovery a moment ago
                continue
            except CannotConnect as exc:
                self._failed(target)
                last_error = exc
                moved = moved or ("new_request", "cannot_connect")
                continue
            if moved is not None and faults.on_migration is not None and stream.instance_id:
                faults.on_migration(route.name, *moved)
            return target, stream

    async def _wait_for_any(self, unlisted: list[tuple[int, Client]], deadline: float) -> None:
        """Wait until one of ``unlisted`` is listed, the cards change, or ``deadline``."""
        view = self._view()
        version = view.version
        with trio.move_on_at(deadline):
            async with trio.open_nursery() as nursery:

                async def until(waiter: Any, *args: Any) -> None:
                    await waiter(*args)
                    nursery.cancel_scope.cancel()

                nursery.start_soon(until, view.wait_changed, version)
                for instance_id, client in unlisted:
                    nursery.start_soon(until, client.wait_for_instance, instance_id)

    def _failed(self, target: Target | None) -> None:
        """Keep ``target`` out of this registry's rotation for a while."""
        if target is None:
            return
        now = time.monotonic()
        for stale in [t for t, until in self._down_until.items() if until <= now]:
            del self._down_until[stale]
        self._down_until[target] = now + _DOWN_FOR
