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
and in the rotation of the endpoint's :class:`~dynamo_trio.runtime.Client`
(out of it after a refused or timed-out connection, a connection lost, a
worker going away; back once a background probe reconnects, see
:mod:`dynamo_trio.runtime._client`).  ``round-robin`` (the default) takes
them in turn per model, ``random`` at random.  If the chosen instance cannot
be reached, or its stream fails before its first item (the worker died or
is shutting down), it leaves rotation and the request is sent at once to
another candidate it has not tried, so a model served by a live instance
anywhere is answered even while a dead one's cards wait for its lease to
expire, or while a split keeps this frontend from an instance others reach.
If no candidate is live but some are out of rotation with their rest over
(a probe is trying them), the request tries those rather than failing.  Once an item has arrived the
request belongs to that instance: a later failure is the request's error.

A card can be seen a moment before the instance record it names (they are
separate watches): a request that finds no live candidate but some not yet
listed waits up to ``_INSTANCE_WAIT`` for one to appear.

The instance watch of each endpoint a card names is opened in the background
as soon as the card is seen (retried while etcd is unavailable), not by the
first request for the model: a request never waits for discovery, and an
etcd outage (a member lost, a leader election) costs no request anything,
since the request plane does not need etcd.  A request that still finds an
endpoint's watch unopened while discovery is down is a 503, not a 500.

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

import logging
import math
import random
import time
from collections import defaultdict
from typing import TYPE_CHECKING, Any, Final, Self, TypeVar, final

import trio

from .._errors import CannotConnect, Disconnected, DynamoError, EngineShutdown, NoInstances
from ..discovery import DiscoveryError, ModelCard, decode_model_card, model_prefix
from ..llm import RequestError
from ..runtime import ResponseStream

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from types import TracebackType

    from .._config import RouterMode
    from .._context import Context
    from ..discovery import ModelType, PrefixView
    from ..runtime import Annotated, Client, DistributedRuntime

__all__ = ["ModelRegistry", "ModelRoute", "ModelStream"]

_log = logging.getLogger("dynamo_trio.frontend")

_INSTANCE_WAIT: Final = 2.0
"""How long a request for a known model waits for one of its instances to be listed."""

_PREPARE_RETRY: Final = (0.1, 2.0)
"""Backoff (first, longest) between attempts to open an endpoint's instance watch."""

_RETRYABLE: Final = (CannotConnect, Disconnected, EngineShutdown)
"""Failures before the first item after which another instance may take the request."""

Target = tuple[str, int]
_T = TypeVar("_T")
"""``(endpoint path, instance id)``: one place a model's request can go."""


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

    async def call(self, request: Any, context: Context) -> ModelStream:
        """Send ``request`` to one of the model's instances, linked under ``context``.

        Raises:
            NoInstances: no instance of the model is live (503).
            CannotConnect: no live instance could be reached (503).
        """
        tried: set[Target] = set()
        target, stream = await self._registry._send(self, request, context, tried, wait=True)
        return ModelStream(self, request, context, tried, target, stream)


@final
class ModelStream:
    """The items of one model request (an async iterator of ``Annotated``, like a
    :class:`~dynamo_trio.runtime.ResponseStream`, which it wraps).

    Until the first item arrives, a failure of the instance (see the module
    docstring) sends the request to another instance of the model instead.
    Leaving ``async with`` or :meth:`aclose` closes the current stream (and
    kills the remote work if it has not finished).
    """

    def __init__(
        self,
        route: ModelRoute,
        request: Any,
        context: Context,
        tried: set[Target],
        target: Target | None,
        stream: ResponseStream,
    ) -> None:
        self._route = route
        self._request = request
        self._context = context
        self._tried = tried
        self._target = target
        self._stream = stream
        self._started = False

    @property
    def instance_id(self) -> int | None:
        """The instance serving the request now (``None`` if nothing was sent)."""
        return self._stream.instance_id

    @property
    def context(self) -> Context:
        """The current call's own context (a child of the request's)."""
        return self._stream.context

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Annotated:
        if self._started:
            return await self._stream.__anext__()
        item: Annotated = await self._first(ResponseStream.__anext__)
        return item

    async def receive_batch(self) -> list[Any]:
        """The data of every item that has arrived, at least one; ``[]`` at the end
        (see :meth:`~dynamo_trio.runtime.ResponseStream.receive_batch`)."""
        if self._started:
            return await self._stream.receive_batch()
        batch: list[Any] = await self._first(ResponseStream.receive_batch)
        return batch

    async def _first(self, receive: Callable[[ResponseStream], Awaitable[_T]]) -> _T:
        """The first receive: a failure of the instance moves the request elsewhere."""
        while True:
            try:
                got = await receive(self._stream)
            except _RETRYABLE as exc:
                registry = self._route._registry
                registry._failed(self._target, exc)
                self._target, self._stream = await registry._send(
                    self._route, self._request, self._context, self._tried, last_error=exc
                )
                continue
            self._started = True
            return got

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

    async def start(self) -> None:
        """Begin watching discovery (the watches live as long as the runtime)."""
        self._cards = await self._runtime.watch_prefix(
            model_prefix(self._namespace), decode_model_card
        )
        self._runtime._require_nursery().start_soon(self._prepare_clients)

    async def _prepare_clients(self) -> None:
        """Open the client (the instance watch) of every endpoint a card names, as the
        cards appear, retrying while discovery is unavailable (see the module docstring)."""
        view = self._view()
        version = view.version
        delay = _PREPARE_RETRY[0]
        while True:
            missing = {_path(card): card for card in view.items().values()}
            for path in self._clients:
                missing.pop(path, None)
            failed = False
            for card in missing.values():
                try:
                    await self._client(card)
                except DiscoveryError as exc:
                    _log.warning("cannot watch the instances of %s yet: %s", _path(card), exc)
                    failed = True
                except RuntimeError:
                    return  # the runtime is closing
            if failed:
                await trio.sleep(delay)
                delay = min(delay * 2, _PREPARE_RETRY[1])
                continue
            delay = _PREPARE_RETRY[0]
            try:
                version = await view.wait_changed(version)
            except DiscoveryError as exc:  # the cards' watch ended: requests see it too
                _log.warning("model cards no longer watched: %s", exc)
                return

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
        self, route: ModelRoute, tried: set[Target]
    ) -> tuple[list[tuple[Target, Client]], list[tuple[int, Client]], list[tuple[Target, Client]]]:
        """The model's untried targets: live ones, ones not listed yet, and listed ones
        out of rotation whose rest is over (the longest due first)."""
        live: list[tuple[Target, Client]] = []
        unlisted: list[tuple[int, Client]] = []
        resting: list[tuple[int, Target, Client]] = []
        seen: dict[str, tuple[set[int], set[int], dict[int, int]]] = {}
        for card in self.cards(route.name, route.model_type):
            target = (_path(card), card.instance_id)
            if target in tried:
                continue
            try:
                client = await self._client(card)
            except DiscoveryError as exc:
                raise NoInstances(
                    f"cannot look up the instances of {target[0]} (discovery unavailable: {exc})"
                ) from None
            if target[0] not in seen:
                order = {i: n for n, i in enumerate(client.due_instance_ids())}
                seen[target[0]] = (
                    set(client.live_instance_ids()),
                    set(client.instance_ids()),
                    order,
                )
            in_rotation, listed, resting_order = seen[target[0]]
            if card.instance_id in in_rotation:
                live.append((target, client))
            elif card.instance_id not in listed:
                unlisted.append((card.instance_id, client))
            elif card.instance_id in resting_order:
                resting.append((resting_order[card.instance_id], target, client))
        resting.sort(key=lambda entry: entry[0])
        return live, unlisted, [(target, client) for _, target, client in resting]

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
    ) -> tuple[Target | None, ResponseStream]:
        """Send to a live instance of the model not tried yet, moving on from any that fails.

        Raises:
            ``last_error`` (or the last connection error, or :class:`NoInstances`)
            when no candidate is left.
        """
        wait_until = trio.current_time() + _INSTANCE_WAIT if wait else -math.inf
        while True:
            live, unlisted, resting = await self._candidates(route, tried)
            if not live and unlisted and trio.current_time() < wait_until:
                await self._wait_for_any(unlisted, wait_until)
                continue
            if live:
                target, client = self._pick(route, live)
            elif resting:
                target, client = resting[0]  # none in rotation: one whose rest is over
            else:
                if last_error is not None:
                    raise last_error
                raise NoInstances(
                    f"no live instance serves the {route.model_type} model `{route.name}`"
                )
            tried.add(target)
            try:
                return target, await client.direct(request, target[1], context=context)
            except NoInstances as exc:
                last_error = exc  # it left discovery a moment ago
            except CannotConnect as exc:
                last_error = exc  # the client took it out of rotation

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

    def _failed(self, target: Target | None, error: DynamoError) -> None:
        """Take ``target`` out of its endpoint's rotation (a no-op if already out)."""
        if target is None:
            return
        client = self._clients.get(target[0])
        if client is not None:
            client._instance_failed(
                target[1],
                f"{type(error).__name__}: {error}",
                expected=isinstance(error, EngineShutdown),  # it is draining
            )
