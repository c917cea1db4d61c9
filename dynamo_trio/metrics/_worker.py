"""Worker-side request metrics: Dynamo's ``dynamo_component_*`` families, counted exactly.
One :class:`WorkerMetrics` per process, one :class:`EndpointMetrics` per served endpoint,
one :class:`RequestTracker` per request::

    with generate.start_request() as tracker:
        ctx.add_cancel_callback(lambda _ctx, _state, reason: tracker.cancelled(reason))
        ...
        tracker.finish(outcome)
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Any, Final, Literal, final, get_args

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.metrics_core import Metric

from ._buckets import CANCELLATION_LATENCY_BUCKETS, REQUEST_DURATION_BUCKETS
from ._lifecycle import LabelChildren, _Lifecycle
from ._names import (
    ERROR_TYPE_GENERATE,
    LABEL_COMPONENT,
    LABEL_ENDPOINT,
    LABEL_ERROR_TYPE,
    LABEL_NAMESPACE,
    LABEL_REASON,
    LABEL_WORKER_ID,
    UNKNOWN_REASON,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator

    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics import MetricWrapperBase

WorkerOutcome = Literal["complete", "stopped", "killed", "error"]
"""How a request's work ended on the worker."""

_OUTCOMES: Final = frozenset(get_args(WorkerOutcome))
_CUT_SHORT: Final = frozenset({"stopped", "killed"})
_LABELS: Final = (LABEL_NAMESPACE, LABEL_COMPONENT, LABEL_ENDPOINT)
_LABEL_NAME: Final = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_RESERVED_LABELS: Final = frozenset(
    {*_LABELS, LABEL_WORKER_ID, LABEL_ERROR_TYPE, LABEL_REASON, "le", "quantile"}
)

_EndpointKey = tuple[str, str, str, str | None, tuple[tuple[str, str], ...]]
"""``(namespace, component, endpoint, worker_id, extra labels)``."""
_Kind = Literal["counter", "gauge", "histogram"]
_TYPES: Final[dict[_Kind, Any]] = {"counter": Counter, "gauge": Gauge, "histogram": Histogram}
# (name, type, help, the family's own label after the endpoint's, histogram buckets);
# Dynamo's work_handler families, then dynamo-trio's own (by reason, latency, cancelling).
_FAMILIES: Final[tuple[tuple[str, _Kind, str, str | None, tuple[float, ...]], ...]] = (
    ("dynamo_component_requests_total", "counter",
     "Requests received by the endpoint's handler", None, ()),
    ("dynamo_component_inflight_requests", "gauge",
     "Requests whose handler work has not ended yet", None, ()),
    ("dynamo_component_request_duration_seconds", "histogram",
     "Seconds from receiving a request to its handler work having ended",
     None, REQUEST_DURATION_BUCKETS),
    ("dynamo_component_errors_total", "counter", "Requests whose handler failed, by error type",
     LABEL_ERROR_TYPE, ()),
    ("dynamo_component_cancellation_total", "counter",
     "Requests cancelled (stop, kill or caller gone), each counted once", None, ()),
    ("dynamo_component_cancelled_requests_total", "counter",
     "Requests cancelled, each counted once, by the first cancellation reason", LABEL_REASON, ()),
    ("dynamo_component_cancellation_latency_seconds", "histogram",
     "Seconds from the cancel signal reaching the worker to the handler work having ended",
     LABEL_REASON, CANCELLATION_LATENCY_BUCKETS),
    ("dynamo_component_cancelling_requests", "gauge",
     "Requests told to cancel whose handler work has not ended yet", None, ()),
)  # fmt: skip


def _check_extra_labels(labels: Iterable[object]) -> tuple[tuple[str, str], ...]:
    """Dynamo's ``metrics_labels``: extra ``(name, value)`` string labels; ValueError for
    an invalid, reserved (set by dynamo-trio itself) or repeated name."""
    checked: dict[str, str] = {}
    for entry in labels:
        if not isinstance(entry, tuple | list) or len(entry) != 2:
            raise ValueError(f"metrics labels are (name, value) pairs, not {entry!r}")
        name, value = entry
        if not isinstance(name, str) or not isinstance(value, str):
            raise ValueError(f"a metrics label's name and value are strings, not {entry!r}")
        if not _LABEL_NAME.fullmatch(name) or name.startswith("__"):
            raise ValueError(f"{name!r} is not a Prometheus label name")
        if name in _RESERVED_LABELS:
            raise ValueError(
                f"the label {name!r} is set by dynamo-trio itself and cannot be given "
                "in metrics_labels"
            )
        if name in checked:
            raise ValueError(f"the label {name!r} is given twice in metrics_labels")
        checked[name] = value
    return tuple(checked.items())


@final
class WorkerMetrics:
    """The ``dynamo_component_*`` metric families of one worker process (one per registry).
    Series carry the endpoint's names, and for a runtime's endpoint ``worker_id`` (hex) and
    its ``metrics_labels``: label sets may differ within a family, as in Dynamo."""

    def __init__(
        self, registry: CollectorRegistry, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._clock = clock
        self._endpoints: dict[_EndpointKey, EndpointMetrics] = {}
        registry.register(self)

    def endpoint(
        self,
        namespace: str,
        component: str,
        endpoint: str,
        *,
        worker_id: str | None = None,
        labels: Iterable[tuple[str, str]] = (),
    ) -> EndpointMetrics:
        """The metrics of one served endpoint, cached; its series show at zero from creation.
        ``labels``: Dynamo's ``metrics_labels`` (:func:`_check_extra_labels`)."""
        extra = _check_extra_labels(labels)
        key = (namespace, component, endpoint, worker_id, extra)
        metrics = self._endpoints.get(key)
        if metrics is None:
            metrics = self._endpoints[key] = EndpointMetrics(self, key)
        return metrics

    # The collector interface: one family per name, merging every endpoint's series.

    def describe(self) -> list[Metric]:
        return [
            Metric(name.removesuffix("_total") if kind == "counter" else name, doc, kind)
            for name, kind, doc, _, _ in _FAMILIES
        ]

    def collect(self) -> Iterator[Metric]:
        endpoints = tuple(self._endpoints.values())
        for index, family in enumerate(self.describe()):
            for endpoint in endpoints:
                for metric in endpoint._metrics[index].collect():
                    family.samples.extend(metric.samples)
            yield family


@final
class EndpointMetrics:
    """Label-bound metrics of one served endpoint (from :meth:`WorkerMetrics.endpoint`)."""

    def __init__(self, families: WorkerMetrics, key: _EndpointKey) -> None:
        namespace, component, endpoint, worker_id, extra = key
        self._key: Final = (namespace, component, endpoint)
        self.worker_id: Final = worker_id
        self.extra_labels: Final = dict(extra)
        worker = [] if worker_id is None else [(LABEL_WORKER_ID, worker_id)]
        bound = [*zip(_LABELS, self._key, strict=True), *worker, *extra]
        names = [name for name, _ in bound]
        self._values: Final = tuple(value for _, value in bound)
        # Not registered anywhere: WorkerMetrics collects them, in _FAMILIES order.
        made: list[Any] = []
        for name, kind, doc, own, buckets in _FAMILIES:
            options = {"buckets": buckets} if buckets else {}
            labelnames = (*names, own) if own else names
            made.append(_TYPES[kind](name, doc, labelnames, registry=None, **options))
        self._metrics: Final[tuple[MetricWrapperBase, ...]] = tuple(made)
        requests, inflight, duration, errors, cancellations, by_reason, latency, cancelling = made
        self._clock = families._clock
        self._requests: Final[Counter] = requests.labels(*self._values)
        self._inflight: Final[Gauge] = inflight.labels(*self._values)
        self._duration: Final[Histogram] = duration.labels(*self._values)
        self._cancellations: Final[Counter] = cancellations.labels(*self._values)
        self._cancelling: Final[Gauge] = cancelling.labels(*self._values)
        self._errors: Final[LabelChildren[Counter]] = LabelChildren(errors, *self._values)
        self._by_reason: Final[LabelChildren[Counter]] = LabelChildren(by_reason, *self._values)
        self._latency: Final[LabelChildren[Histogram]] = LabelChildren(latency, *self._values)

    @property
    def labels(self) -> tuple[str, str, str]:
        """``(dynamo_namespace, dynamo_component, dynamo_endpoint)``."""
        return self._key

    def start_request(self) -> RequestTracker:
        """Count a received request and track it (``with``: until finished, for sure)."""
        self._requests.inc()
        self._inflight.inc()
        return RequestTracker(self, self._clock())


@final
class RequestTracker(_Lifecycle):
    """One request on a worker: told to cancel at most once, finished exactly once (thread-safe)."""

    __slots__ = ("_endpoint", "_started")

    def __init__(self, endpoint: EndpointMetrics, started: float) -> None:
        super().__init__()
        self._endpoint = endpoint
        self._started = started

    def cancelled(self, reason: str) -> None:
        """A cancel signal (a low-cardinality ``reason``) reached the worker; the first wins.
        Starts the latency clock and the cancelling gauge; checkpoint-free."""
        if self._mark_cancelled(str(reason), self._endpoint._clock()) is not None:
            self._endpoint._cancelling.inc()

    def finish(self, outcome: WorkerOutcome = "complete", error_type: str | None = None) -> None:
        """Record how the work *fully* ended (the first call counts; docs/cancellation.md);
        ``error_type`` only with ``error`` (default ``generate``)."""
        if outcome not in _OUTCOMES:
            raise ValueError(f"unknown outcome {outcome!r}; expected one of {sorted(_OUTCOMES)}")
        if error_type is not None and outcome != "error":
            raise ValueError(f"error_type {error_type!r} given with outcome {outcome!r}")
        ended, signal = self._mark_finished()
        if not ended:
            return
        endpoint = self._endpoint
        now = endpoint._clock()
        endpoint._inflight.dec()
        endpoint._duration.observe(now - self._started)
        if signal is not None:
            endpoint._cancelling.dec()
        if outcome == "error":
            endpoint._errors[error_type or ERROR_TYPE_GENERATE].inc()
        if outcome in _CUT_SHORT or (outcome == "error" and signal is not None):
            endpoint._cancellations.inc()
            reason = signal.reason if signal else UNKNOWN_REASON
            endpoint._by_reason[reason].inc()
            latency = endpoint._latency[reason]  # bound even unobserved: its series shows
            if signal is not None:
                latency.observe(now - signal.at)

    def __exit__(self, _type: object, exc: BaseException | None, _tb: object) -> None:
        """Finish if the block did not: ``complete`` (``stopped`` after a signal), an
        :class:`Exception` ``error``, anything else (``trio.Cancelled``) ``killed``."""
        if exc is None:
            self.finish("complete" if self._cancel is None else "stopped")
        elif isinstance(exc, Exception):
            self.finish("error")
        else:
            self.finish("killed")
