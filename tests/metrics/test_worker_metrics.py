"""WorkerMetrics: Dynamo's worker families, and exactly one cancellation per cancelled request."""

from __future__ import annotations

import pytest
import trio
from prometheus_client import CollectorRegistry

from dynamo_trio import CancelReason
from dynamo_trio.metrics import EndpointMetrics, WorkerMetrics

from ._exposition import FakeClock, Scrape

EP = {"dynamo_namespace": "dynamo", "dynamo_component": "backend", "dynamo_endpoint": "generate"}

CANCELLATIONS = "dynamo_component_cancellation_total"
BY_REASON = "dynamo_component_cancelled_requests_total"
LATENCY = "dynamo_component_cancellation_latency_seconds"
CANCELLING = "dynamo_component_cancelling_requests"
REQUESTS = "dynamo_component_requests_total"
INFLIGHT = "dynamo_component_inflight_requests"
DURATION = "dynamo_component_request_duration_seconds"
ERRORS = "dynamo_component_errors_total"


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def generate(registry: CollectorRegistry, clock: FakeClock) -> EndpointMetrics:
    return WorkerMetrics(registry, clock=clock).endpoint("dynamo", "backend", "generate")


def test_families_have_dynamo_names_types_and_labels(
    registry: CollectorRegistry, generate: EndpointMetrics
) -> None:
    generate.start_request().finish("error")
    scrape = Scrape.of(registry)
    assert scrape.types["dynamo_component_requests"] == "counter"
    assert scrape.types["dynamo_component_inflight_requests"] == "gauge"
    assert scrape.types["dynamo_component_request_duration_seconds"] == "histogram"
    assert scrape.types["dynamo_component_errors"] == "counter"
    assert scrape.types["dynamo_component_cancellation"] == "counter"
    # Exactly Dynamo's three labels on the cancellation counter, nothing more.
    assert scrape.series(CANCELLATIONS) == [EP]
    assert scrape.series(ERRORS) == [{**EP, "error_type": "generate"}]


def test_endpoint_series_exist_at_zero_before_the_first_request(
    registry: CollectorRegistry, generate: EndpointMetrics
) -> None:
    scrape = Scrape.of(registry)
    assert scrape.value(CANCELLATIONS, **EP) == 0
    assert scrape.value(REQUESTS, **EP) == 0
    assert scrape.value(INFLIGHT, **EP) == 0


def test_endpoint_metrics_are_cached(registry: CollectorRegistry) -> None:
    metrics = WorkerMetrics(registry)
    first = metrics.endpoint("dynamo", "backend", "generate")
    assert metrics.endpoint("dynamo", "backend", "generate") is first
    assert metrics.endpoint("dynamo", "backend", "prefill") is not first
    assert first.labels == ("dynamo", "backend", "generate")


def test_a_thousand_completed_requests_count_no_cancellation(
    registry: CollectorRegistry, generate: EndpointMetrics
) -> None:
    for _ in range(1000):
        with generate.start_request() as tracker:
            tracker.finish("complete")
    scrape = Scrape.of(registry)
    assert scrape.value(CANCELLATIONS, **EP) == 0
    assert scrape.series(BY_REASON) == []
    assert scrape.value(REQUESTS, **EP) == 1000
    assert scrape.value(f"{DURATION}_count", **EP) == 1000
    assert scrape.value(INFLIGHT, **EP) == 0
    assert scrape.value(CANCELLING, **EP) == 0


def test_inflight_follows_requests_and_returns_to_zero(
    registry: CollectorRegistry, generate: EndpointMetrics
) -> None:
    trackers = [generate.start_request() for _ in range(5)]
    assert Scrape.of(registry).value(INFLIGHT, **EP) == 5
    for tracker in trackers:
        tracker.finish()
    assert Scrape.of(registry).value(INFLIGHT, **EP) == 0


def test_stop_then_kill_then_socket_close_count_once_with_the_first_reason(
    registry: CollectorRegistry, generate: EndpointMetrics
) -> None:
    tracker = generate.start_request()
    tracker.cancelled(CancelReason.STOP_REQUESTED)
    tracker.cancelled(CancelReason.KILL_REQUESTED)
    tracker.cancelled(CancelReason.TRANSPORT_LOST)
    assert tracker.cancel_reason == "stop requested"
    tracker.finish("killed")
    tracker.finish("killed")
    scrape = Scrape.of(registry)
    assert scrape.value(CANCELLATIONS, **EP) == 1
    assert scrape.series(BY_REASON) == [{**EP, "reason": "stop requested"}]
    assert scrape.value(BY_REASON, **EP, reason="stop requested") == 1
    assert scrape.value(f"{LATENCY}_count", **EP, reason="stop requested") == 1
    assert scrape.value(INFLIGHT, **EP) == 0
    assert scrape.value(CANCELLING, **EP) == 0


def test_finish_twice_counts_once(registry: CollectorRegistry, generate: EndpointMetrics) -> None:
    tracker = generate.start_request()
    tracker.finish("error", "deserialization")
    tracker.finish("error", "deserialization")
    tracker.finish("complete")
    assert tracker.finished
    scrape = Scrape.of(registry)
    assert scrape.value(ERRORS, **EP, error_type="deserialization") == 1
    assert scrape.value(f"{DURATION}_count", **EP) == 1
    assert scrape.value(INFLIGHT, **EP) == 0


def test_a_signal_after_the_end_is_ignored(
    registry: CollectorRegistry, generate: EndpointMetrics
) -> None:
    tracker = generate.start_request()
    tracker.finish("complete")
    tracker.cancelled(CancelReason.TRANSPORT_LOST)
    assert tracker.cancel_reason is None
    scrape = Scrape.of(registry)
    assert scrape.value(CANCELLATIONS, **EP) == 0
    assert scrape.value(CANCELLING, **EP) == 0


def test_a_late_signal_does_not_make_a_completed_request_cancelled(
    registry: CollectorRegistry, generate: EndpointMetrics
) -> None:
    # Dynamo 1.1.0's false positive: the signal races the end of a complete stream.
    tracker = generate.start_request()
    tracker.cancelled(CancelReason.STREAM_CLOSED)
    assert Scrape.of(registry).value(CANCELLING, **EP) == 1
    tracker.finish("complete")
    scrape = Scrape.of(registry)
    assert scrape.value(CANCELLATIONS, **EP) == 0
    assert scrape.series(BY_REASON) == []
    assert scrape.value(CANCELLING, **EP) == 0


@pytest.mark.parametrize("outcome", ["stopped", "killed"])
def test_work_cut_short_without_a_signal_is_still_counted(
    registry: CollectorRegistry, generate: EndpointMetrics, outcome: str
) -> None:
    generate.start_request().finish(outcome)  # type: ignore[arg-type]
    scrape = Scrape.of(registry)
    assert scrape.value(CANCELLATIONS, **EP) == 1
    assert scrape.value(BY_REASON, **EP, reason="unknown") == 1
    # No signal time, so no latency to observe.
    assert scrape.value(f"{LATENCY}_count", **EP, reason="unknown") == 0


def test_errors_by_type(registry: CollectorRegistry, generate: EndpointMetrics) -> None:
    for _ in range(3):
        generate.start_request().finish("error")
    generate.start_request().finish("error", "publish_response")
    scrape = Scrape.of(registry)
    assert scrape.value(ERRORS, **EP, error_type="generate") == 3
    assert scrape.value(ERRORS, **EP, error_type="publish_response") == 1
    assert scrape.value(CANCELLATIONS, **EP) == 0


def test_an_error_after_a_signal_counts_both(
    registry: CollectorRegistry, generate: EndpointMetrics
) -> None:
    tracker = generate.start_request()
    tracker.cancelled(CancelReason.DEADLINE)
    tracker.finish("error")
    scrape = Scrape.of(registry)
    assert scrape.value(ERRORS, **EP, error_type="generate") == 1
    assert scrape.value(CANCELLATIONS, **EP) == 1
    assert scrape.value(BY_REASON, **EP, reason="deadline") == 1


def test_reasons_are_separate_series_that_sum_to_the_dynamo_counter(
    registry: CollectorRegistry, generate: EndpointMetrics
) -> None:
    reasons = [CancelReason.CLIENT_DISCONNECT] * 3 + [CancelReason.DEADLINE] * 2
    for reason in reasons:
        tracker = generate.start_request()
        tracker.cancelled(reason)
        tracker.finish("killed")
    scrape = Scrape.of(registry)
    assert scrape.value(BY_REASON, **EP, reason="client disconnect") == 3
    assert scrape.value(BY_REASON, **EP, reason="deadline") == 2
    assert scrape.value(CANCELLATIONS, **EP) == 5


def test_cancellation_latency_runs_from_signal_to_end(
    registry: CollectorRegistry, generate: EndpointMetrics, clock: FakeClock
) -> None:
    tracker = generate.start_request()
    clock.advance(3.0)
    tracker.cancelled(CancelReason.KILL_REQUESTED)
    clock.advance(0.002)
    tracker.cancelled(CancelReason.TRANSPORT_LOST)  # ignored: does not restart the clock
    clock.advance(0.0005)
    tracker.finish("killed")
    scrape = Scrape.of(registry)
    labels = {**EP, "reason": "kill requested"}
    assert scrape.value(f"{LATENCY}_sum", **labels) == pytest.approx(0.0025)
    assert scrape.value(f"{LATENCY}_bucket", **labels, le="0.001") == 0
    assert scrape.value(f"{LATENCY}_bucket", **labels, le="0.0025") == 1
    assert scrape.value(f"{DURATION}_sum", **EP) == pytest.approx(3.0025)


def test_with_block_finishes_complete(
    registry: CollectorRegistry, generate: EndpointMetrics
) -> None:
    with generate.start_request():
        pass
    scrape = Scrape.of(registry)
    assert scrape.value(f"{DURATION}_count", **EP) == 1
    assert scrape.value(CANCELLATIONS, **EP) == 0


def test_with_block_after_a_signal_finishes_stopped(
    registry: CollectorRegistry, generate: EndpointMetrics
) -> None:
    with generate.start_request() as tracker:
        tracker.cancelled(CancelReason.STOP_REQUESTED)
    assert Scrape.of(registry).value(BY_REASON, **EP, reason="stop requested") == 1


def test_with_block_that_raises_finishes_error(
    registry: CollectorRegistry, generate: EndpointMetrics
) -> None:
    with pytest.raises(RuntimeError), generate.start_request():
        raise RuntimeError("engine failed")
    scrape = Scrape.of(registry)
    assert scrape.value(ERRORS, **EP, error_type="generate") == 1
    assert scrape.value(INFLIGHT, **EP) == 0


async def test_with_block_cancelled_by_trio_finishes_killed(
    registry: CollectorRegistry, generate: EndpointMetrics
) -> None:
    with trio.CancelScope() as scope, generate.start_request() as tracker:
        tracker.cancelled(CancelReason.CLIENT_DISCONNECT)
        scope.cancel()
        await trio.sleep_forever()
    scrape = Scrape.of(registry)
    assert scrape.value(BY_REASON, **EP, reason="client disconnect") == 1
    assert scrape.value(INFLIGHT, **EP) == 0


def test_explicit_finish_inside_the_block_wins(
    registry: CollectorRegistry, generate: EndpointMetrics
) -> None:
    def finish_then_raise() -> None:
        with generate.start_request() as tracker:
            tracker.finish("complete")
            raise RuntimeError("after the end")

    with pytest.raises(RuntimeError):
        finish_then_raise()
    scrape = Scrape.of(registry)
    assert scrape.series(ERRORS) == []
    assert scrape.value(f"{DURATION}_count", **EP) == 1


@pytest.mark.parametrize(
    ("outcome", "error_type"), [("done", None), ("complete", "generate"), ("killed", "x")]
)
def test_invalid_finish_raises_and_records_nothing(
    registry: CollectorRegistry, generate: EndpointMetrics, outcome: str, error_type: str | None
) -> None:
    tracker = generate.start_request()
    with pytest.raises(ValueError, match="outcome"):
        tracker.finish(outcome, error_type)  # type: ignore[arg-type]
    assert not tracker.finished
    assert Scrape.of(registry).value(INFLIGHT, **EP) == 1
    tracker.finish()
    assert Scrape.of(registry).value(INFLIGHT, **EP) == 0


def test_endpoints_are_counted_separately(registry: CollectorRegistry) -> None:
    metrics = WorkerMetrics(registry)
    prefill = metrics.endpoint("dynamo", "prefill", "generate")
    decode = metrics.endpoint("dynamo", "decode", "generate")
    tracker = prefill.start_request()
    tracker.cancelled(CancelReason.KILL_REQUESTED)
    tracker.finish("killed")
    decode.start_request().finish()
    scrape = Scrape.of(registry)
    prefill_labels = {**EP, "dynamo_component": "prefill"}
    decode_labels = {**EP, "dynamo_component": "decode"}
    assert scrape.value(CANCELLATIONS, **prefill_labels) == 1
    assert scrape.value(CANCELLATIONS, **decode_labels) == 0


def test_two_registries_do_not_interfere() -> None:
    first, second = CollectorRegistry(), CollectorRegistry()
    a = WorkerMetrics(first).endpoint("dynamo", "backend", "generate")
    b = WorkerMetrics(second).endpoint("dynamo", "backend", "generate")
    tracker = a.start_request()
    tracker.cancelled(CancelReason.CLIENT_DISCONNECT)
    tracker.finish("killed")
    b.start_request()
    assert Scrape.of(first).value(CANCELLATIONS, **EP) == 1
    assert Scrape.of(first).value(INFLIGHT, **EP) == 0
    assert Scrape.of(second).value(CANCELLATIONS, **EP) == 0
    assert Scrape.of(second).value(INFLIGHT, **EP) == 1


def test_one_registry_takes_one_worker_metrics() -> None:
    registry = CollectorRegistry()
    WorkerMetrics(registry)
    with pytest.raises(ValueError, match="Duplicated"):
        WorkerMetrics(registry)


async def test_signals_racing_the_end_from_threads_count_at_most_once(
    registry: CollectorRegistry, generate: EndpointMetrics
) -> None:
    trackers = [generate.start_request() for _ in range(200)]

    def signal_all(reason: CancelReason) -> None:
        for tracker in trackers:
            tracker.cancelled(reason)

    def finish_all() -> None:
        for tracker in trackers:
            tracker.finish("killed")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.to_thread.run_sync, signal_all, CancelReason.STOP_REQUESTED)
        nursery.start_soon(trio.to_thread.run_sync, signal_all, CancelReason.KILL_REQUESTED)
        nursery.start_soon(trio.to_thread.run_sync, finish_all)
        nursery.start_soon(trio.to_thread.run_sync, finish_all)
    scrape = Scrape.of(registry)
    assert scrape.value(CANCELLATIONS, **EP) == 200
    reasons = ("stop requested", "kill requested", "unknown")
    assert sum(scrape.value(BY_REASON, **EP, reason=r) or 0 for r in reasons) == 200
    assert scrape.value(INFLIGHT, **EP) == 0
    assert scrape.value(CANCELLING, **EP) == 0


# ---------------------------------------------------------------------------- worker_id, labels


def test_worker_id_and_extra_labels_label_every_series(registry: CollectorRegistry) -> None:
    metrics = WorkerMetrics(registry)
    served = metrics.endpoint(
        "dynamo", "backend", "generate", worker_id="1a2b", labels=[("model", "llama")]
    )
    plain = metrics.endpoint("dynamo", "prefill", "generate")
    assert (
        metrics.endpoint(
            "dynamo", "backend", "generate", worker_id="1a2b", labels=[("model", "llama")]
        )
        is served
    )
    assert (served.worker_id, served.extra_labels) == ("1a2b", {"model": "llama"})
    tracker = served.start_request()
    tracker.cancelled(CancelReason.CLIENT_DISCONNECT)
    tracker.finish("error", "generate")
    plain.start_request().finish()

    scrape = Scrape.of(registry)
    labels = {**EP, "worker_id": "1a2b", "model": "llama"}
    plain_labels = {**EP, "dynamo_component": "prefill"}
    # One family per name, whose series carry different label sets (as Dynamo's do).
    assert scrape.series(CANCELLATIONS) == [labels, plain_labels]
    assert scrape.value(CANCELLATIONS, **labels) == 1
    assert scrape.value(REQUESTS, **plain_labels) == 1
    assert scrape.value(ERRORS, **labels, error_type="generate") == 1
    assert scrape.value(BY_REASON, **labels, reason="client disconnect") == 1
    assert scrape.value(f"{LATENCY}_count", **labels, reason="client disconnect") == 1
    assert scrape.value(f"{DURATION}_count", **labels) == 1
    assert scrape.value(INFLIGHT, **labels) == 0 and scrape.value(CANCELLING, **labels) == 0
    assert scrape.text.count("# TYPE dynamo_component_cancellation_total counter") == 1


@pytest.mark.parametrize(
    "labels",
    [
        [("worker_id", "x")],
        [("dynamo_endpoint", "x")],
        [("error_type", "x")],
        [("le", "x")],
        [("a", "1"), ("a", "2")],
        [("a-b", "1")],
        [("__a", "1")],
        [("a", 1)],
        ["ab"],
    ],
)
def test_extra_labels_are_checked(registry: CollectorRegistry, labels: list[object]) -> None:
    with pytest.raises(ValueError, match="label"):
        WorkerMetrics(registry).endpoint("dynamo", "backend", "generate", labels=labels)  # type: ignore[arg-type]
