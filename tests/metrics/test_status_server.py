"""The worker status server, through real HTTP on port 0."""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import trio
from prometheus_client import CollectorRegistry

from dynamo_trio import CancelReason, Context, SystemConfig
from dynamo_trio.metrics import StatusReport, WorkerMetrics, serve_status
from tests._memhttp import TLS, http_client

from ._exposition import Scrape

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

EP = {"dynamo_namespace": "dynamo", "dynamo_component": "backend", "dynamo_endpoint": "generate"}


@dataclass
class Worker:
    """What the status server reports on: a registry, health and in-flight requests."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    report: StatusReport = field(default_factory=lambda: StatusReport.from_endpoints({}))
    requests: list[dict[str, Any]] = field(default_factory=list)
    health_calls: int = 0
    health_fails: bool = False

    def health(self) -> StatusReport:
        self.health_calls += 1
        if self.health_fails:
            raise RuntimeError("engine gone")
        return self.report

    def inflight(self) -> list[dict[str, Any]]:
        return self.requests


@asynccontextmanager
async def running(worker: Worker, config: SystemConfig | None = None) -> AsyncIterator[str]:
    """Serve ``worker`` on a free port; on exit, shut down through the trigger and wait."""
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        url: str = await nursery.start(
            partial(
                serve_status,
                config or SystemConfig(port=0),
                worker.registry,
                health=worker.health,
                inflight=worker.inflight,
                shutdown_trigger=shutdown.wait,
            )
        )
        try:
            yield url
        finally:
            shutdown.set()


@pytest.fixture
def worker() -> Worker:
    return Worker()


@pytest.fixture
async def client(worker: Worker) -> AsyncIterator[httpx.AsyncClient]:
    async with running(worker) as url, http_client(url) as client:
        yield client


async def test_reports_the_bound_url_with_the_real_port(worker: Worker) -> None:
    async with running(worker) as url:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        assert host == "127.0.0.1"
        assert int(port) > 0


async def test_metrics_serves_the_registry_as_prometheus_text(
    worker: Worker, client: httpx.AsyncClient
) -> None:
    generate = WorkerMetrics(worker.registry).endpoint("dynamo", "backend", "generate")
    tracker = generate.start_request()
    tracker.cancelled(CancelReason.CLIENT_DISCONNECT)
    tracker.finish("killed")
    generate.start_request().finish()

    response = await client.get("/metrics")

    assert response.status_code == 200
    assert response.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    scrape = Scrape(response.text)
    assert scrape.value("dynamo_component_cancellation_total", **EP) == 1
    assert scrape.value("dynamo_component_requests_total", **EP) == 2


async def test_metrics_speaks_openmetrics_when_asked(
    worker: Worker, client: httpx.AsyncClient
) -> None:
    WorkerMetrics(worker.registry).endpoint("dynamo", "backend", "generate")
    accept = "application/openmetrics-text; version=1.0.0, text/plain; version=0.0.4; q=0.5"

    response = await client.get("/metrics", headers={"Accept": accept})

    assert response.headers["content-type"].startswith("application/openmetrics-text")
    assert response.text.endswith("# EOF\n")
    assert "dynamo_component_cancellation_total{" in response.text


@pytest.mark.parametrize("path", ["/health", "/live"])
async def test_ready_is_200(worker: Worker, client: httpx.AsyncClient, path: str) -> None:
    worker.report = StatusReport.from_endpoints({"generate": True, "prefill": True})

    response = await client.get(path)

    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert body["status"] == "ready"
    assert body["endpoints"] == {"generate": "ready", "prefill": "ready"}
    assert isinstance(body["uptime"], float)
    assert body["uptime"] >= 0


@pytest.mark.parametrize("path", ["/health", "/live"])
async def test_not_ready_is_503(worker: Worker, client: httpx.AsyncClient, path: str) -> None:
    worker.report = StatusReport.from_endpoints({"generate": True, "prefill": False})

    response = await client.get(path)

    assert response.status_code == 503
    assert response.json()["status"] == "notready"
    assert response.json()["endpoints"] == {"generate": "ready", "prefill": "notready"}


async def test_health_is_asked_on_every_request(worker: Worker, client: httpx.AsyncClient) -> None:
    assert (await client.get("/health")).status_code == 503  # no endpoint served yet
    worker.report = StatusReport(ready=True)
    assert (await client.get("/health")).status_code == 200
    assert worker.health_calls == 2


async def test_a_failing_health_callback_reads_as_not_ready(
    worker: Worker, client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    worker.report = StatusReport(ready=True)
    worker.health_fails = True

    response = await client.get("/health")

    assert response.status_code == 503
    assert response.json()["status"] == "notready"
    assert "health callback failed" in caplog.text


async def test_debug_requests_lists_context_trees(
    worker: Worker, client: httpx.AsyncClient
) -> None:
    request = Context("req-1")
    request.attributes["endpoint"] = "dynamo/backend/generate"
    child = Context("req-1")
    request.link_child(child)
    child.stop(CancelReason.CLIENT_DISCONNECT)
    worker.requests = [request.snapshot()]

    response = await client.get("/debug/requests")

    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    [tree] = response.json()
    assert tree["id"] == "req-1"
    assert tree["state"] == "live"
    assert tree["attributes"] == {"endpoint": "dynamo/backend/generate"}
    assert isinstance(tree["age_s"], float)
    [sub] = tree["children"]
    assert (sub["state"], sub["reason"], sub["children"]) == ("stopped", "client disconnect", [])


async def test_debug_requests_lists_oldest_first_and_filters_by_age(
    worker: Worker, client: httpx.AsyncClient
) -> None:
    ages = {"a": 1.0, "b": 30.0, "c": 7.5}
    worker.requests = [{"id": name, "age_s": age} for name, age in ages.items()]

    every = (await client.get("/debug/requests")).json()
    stuck = (await client.get("/debug/requests", params={"min_age": "5"})).json()

    assert [tree["id"] for tree in every] == ["b", "c", "a"]
    assert [tree["id"] for tree in stuck] == ["b", "c"]


async def test_debug_requests_with_nothing_in_flight(client: httpx.AsyncClient) -> None:
    response = await client.get("/debug/requests")
    assert response.json() == []


async def test_unknown_paths_are_404_and_writes_are_405(client: httpx.AsyncClient) -> None:
    assert (await client.get("/")).status_code == 404
    assert (await client.get("/v1/models")).status_code == 404
    assert (await client.post("/metrics")).status_code == 405


async def test_access_log_is_silent(
    worker: Worker, client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    worker.report = StatusReport(ready=True)
    await client.get("/health")
    await client.get("/metrics")
    server_records = [r for r in caplog.records if not r.name.startswith(("httpx", "httpcore"))]
    assert not [record for record in server_records if "GET" in record.getMessage()]
    assert not [record for record in server_records if record.name == "hypercorn.access"]


async def test_shutdown_trigger_stops_the_server_promptly(
    worker: Worker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A shutdown grace longer than the hang guard: a server that stops within the guard
    # did not wait for the idle connection until the grace closed it.
    monkeypatch.setattr("dynamo_trio.metrics._status._GRACEFUL_TIMEOUT", 120.0)
    shutdown = trio.Event()
    async with httpx.AsyncClient(verify=TLS) as client:
        with trio.fail_after(60):  # a hang guard only
            async with trio.open_nursery() as nursery:
                url: str = await nursery.start(
                    partial(
                        serve_status,
                        SystemConfig(port=0),
                        worker.registry,
                        health=worker.health,
                        inflight=worker.inflight,
                        shutdown_trigger=shutdown.wait,
                    )
                )
                # The connection is kept alive, idle: it must not hold the shutdown up.
                response = await client.get(f"{url}/live")
                assert response.headers.get("connection") != "close"
                assert (await client.get(f"{url}/live")).status_code == 503  # reused
                shutdown.set()
        with pytest.raises(httpx.ConnectError):
            await client.get(f"{url}/live")


async def test_cancelling_instead_of_triggering_still_exits_cleanly(worker: Worker) -> None:
    with trio.fail_after(60):  # a hang guard only
        async with trio.open_nursery() as nursery:
            await nursery.start(
                partial(
                    serve_status,
                    SystemConfig(port=0),
                    worker.registry,
                    health=worker.health,
                    inflight=worker.inflight,
                )
            )
            nursery.cancel_scope.cancel()


async def test_a_disabled_port_is_refused(worker: Worker) -> None:
    with pytest.raises(ValueError, match="disabled"):
        await serve_status(
            SystemConfig(port=-1), worker.registry, health=worker.health, inflight=worker.inflight
        )
