"""Worker-side request metrics: Dynamo's ``dynamo_component_*`` families, counted exactly.

One :class:`WorkerMetrics` per process, built on the process's registry; one
:class:`EndpointMetrics` per served endpoint (label children bound once); one
:class:`RequestTracker` per request::

    metrics = WorkerMetrics(registry)
    generate = metrics.endpoint("dynamo", "backend", "generate")

    with generate.start_request() as tracker:
        ctx.add_cancel_callback(lambda _ctx, _state, reason: tracker.cancelled(reason))
        async with ctx.scope(drain_grace=5.0):
            ...                                  # run the handler to its end
        outcome = "killed" if ctx.is_killed() else "stopped" if ctx.is_stopped() else "complete"
        tracker.finish(outcome)

What counts as a cancellation
=============================

``tracker.cancelled(reason)`` says that a cancel signal reached the worker
(a ``stop`` or ``kill`` frame, the caller's connection dropping, a deadline).
The first call wins; later ones (the socket closing after the kill frame) are
ignored.  ``tracker.finish(outcome)`` says how the work ended, once; and it is
the *outcome* that decides whether the request was cancelled:

* ``"complete"``: the handler produced all of its output.  **Never** a
  cancellation, even if a signal arrived after the last item (the race that
  made Dynamo 1.1.0 count ~10% of normal completions);
* ``"stopped"`` / ``"killed"``: the work was cut short.  **Always** exactly
  one cancellation, with the signal's reason, or ``"unknown"`` if nobody
  called ``cancelled()`` (so a cancellation is never missed);
* ``"error"``: the handler raised; counted in ``errors_total`` and, if a
  signal had arrived, also as a cancellation.

So ``dynamo_component_cancellation_total`` equals the number of requests that
ended stopped or killed, plus those that failed after being told to cancel.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Final, Literal, Self, final, get_args

from prometheus_client import Counter, Gauge, Histogram

from ._buckets import CANCELLATION_LATENCY_BUCKETS, REQUEST_DURATION_BUCKETS
from ._lifecycle import CancelSignal, _Lifecycle
from ._names import (
    COMPONENT_CANCELLATION_LATENCY_SECONDS,
    COMPONENT_CANCELLATION_TOTAL,
    COMPONENT_CANCELLED_REQUESTS_TOTAL,
    COMPONENT_CANCELLING_REQUESTS,
    COMPONENT_ERRORS_TOTAL,
    COMPONENT_INFLIGHT_REQUESTS,
    COMPONENT_REQUEST_DURATION_SECONDS,
    COMPONENT_REQUESTS_TOTAL,
    ERROR_TYPE_GENERATE,
    LABEL_COMPONENT,
    LABEL_ENDPOINT,
    LABEL_ERROR_TYPE,
    LABEL_NAMESPACE,
    LABEL_REASON,
    UNKNOWN_REASON,
)

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import TracebackType

    from prometheus_client import CollectorRegistry

__all__ = ["EndpointMetrics", "RequestTracker", "WorkerMetrics", "WorkerOutcome"]

WorkerOutcome = Literal["complete", "stopped", "killed", "error"]
"""How a request's work ended on the worker."""

_OUTCOMES: Final = frozenset(get_args(WorkerOutcome))
_CUT_SHORT: Final = frozenset({"stopped", "killed"})
_LABELS: Final = (LABEL_NAMESPACE, LABEL_COMPONENT, LABEL_ENDPOINT)


@final
class WorkerMetrics:
    """The ``dynamo_component_*`` metric families of one worker process.

    Build exactly one per registry (a second one on the same registry raises
    ``ValueError: Duplicated timeseries``); pass it to whatever serves
    endpoints.  Nothing here is global, so two registries in one process (two
    workers in one test) never see each other's counts.

    Args:
        registry: The process's registry; the status server exposes it.
        clock: Seconds, monotonic; injectable so tests can control latencies.
    """

    def __init__(
        self, registry: CollectorRegistry, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._clock = clock
        self._requests = Counter(
            COMPONENT_REQUESTS_TOTAL,
            "Requests received by the endpoint's handler",
            _LABELS,
            registry=registry,
        )
        self._inflight = Gauge(
            COMPONENT_INFLIGHT_REQUESTS,
            "Requests whose handler work has not ended yet",
            _LABELS,
            registry=registry,
            multiprocess_mode="livesum",
        )
        self._duration = Histogram(
            COMPONENT_REQUEST_DURATION_SECONDS,
            "Seconds from receiving a request to its handler work having ended",
            _LABELS,
            registry=registry,
            buckets=REQUEST_DURATION_BUCKETS,
        )
        self._errors = Counter(
            COMPONENT_ERRORS_TOTAL,
            "Requests whose handler failed, by error type",
            (*_LABELS, LABEL_ERROR_TYPE),
            registry=registry,
        )
        self._cancellations = Counter(
            COMPONENT_CANCELLATION_TOTAL,
            "Requests cancelled (stop, kill or caller gone), each counted once",
            _LABELS,
            registry=registry,
        )
        self._cancelled_by_reason = Counter(
            COMPONENT_CANCELLED_REQUESTS_TOTAL,
            "Requests cancelled, each counted once, by the first cancellation reason",
            (*_LABELS, LABEL_REASON),
            registry=registry,
        )
        self._cancellation_latency = Histogram(
            COMPONENT_CANCELLATION_LATENCY_SECONDS,
            "Seconds from the cancel signal reaching the worker to the handler work having ended",
            (*_LABELS, LABEL_REASON),
            registry=registry,
            buckets=CANCELLATION_LATENCY_BUCKETS,
        )
        self._cancelling = Gauge(
            COMPONENT_CANCELLING_REQUESTS,
            "Requests told to cancel whose handler work has not ended yet",
            _LABELS,
            registry=registry,
            multiprocess_mode="livesum",
        )
        self._endpoints: dict[tuple[str, str, str], EndpointMetrics] = {}

    def endpoint(self, namespace: str, component: str, endpoint: str) -> EndpointMetrics:
        """The metrics of one served endpoint, created on first use and cached.

        Creating it makes the endpoint's series visible at zero (so
        ``increase()`` works from the first request and a scrape shows
        ``cancellation_total 0`` rather than nothing).
        """
        key = (namespace, component, endpoint)
        metrics = self._endpoints.get(key)
        if metrics is None:
            metrics = self._endpoints[key] = EndpointMetrics(self, key)
        return metrics


@final
class EndpointMetrics:
    """Label-bound metrics of one ``(namespace, component, endpoint)``; see :meth:`start_request`.

    Obtained from :meth:`WorkerMetrics.endpoint`, not built directly.
    """

    def __init__(self, families: WorkerMetrics, key: tuple[str, str, str]) -> None:
        self._families = families
        self._key = key
        self._clock = families._clock
        self._requests = families._requests.labels(*key)
        self._inflight = families._inflight.labels(*key)
        self._duration = families._duration.labels(*key)
        self._cancellations = families._cancellations.labels(*key)
        self._cancelling = families._cancelling.labels(*key)
        self._errors: dict[str, Counter] = {}
        self._by_reason: dict[str, tuple[Counter, Histogram]] = {}

    @property
    def labels(self) -> tuple[str, str, str]:
        """``(dynamo_namespace, dynamo_component, dynamo_endpoint)``."""
        return self._key

    def start_request(self) -> RequestTracker:
        """Count a received request and track it until :meth:`RequestTracker.finish`.

        Use it as a context manager to make the finish unconditional: a
        request that leaves the ``with`` block unfinished is finished there
        (see :meth:`RequestTracker.__exit__`).
        """
        self._requests.inc()
        self._inflight.inc()
        return RequestTracker(self, self._clock())

    def _record_end(
        self,
        started: float,
        outcome: WorkerOutcome,
        error_type: str | None,
        signal: CancelSignal | None,
    ) -> None:
        now = self._clock()
        self._inflight.dec()
        self._duration.observe(now - started)
        if signal is not None:
            self._cancelling.dec()
        if outcome == "error":
            self._error(error_type or ERROR_TYPE_GENERATE).inc()
        if outcome in _CUT_SHORT or (outcome == "error" and signal is not None):
            self._cancellations.inc()
            by_reason, latency = self._reason(signal.reason if signal else UNKNOWN_REASON)
            by_reason.inc()
            if signal is not None:
                latency.observe(now - signal.at)

    def _error(self, error_type: str) -> Counter:
        child = self._errors.get(error_type)
        if child is None:
            child = self._errors[error_type] = self._families._errors.labels(*self._key, error_type)
        return child

    def _reason(self, reason: str) -> tuple[Counter, Histogram]:
        children = self._by_reason.get(reason)
        if children is None:
            children = self._by_reason[reason] = (
                self._families._cancelled_by_reason.labels(*self._key, reason),
                self._families._cancellation_latency.labels(*self._key, reason),
            )
        return children


@final
class RequestTracker:
    """One request on a worker: told to cancel at most once, finished exactly once.

    Every method is idempotent in the way that matters for counting, and safe
    to call from any thread: :meth:`cancelled` keeps the first signal,
    :meth:`finish` acts once, and a signal after the finish is ignored.

    Obtained from :meth:`EndpointMetrics.start_request`, not built directly.
    """

    __slots__ = ("_endpoint", "_life", "_started")

    def __init__(self, endpoint: EndpointMetrics, started: float) -> None:
        self._endpoint = endpoint
        self._started = started
        self._life = _Lifecycle()

    @property
    def cancel_reason(self) -> str | None:
        """The reason of the first :meth:`cancelled` call, if any."""
        signal = self._life.cancel
        return None if signal is None else signal.reason

    @property
    def finished(self) -> bool:
        """Whether :meth:`finish` has run."""
        return self._life.finished

    def cancelled(self, reason: str) -> None:
        """Note that a cancel signal reached the worker; the first call wins.

        Starts the cancellation-latency clock and raises
        ``dynamo_component_cancelling_requests`` until the finish.  Counting
        happens in :meth:`finish`, which knows whether the signal actually cut
        the work short.  Sync and checkpoint-free, so it can run in a
        :class:`~dynamo_trio.Context` cancel callback.

        Args:
            reason: Usually a :class:`~dynamo_trio.CancelReason`; it becomes a
                label value, so it must come from a small fixed set.
        """
        if self._life.mark_cancelled(str(reason), self._endpoint._clock()) is not None:
            self._endpoint._cancelling.inc()

    def finish(self, outcome: WorkerOutcome = "complete", error_type: str | None = None) -> None:
        """Record how the request's work ended; only the first call counts.

        Call it once the handler's work has *fully* ended (its scope exited,
        its generator closed): the duration and the cancellation latency end
        here.

        Args:
            outcome: ``"complete"``, ``"stopped"``, ``"killed"`` or ``"error"``;
                see the module docstring for what each one counts.
            error_type: Only with ``"error"``; defaults to ``"generate"``
                (Dynamo's type for a failing handler).

        Raises:
            ValueError: On an unknown outcome or an ``error_type`` without
                ``"error"`` (checked before anything is recorded).
        """
        if outcome not in _OUTCOMES:
            raise ValueError(f"unknown outcome {outcome!r}; expected one of {sorted(_OUTCOMES)}")
        if error_type is not None and outcome != "error":
            raise ValueError(f"error_type {error_type!r} given with outcome {outcome!r}")
        ended, signal = self._life.mark_finished()
        if ended:
            self._endpoint._record_end(self._started, outcome, error_type, signal)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Finish the request if the block did not.

        A clean exit is ``"complete"``, or ``"stopped"`` if a cancel signal
        had arrived (the handler honoured it by returning early); an
        :class:`Exception` is ``"error"``; anything else (``trio.Cancelled``,
        ``KeyboardInterrupt``) is ``"killed"``.  An explicit :meth:`finish`
        inside the block takes precedence.
        """
        if exc is None:
            self.finish("complete" if self._life.cancel is None else "stopped")
        elif isinstance(exc, Exception):
            self.finish("error")
        else:
            self.finish("killed")
