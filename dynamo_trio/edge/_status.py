"""The status routes both HTTP servers answer at the edge (:func:`status_routes`)."""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Iterable, Mapping
from itertools import islice
from types import SimpleNamespace
from typing import Any, Final
from urllib.parse import parse_qs

import trio
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from ._edge import EdgeRequest, EdgeResponse, Route, json_bytes

_log = logging.getLogger("dynamo_trio.http")

Health = Callable[[], tuple[int, Mapping[str, Any]]]
"""``() -> (status code, JSON payload)`` for ``/health`` and ``/live``."""
InflightListing = Callable[[], Iterable[Mapping[str, Any]] | Awaitable[Iterable[Mapping[str, Any]]]]
"""One ``Context.snapshot()`` tree per in-flight request (perhaps gathered from processes)."""
MetricsSource = CollectorRegistry | Callable[[bytes], Awaitable[tuple[bytes, bytes]]]
"""A registry to expose, or ``accept header -> (body, content type)`` (a merged view)."""

_INTERNAL: Final = EdgeResponse(500, json_bytes({"error": "the status callback failed"}))


def status_routes(
    *, health: Health, metrics: MetricsSource, inflight: InflightListing, live: Health | None = None
) -> list[Route]:
    """``/metrics`` (Prometheus, or OpenMetrics if ``Accept`` asks), ``/health`` and ``/live``
    (quick callbacks; ``live`` defaults to ``health``), and ``/debug/requests`` (the in-flight
    request trees, oldest first; ``?min_age=5`` keeps the stuck ones).  A callback that raises
    is answered 500, never a crashed connection."""

    def answer(callback: Health) -> EdgeResponse:
        try:
            status, payload = callback()
        except Exception:
            _log.exception("the health callback failed")
            return _INTERNAL
        return EdgeResponse(status, json_bytes(payload))

    async def metrics_route(request: EdgeRequest) -> EdgeResponse:
        accept = request.headers.get(b"accept", b"")
        if isinstance(metrics, CollectorRegistry):
            encode, content_type = choose_encoder(accept.decode("latin-1"))
            return EdgeResponse(200, await exposition(encode, metrics), content_type.encode())
        return EdgeResponse(200, *await metrics(accept))

    async def debug_route(request: EdgeRequest) -> EdgeResponse:
        try:
            min_age = float(parse_qs(request.query.decode("latin-1")).get("min_age", ["0"])[-1])
        except ValueError:
            min_age = math.nan
        if math.isnan(min_age):
            return EdgeResponse(400, json_bytes({"error": "min_age must be a number of seconds"}))
        listed = inflight()
        trees = listed if not isinstance(listed, Awaitable) else await listed
        kept = sorted((tree for tree in trees if _age(tree) >= min_age), key=_age, reverse=True)
        return EdgeResponse(200, json_bytes(kept))

    return [
        Route("/health", lambda request: answer(health)),
        Route("/live", lambda request: answer(live or health)),
        Route("/metrics", metrics_route),
        Route("/debug/requests", debug_route),
    ]


_EOF: Final = b"# EOF\n"
_FAMILIES_PER_STEP: Final = 8


async def exposition(encode: Callable[[Any], bytes], registry: CollectorRegistry) -> bytes:
    """``encode(registry)``, a few metric families at a time with a checkpoint between, so
    that a scrape of many families holds neither the loop nor (beside an engine's thread)
    the GIL for long; OpenMetrics' ``# EOF`` ends the whole, not each part."""
    families = iter(registry.collect())
    parts: list[bytes] = []
    while True:
        group = list(islice(families, _FAMILIES_PER_STEP))
        parts.append(encode(SimpleNamespace(collect=group.copy)))  # a registry of the group
        if len(group) < _FAMILIES_PER_STEP:
            break
        await trio.lowlevel.checkpoint()
    body = b"".join(part.removesuffix(_EOF) for part in parts)
    return body + _EOF if parts[-1].endswith(_EOF) else body


def _age(tree: Mapping[str, Any]) -> float:
    age = tree.get("age_s")
    return float(age) if isinstance(age, int | float) else 0.0
