"""The worker's status server: ``/metrics``, ``/health``, ``/live``, ``/debug/requests``.

Dynamo's system status server (``lib/runtime/src/system_status_server.rs``),
on ``DYN_SYSTEM_HOST:DYN_SYSTEM_PORT``, served by hypercorn's trio worker with
a quart-trio app:

``GET /metrics``
    The registry in Prometheus text format, or OpenMetrics if the scraper's
    ``Accept`` header asks for it (``prometheus_client.exposition.choose_encoder``).
``GET /health``, ``GET /live``
    One handler, as in Dynamo: ``{"status": "ready"|"notready", "uptime":
    seconds, "endpoints": {name: "ready"|"notready"}}`` with 200 or 503.  A
    health callback that raises reads as not ready.
``GET /debug/requests``
    The in-flight request trees (:meth:`dynamo_trio.Context.snapshot`
    shaped: id, state, reason, age_s, attributes, children), oldest first.
    ``?min_age=5`` keeps the ones older than five seconds: the stuck ones.

Anything else is a 404.  The access log is off; hypercorn's own messages go to
the ``dynamo_trio.status`` logger.

Every response says ``Connection: close``.  With quart-trio on hypercorn's
trio worker (0.12 / 0.18) an idle keep-alive connection is never timed out:
hypercorn restarts its idle timer from inside the app's request nursery, which
quart-trio cancels as soon as the response is sent, so the timer dies at once.
Such a connection would then hold a graceful shutdown for the whole
:data:`_GRACEFUL_TIMEOUT`.  A scrape every few seconds gains nothing from
keep-alive, so the server simply does not offer it.

Stopping
--------

Pass ``shutdown_trigger`` (e.g. ``event.wait``) and let it return: hypercorn
then stops accepting, gives in-flight scrapes :data:`_GRACEFUL_TIMEOUT` seconds
and runs the app's lifespan shutdown.  Cancelling the server's scope instead
skips the lifespan shutdown (ecosystem notes 1.3); it is tolerated, not the
intended way.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, TypeAlias

import trio
from prometheus_client.exposition import choose_encoder

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from hypercorn.config import Config as HypercornConfig
    from prometheus_client import CollectorRegistry
    from quart import Response
    from quart_trio import QuartTrio

    from .._config import SystemConfig

__all__ = ["HealthCheck", "InflightListing", "StatusReport", "serve_status"]

_log = logging.getLogger("dynamo_trio.status")

_RESPONSE_TIMEOUT: Final = 10.0
"""Seconds to send one response; Prometheus's default scrape timeout is 10 s too."""
_BODY_TIMEOUT: Final = 5.0
_MAX_CONTENT_LENGTH: Final = 64 * 1024
"""Every route is a GET: nobody needs to send this server a body."""
_GRACEFUL_TIMEOUT: Final = 2.0
"""On shutdown, seconds an in-flight scrape may take before it is cut."""
_READ_TIMEOUT: Final = 30
"""A connection silent this long is dropped (every response is quick and closes anyway)."""
_JSON: Final = "application/json"


@dataclass(frozen=True, kw_only=True)
class StatusReport:
    """What ``/health`` and ``/live`` report, as returned by the health callback."""

    ready: bool
    """Overall readiness: 200 ``"ready"`` if true, 503 ``"notready"`` if not."""
    endpoints: Mapping[str, bool] = field(default_factory=dict)
    """Per served endpoint readiness, shown as ``"ready"``/``"notready"``."""

    @classmethod
    def from_endpoints(cls, endpoints: Mapping[str, bool]) -> StatusReport:
        """Ready iff at least one endpoint is served and every one is ready.

        Dynamo's ``DYN_SYSTEM_USE_ENDPOINT_HEALTH_STATUS`` rule: health is the
        AND of the endpoints' health.
        """
        return cls(ready=bool(endpoints) and all(endpoints.values()), endpoints=dict(endpoints))


HealthCheck: TypeAlias = Callable[[], StatusReport]
"""The ``health`` callback: quick, non-blocking, called in the trio thread per request."""
InflightListing: TypeAlias = Callable[[], Iterable[Mapping[str, Any]]]
"""The ``inflight`` callback: one ``Context.snapshot()`` tree per in-flight request."""


async def serve_status(
    config: SystemConfig,
    registry: CollectorRegistry,
    *,
    health: HealthCheck,
    inflight: InflightListing,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Serve the status routes on ``config.host:config.port`` until ``shutdown_trigger`` returns.

    Use with ``nursery.start``: it reports the bound URL (with the real port
    when ``config.port`` is 0) once the socket is listening.

    Args:
        config: Host and port; the server binds to ``config.host`` only.
        registry: The process's registry, exposed on ``/metrics``.
        health: Called on each ``/health`` or ``/live`` request; must be quick
            and must not block (it runs in the trio thread).
        inflight: Called on each ``/debug/requests``; returns one
            :meth:`~dynamo_trio.Context.snapshot` tree per in-flight request.
        task_status: Receives the bound URL, e.g. ``"http://127.0.0.1:39001"``.
        shutdown_trigger: Returns to begin a graceful shutdown.  Without it
            the server runs until its scope is cancelled.

    Raises:
        ValueError: If ``config.port`` is negative (the server is off).
        OSError: If the address cannot be bound.  It arrives inside the
            exception groups of hypercorn's nurseries (catch it with
            ``except* OSError``), and hypercorn 0.18 leaks the unbound socket.
    """
    if config.port < 0:
        raise ValueError("the status server is disabled (DYN_SYSTEM_PORT is -1)")
    # Imported here: quart and hypercorn cost ~0.3 s of start-up, paid only by
    # processes that turn the status server on.
    from hypercorn.trio import serve

    app = _build_app(registry, health, inflight, started_at=time.monotonic())
    await serve(
        app,
        _hypercorn_config(config),
        shutdown_trigger=shutdown_trigger,
        task_status=_FirstBind(task_status),
    )


class _FirstBind:
    """Hands hypercorn's list of bound URLs on as the one URL the caller waits for."""

    def __init__(self, task_status: trio.TaskStatus[str]) -> None:
        self._task_status = task_status

    def started(self, value: list[str] | None = None) -> None:
        if not value:
            raise RuntimeError("hypercorn reported no bound address")
        _log.info("status server listening on %s", value[0])
        self._task_status.started(value[0])


def _hypercorn_config(config: SystemConfig) -> HypercornConfig:
    from hypercorn.config import Config as HypercornConfig

    host = f"[{config.host}]" if ":" in config.host else config.host
    hc = HypercornConfig()
    hc.bind = [f"{host}:{config.port}"]
    hc.accesslog = None
    hc.errorlog = _log
    hc.graceful_timeout = _GRACEFUL_TIMEOUT
    hc.read_timeout = _READ_TIMEOUT
    return hc


def _build_app(
    registry: CollectorRegistry,
    health: HealthCheck,
    inflight: InflightListing,
    *,
    started_at: float,
) -> QuartTrio:
    from quart import request
    from quart_trio import QuartTrio

    app = QuartTrio("dynamo_trio.status")
    app.config.update(
        RESPONSE_TIMEOUT=_RESPONSE_TIMEOUT,
        BODY_TIMEOUT=_BODY_TIMEOUT,
        MAX_CONTENT_LENGTH=_MAX_CONTENT_LENGTH,
    )

    def json_response(payload: object, status: int = 200) -> Response:
        body = json.dumps(payload, default=str, separators=(",", ":"))
        return app.response_class(body, status=status, content_type=_JSON)

    async def metrics() -> Response:
        encode, content_type = choose_encoder(request.headers.get("Accept", ""))
        return app.response_class(encode(registry), content_type=content_type)

    async def status() -> Response:
        try:
            report = health()
        except Exception:
            _log.exception("health callback failed; reporting notready")
            report = StatusReport(ready=False)
        return json_response(
            {
                "status": _readiness(report.ready),
                "uptime": round(time.monotonic() - started_at, 3),
                "endpoints": {name: _readiness(ok) for name, ok in report.endpoints.items()},
            },
            200 if report.ready else 503,
        )

    async def debug_requests() -> Response:
        min_age = request.args.get("min_age", default=0.0, type=float) or 0.0
        trees = [tree for tree in inflight() if _age(tree) >= min_age]
        trees.sort(key=_age, reverse=True)
        return json_response(trees)

    async def close_connection(response: Response) -> Response:
        response.headers["Connection"] = "close"
        return response

    app.after_request(close_connection)
    app.add_url_rule("/metrics", "metrics", metrics, methods=["GET"])
    app.add_url_rule("/health", "health", status, methods=["GET"])
    app.add_url_rule("/live", "live", status, methods=["GET"])
    app.add_url_rule("/debug/requests", "debug_requests", debug_requests, methods=["GET"])
    return app


def _readiness(ok: bool) -> str:
    return "ready" if ok else "notready"


def _age(tree: Mapping[str, Any]) -> float:
    age = tree.get("age_s")
    return float(age) if isinstance(age, int | float) else 0.0
