"""FrontendMetrics: Dynamo's frontend families; one cancellation per cancelled request."""

from __future__ import annotations

import itertools

import pytest
import trio
from prometheus_client import CollectorRegistry

from dynamo_trio import CancelReason
from dynamo_trio.metrics import FrontendMetrics, WorkerMetrics

from ._exposition import FakeClock, Scrape

MODEL = "Qwen/Qwen3-0.6B"
ROUTE = {"model": MODEL, "endpoint": "chat_completions", "request_type": "stream"}

CANCELLATIONS = "dynamo_frontend_model_cancellation_total"
BY_REASON = "dynamo_frontend_cancelled_requests_total"
LATENCY = "dynamo_frontend_cancellation_latency_seconds"
REQUESTS = "dynamo_frontend_requests_total"
INFLIGHT = "dynamo_frontend_inflight_requests"
DURATION = "dynamo_frontend_request_duration_seconds"
TTFT = "dynamo_frontend_time_to_first_token_seconds"
ITL = "dynamo_frontend_inter_token_latency_seconds"
OUTPUT_TOKENS = "dynamo_frontend_output_tokens_total"
DISCONNECTED = "dynamo_frontend_disconnected_clients"

SUCCESS = {**ROUTE, "status": "success", "error_type": ""}
CANCELLED = {**ROUTE, "status": "error", "error_type": "cancelled"}

MONITORED_ENDPOINTS = [
    "completions",
    "chat_completions",
    "embeddings",
    "responses",
    "anthropic_messages",
]


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def metrics(registry: CollectorRegistry, clock: FakeClock) -> FrontendMetrics:
    return FrontendMetrics(registry, clock=clock)


def test_families_have_dynamo_names_types_and_labels(
    registry: CollectorRegistry, metrics: FrontendMetrics
) -> None:
    tracker = metrics.start_request(MODEL, "chat_completions", "stream")
    tracker.tokens(2)
    tracker.finish()
    scrape = Scrape.of(registry)
    assert scrape.types["dynamo_frontend_requests"] == "counter"
    assert scrape.types["dynamo_frontend_inflight_requests"] == "gauge"
    assert scrape.types["dynamo_frontend_request_duration_seconds"] == "histogram"
    assert scrape.types["dynamo_frontend_time_to_first_token_seconds"] == "histogram"
    assert scrape.types["dynamo_frontend_inter_token_latency_seconds"] == "histogram"
    assert scrape.types["dynamo_frontend_model_cancellation"] == "counter"
    # Dynamo's type for this one: a gauge that only goes up.
    assert scrape.types["dynamo_frontend_disconnected_clients"] == "gauge"
    assert scrape.series(CANCELLATIONS) == [ROUTE]
    assert scrape.series(REQUESTS) == [SUCCESS]
    assert scrape.series(INFLIGHT) == [{"model": MODEL}]


def test_a_thousand_successful_requests_count_no_cancellation(
    registry: CollectorRegistry, metrics: FrontendMetrics
) -> None:
    routes = list(itertools.product(MONITORED_ENDPOINTS, ["unary", "stream"]))
    for i in range(1000):
        endpoint, request_type = routes[i % len(routes)]
        with metrics.start_request(MODEL, endpoint, request_type) as tracker:  # type: ignore[arg-type]
            tracker.tokens()
    scrape = Scrape.of(registry)
    for endpoint, request_type in routes:
        labels = {"model": MODEL, "endpoint": endpoint, "request_type": request_type}
        assert scrape.value(CANCELLATIONS, **labels) == 0
        assert scrape.value(REQUESTS, **labels, status="success", error_type="") == 100
    assert scrape.series(BY_REASON) == []
    assert scrape.value(DISCONNECTED) == 0
    assert scrape.value(INFLIGHT, model=MODEL) == 0
    assert scrape.value(f"{DURATION}_count", model=MODEL) == 1000


@pytest.mark.parametrize("request_type", ["unary", "stream"])
@pytest.mark.parametrize("endpoint", MONITORED_ENDPOINTS)
def test_every_endpoint_counts_one_cancellation_per_cancelled_request(
    registry: CollectorRegistry, metrics: FrontendMetrics, endpoint: str, request_type: str
) -> None:
    tracker = metrics.start_request(MODEL, endpoint, request_type)  # type: ignore[arg-type]
    tracker.cancelled(CancelReason.CLIENT_DISCONNECT)
    tracker.cancelled(CancelReason.CLIENT_DISCONNECT)  # the second phase of Dynamo's monitor
    tracker.cancelled(CancelReason.STREAM_CLOSED)
    tracker.finish()
    tracker.finish("error")
    labels = {"model": MODEL, "endpoint": endpoint, "request_type": request_type}
    scrape = Scrape.of(registry)
    assert scrape.value(CANCELLATIONS, **labels) == 1
    assert scrape.value(REQUESTS, **labels, status="error", error_type="cancelled") == 1
    assert scrape.series(REQUESTS) == [{**labels, "status": "error", "error_type": "cancelled"}]
    assert scrape.value(DISCONNECTED) == 1


def test_cancellation_is_counted_when_noticed_not_at_the_end(
    registry: CollectorRegistry, metrics: FrontendMetrics
) -> None:
    tracker = metrics.start_request(MODEL, "chat_completions", "stream")
    tracker.cancelled(CancelReason.CLIENT_DISCONNECT)
    scrape = Scrape.of(registry)
    assert scrape.value(CANCELLATIONS, **ROUTE) == 1
    assert scrape.value(INFLIGHT, model=MODEL) == 1  # still draining
    tracker.finish()
    assert Scrape.of(registry).value(INFLIGHT, model=MODEL) == 0


def test_reasons_first_wins_and_only_disconnects_raise_disconnected_clients(
    registry: CollectorRegistry, metrics: FrontendMetrics
) -> None:
    deadline = metrics.start_request(MODEL, "chat_completions", "stream")
    deadline.cancelled(CancelReason.DEADLINE)
    deadline.cancelled(CancelReason.CLIENT_DISCONNECT)
    deadline.finish()
    assert deadline.cancel_reason == "deadline"
    scrape = Scrape.of(registry)
    assert scrape.series(BY_REASON) == [{**ROUTE, "reason": "deadline"}]
    assert scrape.value(DISCONNECTED) == 0


def test_finish_twice_counts_once(registry: CollectorRegistry, metrics: FrontendMetrics) -> None:
    tracker = metrics.start_request(MODEL, "chat_completions", "stream")
    tracker.finish()
    tracker.finish()
    tracker.finish("error", "internal")
    scrape = Scrape.of(registry)
    assert scrape.series(REQUESTS) == [SUCCESS]
    assert scrape.value(REQUESTS, **SUCCESS) == 1
    assert scrape.value(f"{DURATION}_count", model=MODEL) == 1
    assert scrape.value(INFLIGHT, model=MODEL) == 0


def test_cancelled_after_finish_is_ignored(
    registry: CollectorRegistry, metrics: FrontendMetrics
) -> None:
    tracker = metrics.start_request(MODEL, "chat_completions", "stream")
    tracker.finish()
    tracker.cancelled(CancelReason.CLIENT_DISCONNECT)
    scrape = Scrape.of(registry)
    assert scrape.value(CANCELLATIONS, **ROUTE) == 0
    assert scrape.value(DISCONNECTED) == 0


def test_errors_by_type(registry: CollectorRegistry, metrics: FrontendMetrics) -> None:
    metrics.start_request(MODEL, "chat_completions", "stream").finish("error")
    metrics.start_request(MODEL, "chat_completions", "stream").finish("error", "overload")
    metrics.start_request(MODEL, "chat_completions", "stream").finish("error", "overload")
    scrape = Scrape.of(registry)
    assert scrape.value(REQUESTS, **ROUTE, status="error", error_type="internal") == 1
    assert scrape.value(REQUESTS, **ROUTE, status="error", error_type="overload") == 2
    assert scrape.value(CANCELLATIONS, **ROUTE) == 0


def test_finishing_as_cancelled_counts_the_cancellation(
    registry: CollectorRegistry, metrics: FrontendMetrics
) -> None:
    metrics.start_request(MODEL, "chat_completions", "stream").finish("error", "cancelled")
    scrape = Scrape.of(registry)
    assert scrape.value(CANCELLATIONS, **ROUTE) == 1
    assert scrape.value(BY_REASON, **ROUTE, reason="unknown") == 1
    assert scrape.value(REQUESTS, **CANCELLED) == 1


def test_time_to_first_token_and_inter_token_latency(
    registry: CollectorRegistry, metrics: FrontendMetrics, clock: FakeClock
) -> None:
    tracker = metrics.start_request(MODEL, "chat_completions", "stream")
    clock.advance(0.5)
    tracker.tokens()
    clock.advance(0.4)
    tracker.tokens(4)
    tracker.first_token()  # already observed: no-op
    clock.advance(0.1)
    tracker.finish()
    tracker.tokens()  # after the end: ignored
    scrape = Scrape.of(registry)
    assert scrape.value(f"{TTFT}_count", model=MODEL) == 1
    assert scrape.value(f"{TTFT}_sum", model=MODEL) == pytest.approx(0.5)
    assert scrape.value(f"{ITL}_count", model=MODEL) == 4
    assert scrape.value(f"{ITL}_sum", model=MODEL) == pytest.approx(0.4)
    assert scrape.value(OUTPUT_TOKENS, model=MODEL) == 5
    assert scrape.value(f"{DURATION}_sum", model=MODEL) == pytest.approx(1.0)


def test_a_first_chunk_of_several_tokens(
    registry: CollectorRegistry, metrics: FrontendMetrics, clock: FakeClock
) -> None:
    tracker = metrics.start_request(MODEL, "completions", "unary")
    clock.advance(0.2)
    tracker.first_token()
    clock.advance(0.3)
    tracker.tokens(3)
    tracker.finish()
    scrape = Scrape.of(registry)
    assert scrape.value(f"{TTFT}_sum", model=MODEL) == pytest.approx(0.2)
    assert scrape.value(f"{ITL}_count", model=MODEL) == 3
    assert scrape.value(f"{ITL}_sum", model=MODEL) == pytest.approx(0.3)


def test_cancellation_latency_runs_from_noticing_to_the_end(
    registry: CollectorRegistry, metrics: FrontendMetrics, clock: FakeClock
) -> None:
    tracker = metrics.start_request(MODEL, "chat_completions", "stream")
    clock.advance(2.0)
    tracker.cancelled(CancelReason.CLIENT_DISCONNECT)
    clock.advance(0.004)
    tracker.finish()
    labels = {"model": MODEL, "reason": "client disconnect"}
    scrape = Scrape.of(registry)
    assert scrape.value(f"{LATENCY}_count", **labels) == 1
    assert scrape.value(f"{LATENCY}_sum", **labels) == pytest.approx(0.004)


def test_with_block_that_raises_is_an_internal_error(
    registry: CollectorRegistry, metrics: FrontendMetrics
) -> None:
    with pytest.raises(KeyError), metrics.start_request(MODEL, "chat_completions", "stream"):
        raise KeyError("boom")
    assert Scrape.of(registry).value(REQUESTS, **ROUTE, status="error", error_type="internal") == 1


async def test_with_block_cancelled_by_trio_is_a_cancellation(
    registry: CollectorRegistry, metrics: FrontendMetrics
) -> None:
    # quart-trio cancels a view whose client went away; the tracker must count it.
    with trio.CancelScope() as scope, metrics.start_request(MODEL, "chat_completions", "stream"):
        scope.cancel()
        await trio.sleep_forever()
    scrape = Scrape.of(registry)
    assert scrape.value(CANCELLATIONS, **ROUTE) == 1
    assert scrape.value(REQUESTS, **CANCELLED) == 1
    assert scrape.value(INFLIGHT, model=MODEL) == 0


def test_invalid_arguments_raise(metrics: FrontendMetrics) -> None:
    with pytest.raises(ValueError, match="endpoint"):
        metrics.start_request(MODEL, "chat", "stream")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="request type"):
        metrics.start_request(MODEL, "completions", "batch")  # type: ignore[arg-type]
    tracker = metrics.start_request(MODEL, "completions", "unary")
    with pytest.raises(ValueError, match="status"):
        tracker.finish("cancelled")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="success"):
        tracker.finish("success", "internal")
    assert not tracker.finished


def test_frontend_and_worker_share_a_registry(registry: CollectorRegistry) -> None:
    frontend = FrontendMetrics(registry)
    worker = WorkerMetrics(registry).endpoint("dynamo", "backend", "generate")
    request = frontend.start_request(MODEL, "completions", "unary")
    handler = worker.start_request()
    request.cancelled(CancelReason.CLIENT_DISCONNECT)
    handler.cancelled(CancelReason.CLIENT_DISCONNECT)
    handler.finish("killed")
    request.finish()
    scrape = Scrape.of(registry)
    assert (
        scrape.value(CANCELLATIONS, model=MODEL, endpoint="completions", request_type="unary") == 1
    )
    worker_labels = {
        "dynamo_namespace": "dynamo",
        "dynamo_component": "backend",
        "dynamo_endpoint": "generate",
    }
    assert scrape.value("dynamo_component_cancellation_total", **worker_labels) == 1


def test_two_registries_do_not_interfere() -> None:
    first, second = CollectorRegistry(), CollectorRegistry()
    FrontendMetrics(first).start_request(MODEL, "chat_completions", "stream").cancelled(
        CancelReason.CLIENT_DISCONNECT
    )
    FrontendMetrics(second).start_request(MODEL, "chat_completions", "stream").finish()
    assert Scrape.of(first).value(CANCELLATIONS, **ROUTE) == 1
    assert Scrape.of(second).value(CANCELLATIONS, **ROUTE) == 0
    assert Scrape.of(second).value(DISCONNECTED) == 0
