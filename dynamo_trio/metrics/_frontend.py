"""Frontend request metrics: Dynamo's ``dynamo_frontend_*`` families, counted exactly.
One :class:`FrontendMetrics` per process, one :class:`FrontendRequestTracker` per request::

    with metrics.start_request(model, "chat_completions", "stream") as tracker:
        async for chunk in stream:
            tracker.tokens(chunk.token_count)
"""

from __future__ import annotations

import time
from bisect import bisect_left
from typing import TYPE_CHECKING, Any, Final, final, get_args

from prometheus_client import Counter, Gauge, Histogram

from .._context import CancelReason
from ._buckets import (
    CANCELLATION_LATENCY_BUCKETS,
    INTER_TOKEN_LATENCY_BUCKETS,
    REQUEST_DURATION_BUCKETS,
    TIME_TO_FIRST_TOKEN_BUCKETS,
)
from ._lifecycle import LabelChildren, _Lifecycle
from ._names import (
    ERROR_TYPE_CANCELLED,
    ERROR_TYPE_INTERNAL,
    ERROR_TYPE_NONE,
    FRONTEND_ENDPOINTS,
    LABEL_ERROR_TYPE,
    LABEL_FRONTEND_ENDPOINT,
    LABEL_MIGRATION_TYPE,
    LABEL_MODEL,
    LABEL_REASON,
    LABEL_REQUEST_TYPE,
    LABEL_STATUS,
    MIGRATION_TYPES,
    REQUEST_TYPES,
    STATUS_ERROR,
    STATUS_SUCCESS,
    UNKNOWN_REASON,
    FrontendEndpoint,
    FrontendStatus,
    RequestType,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from prometheus_client import CollectorRegistry

_ROUTE_LABELS: Final = (LABEL_MODEL, LABEL_FRONTEND_ENDPOINT, LABEL_REQUEST_TYPE)
_STATUSES: Final = frozenset(get_args(FrontendStatus))
_MODEL: Final = (LABEL_MODEL,)
# (attribute, type, name, help, labels, keywords), registered in this order: Dynamo's
# families, with dynamo-trio's reason on migrations; then its own, the cancellations by
# reason and their latency.  With --http-workers, the in-flight gauge is the live processes'
# sum, the disconnected clients every process's (dead ones too).
_FAMILIES: Final[tuple[tuple[str, type[Any], str, str, tuple[str, ...], dict[str, Any]], ...]] = (
    ("_requests", Counter, "dynamo_frontend_requests_total",
     "Requests that ended, by status and error type",
     (*_ROUTE_LABELS, LABEL_STATUS, LABEL_ERROR_TYPE), {}),
    ("_inflight", Gauge, "dynamo_frontend_inflight_requests", "Requests being served", _MODEL,
     {"multiprocess_mode": "livesum"}),
    ("_duration", Histogram, "dynamo_frontend_request_duration_seconds",
     "Seconds from receiving a request to its end", _MODEL, {"buckets": REQUEST_DURATION_BUCKETS}),
    ("_ttft", Histogram, "dynamo_frontend_time_to_first_token_seconds",
     "Seconds from receiving a request to its first output token", _MODEL,
     {"buckets": TIME_TO_FIRST_TOKEN_BUCKETS}),
    ("_itl", Histogram, "dynamo_frontend_inter_token_latency_seconds",
     "Seconds between consecutive output tokens", _MODEL,
     {"buckets": INTER_TOKEN_LATENCY_BUCKETS}),
    ("_output_tokens", Counter, "dynamo_frontend_output_tokens_total", "Output tokens sent",
     _MODEL, {}),
    ("_cancellations", Counter, "dynamo_frontend_model_cancellation_total",
     "Requests cancelled, each counted once", _ROUTE_LABELS, {}),
    ("_cancelled_by_reason", Counter, "dynamo_frontend_cancelled_requests_total",
     "Requests cancelled, each counted once, by the first cancellation reason",
     (*_ROUTE_LABELS, LABEL_REASON), {}),
    ("_cancellation_latency", Histogram, "dynamo_frontend_cancellation_latency_seconds",
     "Seconds from noticing a cancellation to the request having ended",
     (LABEL_MODEL, LABEL_REASON), {"buckets": CANCELLATION_LATENCY_BUCKETS}),
    ("_migrations", Counter, "dynamo_frontend_model_migration_total",
     "Requests moved to another worker because theirs failed or was lost",
     (LABEL_MODEL, LABEL_MIGRATION_TYPE, LABEL_REASON), {}),
    ("_disconnected", Gauge, "dynamo_frontend_disconnected_clients",
     "Clients that disconnected before their response ended (only goes up, as in Dynamo)", (),
     {"multiprocess_mode": "sum"}),
)  # fmt: skip


@final
class FrontendMetrics:
    """The ``dynamo_frontend_*`` metric families of one frontend process (one per registry)."""

    _requests: Counter
    _inflight: Gauge
    _duration: Histogram
    _ttft: Histogram
    _itl: Histogram
    _output_tokens: Counter
    _cancellations: Counter
    _cancelled_by_reason: Counter
    _cancellation_latency: Histogram
    _migrations: Counter
    _disconnected: Gauge

    def __init__(
        self, registry: CollectorRegistry, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._clock = clock
        for attribute, kind, name, doc, labels, keywords in _FAMILIES:
            setattr(self, attribute, kind(name, doc, labels, registry=registry, **keywords))
        self._routes: dict[tuple[str, str, str], _Route] = {}

    def migrated(self, model: str, migration_type: str, reason: str) -> None:
        """Count one move of a request to another worker (Dynamo's ``new_request`` before its
        first item, ``ongoing_request`` mid-stream); ``reason``: why its worker was left."""
        if migration_type not in MIGRATION_TYPES:
            raise ValueError(f"unknown migration type {migration_type!r}")
        self._migrations.labels(model, migration_type, reason).inc()

    def start_request(
        self, model: str, endpoint: FrontendEndpoint, request_type: RequestType
    ) -> FrontendRequestTracker:
        """Track one request until :meth:`FrontendRequestTracker.finish`; ``model`` is a
        label value (the name routed to, never unvalidated input)."""
        key = (model, endpoint, request_type)
        route = self._routes.get(key)
        if route is None:
            if endpoint not in FRONTEND_ENDPOINTS:
                raise ValueError(f"unknown endpoint {endpoint!r}")
            if request_type not in REQUEST_TYPES:
                raise ValueError(f"unknown request type {request_type!r}")
            route = self._routes[key] = _Route(self, key)
        route.inflight.inc()
        return FrontendRequestTracker(route, self._clock())


@final
class _Route:
    """Label children of one ``(model, endpoint, request_type)``, bound once."""

    def __init__(self, metrics: FrontendMetrics, key: tuple[str, str, str]) -> None:
        model = key[0]
        self.metrics = metrics
        self.inflight = metrics._inflight.labels(model)
        self.duration = metrics._duration.labels(model)
        self.ttft = metrics._ttft.labels(model)
        self.itl = metrics._itl.labels(model)
        self.output_tokens = metrics._output_tokens.labels(model)
        # Bound now so the series reads 0 before the first cancellation.
        self.cancellations = metrics._cancellations.labels(*key)
        self.by_status = LabelChildren(metrics._requests, *key)
        self.by_reason = LabelChildren(metrics._cancelled_by_reason, *key)
        self.latency = LabelChildren(metrics._cancellation_latency, model)


@final
class FrontendRequestTracker(_Lifecycle):
    """One HTTP request: cancelled at most once, finished exactly once (all is ignored after).
    :meth:`cancelled` and :meth:`finish` are thread-safe; the token methods are the stream's."""

    __slots__ = ("_last_token_at", "_route", "_started")

    def __init__(self, route: _Route, started: float) -> None:
        super().__init__()
        self._route = route
        self._started = started
        self._last_token_at: float | None = None  # None: no token yet

    def first_token(self) -> None:
        """Observe the time to first token, once (for callers that do not count tokens)."""
        if self._last_token_at is None and not self._finished:
            now = self._last_token_at = self._route.metrics._clock()
            self._route.ttft.observe(now - self._started)

    def tokens(self, count: int = 1) -> None:
        """Note that ``count`` output tokens were just sent: the first call observes the time
        to first token, later ones ``count`` gaps of (time since the last call) / ``count``."""
        if count <= 0 or self._finished:
            return
        route = self._route
        route.output_tokens.inc(count)
        now = route.metrics._clock()
        last, self._last_token_at = self._last_token_at, now
        if last is None:
            route.ttft.observe(now - self._started)
            last, count = now, count - 1
        if count:
            observe_many(route.itl, (now - last) / count, count)

    def cancelled(self, reason: str) -> None:
        """Count the request as cancelled (a low-cardinality ``reason``); the first call wins.
        Starts the latency clock; ignored after :meth:`finish`; checkpoint-free."""
        route = self._route
        signal = self._mark_cancelled(str(reason), route.metrics._clock())
        if signal is None:
            return
        route.cancellations.inc()
        route.by_reason[signal.reason].inc()
        if signal.reason == CancelReason.CLIENT_DISCONNECT:
            route.metrics._disconnected.inc()

    def finish(self, status: FrontendStatus = "success", error_type: str | None = None) -> None:
        """Record the end of the request; only the first call counts (docs/cancellation.md).
        ``error_type`` (Dynamo's, default ``internal``) goes only with ``"error"``."""
        if status not in _STATUSES:
            raise ValueError(f"unknown status {status!r}; expected one of {sorted(_STATUSES)}")
        if status == STATUS_SUCCESS and error_type:
            raise ValueError(f"error_type {error_type!r} given with status 'success'")
        if error_type == ERROR_TYPE_CANCELLED:
            self.cancelled(UNKNOWN_REASON)
        ended, signal = self._mark_finished()
        if not ended:
            return
        route = self._route
        now = route.metrics._clock()
        if signal is not None:
            status, error_type = STATUS_ERROR, ERROR_TYPE_CANCELLED
            route.latency[signal.reason].observe(now - signal.at)
        elif status == STATUS_ERROR:
            error_type = error_type or ERROR_TYPE_INTERNAL
        else:
            error_type = ERROR_TYPE_NONE
        route.by_status[status, error_type].inc()
        route.inflight.dec()
        route.duration.observe(now - self._started)

    def __exit__(self, _type: object, exc: BaseException | None, _tb: object) -> None:
        """Finish if the block did not: ``success``, an :class:`Exception` ``("error",
        "internal")``, anything else (``trio.Cancelled``: the client left) cancelled."""
        if exc is None:
            self.finish()
        elif isinstance(exc, Exception):
            self.finish(STATUS_ERROR)
        else:
            self.finish(STATUS_ERROR, ERROR_TYPE_CANCELLED)


def observe_many(histogram: Histogram, amount: float, count: int) -> None:
    """``histogram.observe(amount)``, ``count`` times, at the cost of one (prometheus-client
    has none): adds to the bucket and sum ``observe`` would pick, else calls it."""
    bounds: list[float] = getattr(histogram, "_upper_bounds", [])
    # NaN is not under the last bound (+Inf): observe counts it nowhere.
    if not bounds or not amount <= bounds[-1]:
        for _ in range(count):
            histogram.observe(amount)
        return
    histogram._sum.inc(amount * count)
    histogram._buckets[bisect_left(bounds, amount)].inc(count)
