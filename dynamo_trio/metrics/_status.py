"""The worker's status server (Dynamo's system status server): ``/metrics``, ``/health``,
``/live``, ``/debug/requests``, answered by the HTTP edge over a worker's callbacks.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Final, TypeAlias

import trio

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from prometheus_client import CollectorRegistry

    from .._config import SystemConfig

_log = logging.getLogger("dynamo_trio.status")

_GRACEFUL_TIMEOUT: Final = 2.0
"""On shutdown, seconds an in-flight scrape may take before it is cut."""
_READ_TIMEOUT: Final = 30
"""A connection silent this long is dropped."""


@dataclass(frozen=True, kw_only=True)
class StatusReport:
    """What ``/health`` and ``/live`` report, as returned by the health callback."""

    ready: bool
    """Overall readiness: 200 ``"ready"`` if true, 503 ``"notready"`` if not."""
    endpoints: Mapping[str, bool] = field(default_factory=dict)
    """Per served endpoint readiness, shown as ``"ready"``/``"notready"``."""

    @classmethod
    def from_endpoints(cls, endpoints: Mapping[str, bool]) -> StatusReport:
        """Ready iff some endpoint is served and all are ready (Dynamo's endpoint health rule)."""
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
    """Serve the status routes on ``config.host:config.port`` until ``shutdown_trigger`` returns
    (graceful) or it is cancelled (at once); ``nursery.start`` gets the bound URL.
    ValueError if ``config.port`` is negative."""
    if config.port < 0:
        raise ValueError("the status server is disabled (DYN_SYSTEM_PORT is -1)")
    # Imported here: hypercorn's start-up cost is paid only with the status server on.
    from hypercorn.config import Config as HypercornConfig

    from .._hostport import host_port
    from ..edge import Edge, listen_sockets, serve_http, status_routes

    started_at = time.monotonic()

    def report() -> tuple[int, dict[str, Any]]:
        try:
            status = health()
        except Exception:
            _log.exception("health callback failed; reporting notready")
            status = StatusReport(ready=False)
        return (200 if status.ready else 503), {
            "status": _readiness(status.ready),
            "uptime": round(time.monotonic() - started_at, 3),
            "endpoints": {name: _readiness(ok) for name, ok in status.endpoints.items()},
        }

    hc = HypercornConfig()
    hc.accesslog = None
    hc.errorlog = _log
    hc.graceful_timeout = _GRACEFUL_TIMEOUT
    hc.read_timeout = _READ_TIMEOUT
    sockets = listen_sockets([host_port(config.host, config.port)])
    edge = Edge(status_routes(health=report, metrics=registry, inflight=inflight))
    serve = partial(serve_http, edge, hc, shutdown_trigger or trio.sleep_forever, sockets=sockets)
    async with trio.open_nursery() as nursery:
        url = (await nursery.start(serve))[0]
        _log.info("status server listening on %s", url)
        task_status.started(url)


def _readiness(ok: bool) -> str:
    return "ready" if ok else "notready"
