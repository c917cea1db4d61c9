"""The exported API and the exact metric contract (names, types, label sets) reaching Prometheus."""

from __future__ import annotations

import types

from prometheus_client import CollectorRegistry

import dynamo_trio.metrics
from dynamo_trio import CancelReason
from dynamo_trio.metrics import FrontendMetrics, WorkerMetrics

from ._exposition import Scrape

WORKER = ("dynamo_namespace", "dynamo_component", "dynamo_endpoint")
ROUTE = ("model", "endpoint", "request_type")

# Sample name -> (family type, label names).  Dynamo's own names first, then dynamo-trio's.
CONTRACT = {
    "dynamo_component_requests_total": ("counter", WORKER),
    "dynamo_component_inflight_requests": ("gauge", WORKER),
    "dynamo_component_request_duration_seconds_count": ("histogram", WORKER),
    "dynamo_component_errors_total": ("counter", (*WORKER, "error_type")),
    "dynamo_component_cancellation_total": ("counter", WORKER),
    "dynamo_frontend_requests_total": ("counter", (*ROUTE, "status", "error_type")),
    "dynamo_frontend_inflight_requests": ("gauge", ("model",)),
    "dynamo_frontend_request_duration_seconds_count": ("histogram", ("model",)),
    "dynamo_frontend_time_to_first_token_seconds_count": ("histogram", ("model",)),
    "dynamo_frontend_inter_token_latency_seconds_count": ("histogram", ("model",)),
    "dynamo_frontend_output_tokens_total": ("counter", ("model",)),
    "dynamo_frontend_model_cancellation_total": ("counter", ROUTE),
    "dynamo_frontend_disconnected_clients": ("gauge", ()),
    # dynamo-trio
    "dynamo_component_cancelled_requests_total": ("counter", (*WORKER, "reason")),
    "dynamo_component_cancellation_latency_seconds_count": ("histogram", (*WORKER, "reason")),
    "dynamo_component_cancelling_requests": ("gauge", WORKER),
    "dynamo_frontend_cancelled_requests_total": ("counter", (*ROUTE, "reason")),
    "dynamo_frontend_cancellation_latency_seconds_count": ("histogram", ("model", "reason")),
}


def _family(sample_name: str, scrape: Scrape) -> str:
    for suffix in ("_total", "_count", ""):
        if sample_name.endswith(suffix):
            base = sample_name.removesuffix(suffix) if suffix else sample_name
            if base in scrape.types:
                return base
    raise AssertionError(f"no family for {sample_name}")


def test_every_metric_has_its_exact_name_type_and_labels() -> None:
    registry = CollectorRegistry()
    handler = WorkerMetrics(registry).endpoint("dynamo", "backend", "generate").start_request()
    handler.cancelled(CancelReason.CLIENT_DISCONNECT)
    handler.finish("error")
    request = FrontendMetrics(registry).start_request("m", "chat_completions", "stream")
    request.tokens(2)
    request.cancelled(CancelReason.CLIENT_DISCONNECT)
    request.finish()

    scrape = Scrape.of(registry)
    emitted = {
        sample.name
        for sample in scrape.samples
        if not sample.name.endswith(("_created", "_bucket", "_sum"))
    }
    assert emitted == set(CONTRACT)
    for name, (kind, labels) in CONTRACT.items():
        assert scrape.types[_family(name, scrape)] == kind, name
        for label_set in scrape.series(name):
            assert tuple(sorted(label_set)) == tuple(sorted(labels)), name


def test_all_lists_exactly_the_public_names() -> None:
    public = {
        name
        for name, value in vars(dynamo_trio.metrics).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert sorted(dynamo_trio.metrics.__all__) == sorted(public)
