"""The models the frontend serves, and which workers each request for them goes to
(docs/architecture.md, "Models and migration").
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Self, final

import trio

from .._errors import (
    CannotConnect,
    Disconnected,
    DynamoError,
    EngineShutdown,
    NoInstances,
    StreamIncomplete,
)
from ..discovery import DiscoveryError, ModelCard, decode_model_card, model_prefix
from ..llm import RequestError

if TYPE_CHECKING:
    from collections.abc import Callable

    from .._config import RouterMode
    from .._context import Context
    from ..discovery import ModelType, PrefixView
    from ..runtime import Client, DistributedRuntime, ResponseStream, Target

_log = logging.getLogger("dynamo_trio.frontend")

_INSTANCE_WAIT: Final = 2.0  # how long a request waits for one of its instances to be listed
_PREPARE_RETRY: Final = (0.1, 2.0)  # backoff (first, longest) to open an instance watch
_RETRYABLE: Final = (CannotConnect, Disconnected, EngineShutdown, StreamIncomplete)
_TEXT_REQUESTS: Final = frozenset({"chat", "completion"})  # streams that can continue elsewhere
_EARLY_END: Final = "the worker ended the request early without being asked"
_SHUT_DOWN_EARLY: Final = "the worker shut down before the generation was complete"


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamFaults:
    """What a model request does when the worker serving it fails (docs/architecture.md)."""

    migration_limit: int = 0
    """Moves allowed after the first item (0: a lost worker fails the request)."""
    idle_timeout: float | None = None
    """Seconds the worker may send nothing before the request fails (``None``: no bound)."""
    on_migration: Callable[[str, str, str], None] | None = None
    """Told ``(model, migration_type, reason)`` each time the request moves."""


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
@dataclass(frozen=True, slots=True)
class ModelRoute:
    """Requests for one model as one type (made per request by :meth:`ModelRegistry.route`)."""

    registry: ModelRegistry
    name: str
    model_type: ModelType
    card: ModelCard
    """One of the model's cards (the first by key), for what all its cards share."""

    async def call(
        self, request: Any, context: Context, faults: StreamFaults = StreamFaults()
    ) -> ModelStream:
        """Send ``request`` to one of the model's instances, linked under ``context``;
        ``NoInstances``/``CannotConnect`` (503) if none is live and reachable."""
        stream = ModelStream(self, request, context, faults)
        await stream._send(request)
        return stream


@final
class ModelStream:
    """The items of one model request, in batches, moved to another instance when its
    worker fails: before the first item always, after it as :class:`StreamFaults` allows."""

    def __init__(
        self, route: ModelRoute, request: Any, context: Context, faults: StreamFaults
    ) -> None:
        self._route = route
        self._request = request
        self._context = context
        self._faults = faults
        self._tried: set[Target] = set()
        self._target: Target  # (see _send)
        self._stream: ResponseStream
        self._started = False  # an item has arrived
        self._is_text = type(request) is dict and request.get("request_type") in _TEXT_REQUESTS
        self._migrations_left = faults.migration_limit if self._is_text else 0
        # What the consumer has been given, for a continuation (while it may move).
        self._text: list[str] = []
        self._token_ids: list[int] = []
        self._finished = False  # the item with the finish reason has been given out
        self._held: Any = None  # a "cancelled" last item the worker ended with on its own

    @property
    def instance_id(self) -> int | None:
        """The instance serving the request now (``None`` if nothing was sent)."""
        return self._stream.instance_id

    async def receive_batch(self) -> list[Any] | None:
        """As :meth:`~dynamo_trio.runtime.ResponseStream.receive_batch`, moving on failures;
        ``None`` when :meth:`nudge` woke the wait; a cancellation leaves the stream as it was."""
        while True:
            if self._held is not None and (ended := await self._worker_ended_early()):
                return ended  # (else it moved to another instance)
            stream = self._stream  # (another one once the request moved)
            try:
                items = await stream.receive_batch(
                    idle_timeout=self._faults.idle_timeout, keep_if_cancelled=True
                )
            except _RETRYABLE as exc:
                if self._finished:
                    return []  # the generation was complete; only its end was lost
                await self._recover(exc)
                continue
            if not items:
                if not stream.done:
                    return None  # nudged
                if self._context.is_killed():  # (reading it enforces the deadline)
                    await trio.lowlevel.checkpoint()  # a kill lands now
                if stream.outcome != "stopped" or self._finished or self._context.is_stopped():
                    return items
                await self._recover(StreamIncomplete(_EARLY_END))
                continue
            self._started = True
            if self._is_text:
                self._note(items)
                if not items:
                    continue  # only the held item: decided on the next round
            return items

    def nudge(self) -> None:
        """Make :meth:`receive_batch` waiting for items (now or next) return ``None``."""
        self._stream.nudge()

    def _note(self, items: list[Any]) -> None:
        """Note a text generation's output; hold back a worker's own ``cancelled`` last item."""
        last = items[-1]  # a finish reason is only ever on a stream's last item
        if type(last) is dict:
            finish = last.get("finish_reason")
            if finish == "cancelled" and not self._context.is_stopped():
                self._held = items.pop()  # not our stop: the worker's
            elif finish is not None:
                self._finished = True
        if self._migrations_left > 0:
            for value in items:
                if type(value) is not dict:
                    continue
                if type(text := value.get("text")) is str and text:
                    self._text.append(text)
                if type(token_ids := value.get("token_ids")) is list:
                    self._token_ids.extend(token_ids)

    async def _worker_ended_early(self) -> list[Any] | None:
        """The worker stopped the generation on its own: a clean end (``[its held item]``),
        unless it was shutting down: then the request moves (``None``) or fails."""
        held, self._held = self._held, None
        stream = self._stream
        try:
            while await stream.receive_batch(idle_timeout=self._faults.idle_timeout):
                pass  # nothing follows a finish reason but the end
        except _RETRYABLE:
            if not self._context.is_stopped():
                await self._recover(StreamIncomplete(_SHUT_DOWN_EARLY))
                return None
        self._finished = True
        return [held]

    async def _recover(self, exc: DynamoError) -> None:
        """Take the failed instance out of rotation (a no-op if already out), then send the
        request to another after ``exc``, or raise ``exc``."""
        reason = _reason(exc)
        self._route.registry._runtime.router.failed(  # (expected: a shut-down instance drains)
            self._target, f"{type(exc).__name__}: {exc}", expected=reason == "engine_shutdown"
        )
        if not self._started:
            await self._send(self._request, moved=("new_request", reason), last_error=exc)
            return
        if self._migrations_left <= 0 or self._context.is_stopped():
            raise exc
        self._migrations_left -= 1
        request = dict(self._request)
        request["continuation"] = {"text": "".join(self._text), "token_ids": list(self._token_ids)}
        try:
            await self._send(request, moved=("ongoing_request", reason), continuing=True)
        except CannotConnect as lost:  # NoInstances is one
            raise type(exc)(
                f"{exc.message}; no other instance could take the request over ({lost.message})"
            ) from lost
        _log.info(
            "request %s moved to instance %x after %d token(s): %s",
            self._context.id(),
            self._stream.instance_id or 0,
            len(self._token_ids),
            exc,
        )

    async def _send(
        self,
        request: Any,
        *,
        moved: tuple[str, str] | None = None,
        last_error: DynamoError | None = None,
        continuing: bool = False,
    ) -> None:
        """Send ``request`` to an instance the router chooses, moving on from any that fails;
        ``moved`` (``(migration_type, reason)``, the metric's labels) is counted once it
        reaches one; ``continuing``: only to those taking continuations."""
        route, tried, context = self._route, self._tried, self._context
        registry = route.registry
        router = registry._runtime.router
        on_migration = self._faults.on_migration
        wait_until = trio.current_time() + _INSTANCE_WAIT

        async def candidates() -> dict[Target, str]:
            while True:
                listed, unlisted = await registry._candidates(route, tried, continuing)
                live = any(router.is_live(t) and t not in tried for t in listed)
                if live or not unlisted or trio.current_time() >= wait_until:
                    return listed
                await registry._wait_for_any(unlisted, wait_until)

        async def send(target: Target) -> tuple[Target, ResponseStream]:
            nonlocal moved
            client = registry._clients[target[0]]
            try:
                stream = await client.direct(request, target[1], context=context)
            except CannotConnect as exc:
                if not isinstance(exc, NoInstances):  # (that one left discovery a moment ago)
                    moved = moved or ("new_request", "cannot_connect")
                raise
            if moved is not None and on_migration is not None and stream.instance_id:
                on_migration(route.name, *moved)
            return target, stream

        self._target, self._stream = await router.send(
            candidates,
            send,
            tried,
            mode=registry._router_mode,
            turn=(route.name, route.model_type),
            last_error=last_error,
            nobody=f"no live instance serves the {route.model_type} model `{route.name}`",
        )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self._stream.__aexit__(*exc_info)


class ModelRegistry:
    """A live view of the namespace's model cards, answering "where does model X go?"."""

    def __init__(self, runtime: DistributedRuntime, namespace: str, router_mode: RouterMode):
        self._runtime = runtime
        self._namespace = namespace
        self._router_mode = router_mode
        self._cards: PrefixView[ModelCard]  # (see start)
        self._first_seen: dict[str, int] = {}
        self._index_version = -1
        self._index: dict[tuple[str, ModelType], list[ModelCard]] = {}
        self._clients: dict[str, Client] = {}

    async def start(self) -> None:
        """Begin watching discovery (the watches live as long as the runtime)."""
        self._cards = await self._runtime.watch_prefix(
            model_prefix(self._namespace), decode_model_card
        )
        self._runtime.start_soon(self._prepare_clients, name="model endpoints' watches")

    async def _prepare_clients(self) -> None:
        """Open the instance watch of every endpoint a card names, as the cards appear."""
        view = self._cards
        version = view.version
        delay = _PREPARE_RETRY[0]
        while True:
            cards = view.items().values()
            missing = {path: card for card in cards if (path := _path(card)) not in self._clients}
            for card in missing.values():
                try:
                    await self._client(card)
                except DiscoveryError as exc:
                    _log.warning("cannot watch the instances of %s yet: %s", _path(card), exc)
                except RuntimeError:
                    return  # the runtime is closing
            if missing.keys() - self._clients.keys():  # some failed: try again
                await trio.sleep(delay)
                delay = min(delay * 2, _PREPARE_RETRY[1])
                continue
            delay = _PREPARE_RETRY[0]
            try:
                version = await view.wait_changed(version)
            except DiscoveryError as exc:  # the cards' watch ended: requests see it too
                _log.warning("model cards no longer watched: %s", exc)
                return

    def _refresh(self) -> None:
        """Rebuild the index if the cards changed since it was built."""
        view = self._cards
        if view.version != self._index_version:
            self._index = defaultdict(list)
            for _key, card in sorted(view.items().items()):
                self._index[card.name, card.model_type].append(card)
            self._index_version = view.version

    def models(self) -> list[tuple[str, int]]:
        """``(name, created)`` for every model with at least one card, by name."""
        self._refresh()
        now = int(time.time())
        names = sorted({name for name, _ in self._index})
        return [(name, self._first_seen.setdefault(name, now)) for name in names]

    def cards(self, name: str, model_type: ModelType) -> list[ModelCard]:
        """The cards of ``name`` as ``model_type``, by key."""
        self._refresh()
        return list(self._index.get((name, model_type), ()))

    def route(self, name: str, model_type: ModelType) -> ModelRoute:
        """The route for ``name`` as a ``model_type`` model (404 if not served as that)."""
        self._refresh()
        cards = self._index.get((name, model_type))
        if not cards:
            message = f"The model `{name}` does not exist."
            if served := sorted(served_type for named, served_type in self._index if named == name):
                message = (
                    f"The model `{name}` does not serve {model_type} requests "
                    f"(it serves {', '.join(served)})."
                )
            raise RequestError(404, message, code="model_not_found", param="model")
        return ModelRoute(self, name, model_type, cards[0])

    async def _client(self, card: ModelCard) -> Client:
        path = _path(card)
        if (client := self._clients.get(path)) is None:
            namespace = self._runtime.namespace(card.namespace)
            endpoint = namespace.component(card.component).endpoint(card.endpoint)
            client = self._clients.setdefault(path, await endpoint.client())
        return client

    async def _candidates(
        self, route: ModelRoute, tried: set[Target], continuing: bool
    ) -> tuple[dict[Target, str], list[tuple[int, Client]]]:
        """The model's listed targets with their addresses, and the untried unlisted ones."""
        listed: dict[Target, str] = {}
        unlisted: list[tuple[int, Client]] = []
        for card in self.cards(route.name, route.model_type):
            if continuing and not card.accepts_continuation:
                continue
            try:
                client = await self._client(card)
            except DiscoveryError as exc:
                raise NoInstances(
                    f"cannot look up the instances of {_path(card)} (discovery unavailable: {exc})"
                ) from None
            target = (_path(card), card.instance_id)
            if (address := client.targets().get(target)) is not None:
                listed[target] = address
            elif target not in tried:
                unlisted.append((card.instance_id, client))
        return listed, unlisted

    async def _wait_for_any(self, unlisted: list[tuple[int, Client]], deadline: float) -> None:
        """Wait until one of ``unlisted`` is listed, the cards change, or ``deadline``."""
        with trio.move_on_at(deadline):
            async with trio.open_nursery() as nursery:

                async def until(waiter: Any, *args: Any) -> None:
                    await waiter(*args)
                    nursery.cancel_scope.cancel()

                nursery.start_soon(until, self._cards.wait_changed, self._cards.version)
                for instance_id, client in unlisted:
                    nursery.start_soon(until, client.wait_for_instance, instance_id)
