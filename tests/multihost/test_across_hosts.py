"""Two frontends and three workers on five hosts, found through a 3-member etcd cluster.

Requests from either frontend reach the workers on every host; a client
hanging up at a frontend kills the work on the worker's host with reason
``client disconnect``; and every process's counters are exact.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import pytest
import trio

from ._bed import (
    MODEL,
    StreamResult,
    metric_sum,
    stream_chat,
    until,
)

if TYPE_CHECKING:
    from ._bed import Deployment, Frontend, Worker

pytestmark = [pytest.mark.slow, pytest.mark.multihost]

WORKER_HOSTS = ("w1", "w2", "w3")
FRONTEND_HOSTS = ("fe1", "fe2")


async def start_all(
    deploy: Deployment, *, frontends: tuple[str, ...] = FRONTEND_HOSTS, token_ms: float = 10.0
) -> tuple[list[Worker], list[Frontend]]:
    """Workers on every worker host (in parallel), then the frontends."""
    workers: dict[str, Worker] = {}

    async def one(host: str) -> None:
        workers[host] = await deploy.start_worker(host, token_ms=token_ms)

    async with trio.open_nursery() as nursery:
        for host in WORKER_HOSTS:
            nursery.start_soon(one, host)
    started = [await deploy.start_frontend(host) for host in frontends]
    return [workers[host] for host in WORKER_HOSTS], started


async def holder(workers: list[Worker], request_id: str) -> Worker:
    """The worker whose in-flight list holds ``request_id`` (waiting briefly for it)."""
    found: list[Worker] = []

    async def listed() -> bool:
        for worker in workers:
            if any(r["id"] == request_id for r in await worker.debug_requests()):
                found.append(worker)
                return True
        return False

    await until(listed, within=5, what=f"{request_id} in flight on a worker")
    return found[0]


async def test_either_frontend_reaches_every_host_and_hang_ups_cancel_remotely(
    deploy: Deployment,
) -> None:
    workers, frontends = await start_all(deploy)
    hang_ups = {worker.host: 0 for worker in workers}
    latencies: list[float] = []

    if True:
        # Complete requests: round-robin spreads each frontend's six over all three hosts.
        for frontend in frontends:
            before = [await w.requests() for w in workers]
            for n in range(6):
                result = await stream_chat(frontend, 5, request_id=f"{frontend.host}-complete-{n}")
                assert result.done and result.tokens == 5, result
            after = [await w.requests() for w in workers]
            assert [a - b for a, b in zip(after, before, strict=True)] == [2, 2, 2], (
                f"requests from {frontend.host} per worker host: {after} - {before}"
            )

        # Hang-ups: three long streams per frontend, each abandoned after 3 tokens.
        for frontend in frontends:
            for n in range(3):
                request_id = f"{frontend.host}-hangup-{n}"
                progress = StreamResult(hang_up=trio.Event())
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(
                        partial(
                            stream_chat,
                            frontend,
                            5000,
                            request_id=request_id,
                            hang_up_after=3,
                            result=progress,
                        )
                    )
                    await progress.streaming.wait()
                    worker = await holder(workers, request_id)
                    assert progress.hang_up is not None
                    progress.hang_up.set()
                cancelled_before = hang_ups[worker.host]
                hang_ups[worker.host] += 1
                assert progress.ended_at is not None and progress.tokens == 3

                async def counted(
                    worker: Worker = worker, expected: int = cancelled_before + 1
                ) -> bool:
                    return await worker.cancelled("client disconnect") >= expected

                latencies.append(
                    await until(counted, within=5, interval=0.01, what="worker-side cancellation")
                )

    # Every worker host got hang-ups; every counter is exact, on every process.
    assert all(hang_ups.values()), hang_ups
    for worker in workers:
        samples = await worker.metrics()
        expected = hang_ups[worker.host]
        assert metric_sum(samples, "dynamo_component_requests_total") == 4 + expected
        assert metric_sum(samples, "dynamo_component_cancellation_total") == expected
        assert (
            metric_sum(
                samples, "dynamo_component_cancelled_requests_total", reason="client disconnect"
            )
            == expected
        )
        assert metric_sum(samples, "dynamo_component_inflight_requests") == 0
        assert await worker.debug_requests() == []
    for frontend in frontends:
        samples = await frontend.metrics()
        assert (
            metric_sum(
                samples,
                "dynamo_frontend_model_cancellation_total",
                model=MODEL,
                endpoint="chat_completions",
                request_type="stream",
            )
            == 3
        )
        assert metric_sum(samples, "dynamo_frontend_inflight_requests") == 0
    print(f"hang-up -> worker counted, across hosts: max {max(latencies) * 1000:.0f} ms")
    assert all(w.alive for w in workers) and all(f.alive for f in frontends)
