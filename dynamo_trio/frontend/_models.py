"""The models the frontend serves, as workers register them in discovery.

A worker announces a model with ``endpoint.register_model(name, type)``: a
:class:`~dynamo_trio.discovery.ModelCard` tied to the worker's lease.  The
registry watches the cards of its namespace, so a model appears when its first
worker registers it and vanishes when its last one goes (shuts down, or dies
and its lease expires).  Requests for a model are routed across the instances
of the endpoint its cards name.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import TYPE_CHECKING, Any, Final

import trio

from ..discovery import ModelCard, decode_model_card, model_prefix
from ..llm import RequestError

if TYPE_CHECKING:
    from .._config import RouterMode
    from .._context import Context
    from ..discovery import ModelType, PrefixView
    from ..runtime import DistributedRuntime, ResponseStream

__all__ = ["ModelRegistry", "ModelRoute"]

# How long a request for a known model waits for its first instance to appear.
_INSTANCE_WAIT: Final = 2.0


class ModelRoute:
    """Where requests for one model (of one type) go."""

    def __init__(self, card: ModelCard, runtime: DistributedRuntime, router_mode: RouterMode):
        self.card: Final = card
        self._runtime = runtime
        self._router_mode = router_mode

    async def call(self, request: Any, context: Context) -> ResponseStream:
        """Send ``request`` to one of the model's instances, linked under ``context``."""
        card = self.card
        endpoint = (
            self._runtime.namespace(card.namespace)
            .component(card.component)
            .endpoint(card.endpoint)
        )
        client = await endpoint.client()
        if not client.instance_ids():
            # The card can be seen a moment before the instance it names.
            with trio.move_on_after(_INSTANCE_WAIT):
                await client.wait_for_instances()
        if self._router_mode == "random":
            return await client.random(request, context=context)
        return await client.round_robin(request, context=context)


class ModelRegistry:
    """A live view of the namespace's model cards, answering "where does model X go?"."""

    def __init__(self, runtime: DistributedRuntime, namespace: str, router_mode: RouterMode):
        self._runtime = runtime
        self._namespace = namespace
        self._router_mode = router_mode
        self._cards: PrefixView[ModelCard] | None = None
        self._first_seen: dict[str, int] = {}

    async def start(self) -> None:
        """Begin watching discovery (the watch lives as long as the runtime)."""
        self._cards = await self._runtime.watch_prefix(
            model_prefix(self._namespace), decode_model_card
        )

    def _all_cards(self) -> list[ModelCard]:
        if self._cards is None:
            raise RuntimeError("the model registry has not been started")
        return sorted(self._cards.items().values(), key=lambda card: card.key)

    def models(self) -> list[tuple[str, int]]:
        """``(name, created)`` for every model with at least one live instance, by name."""
        now = int(time.time())
        names = sorted({card.name for card in self._all_cards()})
        for name in names:
            self._first_seen.setdefault(name, now)
        return [(name, self._first_seen[name]) for name in names]

    def route(self, name: str, model_type: ModelType) -> ModelRoute:
        """The route for ``name`` as a ``model_type`` model.

        Raises:
            RequestError: 404 if no worker serves the model, or serves it as
                another type (say, a chat request for an embeddings model).
        """
        cards = [card for card in self._all_cards() if card.name == name]
        if not cards:
            raise RequestError(
                404,
                f"The model `{name}` does not exist.",
                code="model_not_found",
                param="model",
            )
        typed = [card for card in cards if card.model_type == model_type]
        if not typed:
            served = ", ".join(sorted({card.model_type for card in cards}))
            raise RequestError(
                404,
                f"The model `{name}` does not serve {model_type} requests (it serves {served}).",
                code="model_not_found",
                param="model",
            )
        # Several endpoints may serve one model; send it where most instances are.
        where = Counter((card.namespace, card.component, card.endpoint) for card in typed)
        busiest = where.most_common(1)[0][0]
        card = next(c for c in typed if (c.namespace, c.component, c.endpoint) == busiest)
        return ModelRoute(card, self._runtime, self._router_mode)
