"""Slow, lossy links (``tc netem delay 50ms loss 5%``) between the frontend and the workers.

Streams still complete, token for token; a hang-up still reaches the worker;
and heartbeats, leases and connections do not flap although packets are
late and some are lost (TCP retransmits them).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import pytest
import trio

from ._bed import StreamResult, metric_sum, stream_chat, until
from ._traffic import Traffic
from .test_across_hosts import WORKER_HOSTS, holder, start_all

if TYPE_CHECKING:
    from ._bed import Deployment, Worker

pytestmark = [pytest.mark.slow, pytest.mark.multihost]

DELAY_MS = 50.0
LOSS = 0.05
FLAPS = ("heartbeat timeout", "taken out of rotation", "expired", "re-granting", "lease lost")


async def test_slow_lossy_links(deploy: Deployment) -> None:
    workers, (frontend,) = await start_all(deploy, frontends=("fe1",))

    # The frontend's connection to every worker is set up before the links
    # degrade: what is checked below is that healthy connections, their
    # heartbeats and the leases do not flap.  (Setting up a new connection over
    # these links can take longer than the test bed's 2 s connect timeout when
    # two handshake packets in a row are lost; that instance is then taken out
    # of rotation, as it should be, which is not a flap.)
    async def every_worker_connected() -> bool:
        await stream_chat(frontend, 2, request_id="lossy-warm-up")
        return all([await w.requests() > 0 for w in workers])

    await until(every_worker_connected, within=20, interval=0, what="a connection to every worker")
    served_before = [await w.requests() for w in workers]
    for host in WORKER_HOSTS:
        deploy.bed.network.set_faults(host, delay_ms=DELAY_MS, loss=LOSS)

    # Streams complete, every token in place.
    results = [StreamResult() for _ in range(9)]
    async with trio.open_nursery() as nursery:
        for n, result in enumerate(results):
            nursery.start_soon(
                partial(stream_chat, frontend, 40, request_id=f"lossy-{n}", result=result)
            )
    for result in results:
        assert result.done and result.error is None and result.tokens == 40, result
    # Each served exactly once.
    served = zip(workers, served_before, strict=True)
    per_worker = [await w.requests() - before for w, before in served]
    assert sum(per_worker) == len(results), per_worker

    # Hang-ups still arrive: the worker counts each one, with its reason.
    latencies = []
    hang_ups: dict[str, int] = {w.host: 0 for w in workers}
    for n in range(3):
        request_id = f"lossy-hangup-{n}"
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
            worker: Worker = await holder(workers, request_id)
            assert progress.hang_up is not None
            progress.hang_up.set()
        hang_ups[worker.host] += 1

        async def counted(worker: Worker = worker, expected: int = hang_ups[worker.host]) -> bool:
            return await worker.cancelled("client disconnect") >= expected

        latencies.append(await until(counted, within=10, interval=0.01, what="cancellation"))

    # A while of steady traffic: nothing flaps.
    traffic = Traffic([frontend])
    async with trio.open_nursery() as nursery:
        await nursery.start(traffic.run)
        await trio.sleep(8)
        traffic.stop()
    assert not traffic.failures(), [s.result for s in traffic.failures()]

    for worker in workers:
        samples = await worker.metrics()
        assert metric_sum(samples, "dynamo_component_cancellation_total") == hang_ups[worker.host]
        assert metric_sum(samples, "dynamo_component_inflight_requests") == 0
    for member in deploy.members:
        log = member.log.read_text(errors="replace")
        flapped = [line for line in log.splitlines() if any(f in line for f in FLAPS)]
        assert not flapped, f"{member.proc.name} flapped:\n" + "\n".join(flapped[:10])
    print(
        f"lossy links ({DELAY_MS:.0f} ms, {LOSS:.0%} loss per worker link): "
        f"hang-up -> worker counted max {max(latencies) * 1000:.0f} ms; "
        f"{len(traffic.finished())} requests, slowest {traffic.slowest():.2f}s"
    )
