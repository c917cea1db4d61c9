"""A host cut off the network: a worker host, then a frontend host.

Two ways to cut a host: its link goes down (the router's end: no carrier, a
pulled cable), or every packet to and from it is dropped while the link
stays up (``tc netem loss 100%``).  Neither tells anyone's TCP stack: only
heartbeats and leases can find out.
"""

from __future__ import annotations

import json
from functools import partial
from typing import TYPE_CHECKING

import pytest
import trio

from ._bed import StreamResult, metric_sum, stream_chat, until
from ._traffic import Traffic
from .test_across_hosts import holder, start_all

if TYPE_CHECKING:
    from ._bed import Deployment, Frontend, Worker

pytestmark = [pytest.mark.slow, pytest.mark.multihost]

CUTS = ["link down", "all packets dropped"]

# The long streams only need to stay open; a token every 25 ms still fills a cut
# stream's flow-control window before the heartbeat bound.
TOKEN_MS = 25.0

# What the measurement itself adds to a bound: each poll scrapes every worker's
# /metrics across the bed's router (hundreds of ms on a loaded two-core machine).
MEASURING = 1.5


def cut(deploy: Deployment, host: str, how: str) -> None:
    if how == "link down":
        deploy.bed.network.link_down(host)
    else:
        deploy.bed.network.set_faults(host, blackhole=True)


def restore(deploy: Deployment, host: str, how: str) -> None:
    if how == "link down":
        deploy.bed.network.link_up(host)
    else:
        deploy.bed.network.set_faults(host)


async def open_streams(
    nursery: trio.Nursery, frontend: Frontend, workers: list[Worker], count: int, tag: str
) -> dict[str, tuple[StreamResult, Worker]]:
    """``count`` long streams through ``frontend``; each one's progress and its worker."""
    streams: dict[str, tuple[StreamResult, Worker]] = {}
    for n in range(count):
        request_id = f"{tag}-{n}"
        result = StreamResult()
        nursery.start_soon(
            partial(
                stream_chat, frontend, 5000, request_id=request_id, result=result, give_up_after=60
            )
        )
        with trio.fail_after(10):
            while result.tokens < 2:
                assert result.ended_at is None, result
                await trio.sleep(0.02)
        streams[request_id] = (result, await holder(workers, request_id))
    return streams


def instance_keys(deploy: Deployment, worker: Worker) -> list[str]:
    prefix = f"v1/instances/{deploy.namespace}/"
    keys = deploy.bed.etcd_keys(prefix)
    return [
        key
        for key, value in keys.items()
        if json.loads(value).get("address", "").startswith(f"{worker.address}:")
    ]


@pytest.mark.parametrize("how", CUTS)
async def test_worker_host_cut_off_and_back(deploy: Deployment, how: str) -> None:
    workers, (frontend,) = await start_all(deploy, frontends=("fe1",), token_ms=TOKEN_MS)
    target = workers[2]
    timings = deploy.timings
    figures: dict[str, float] = {}

    async with trio.open_nursery() as streams_nursery:
        streams = await open_streams(streams_nursery, frontend, workers, 6, f"cut-{how.split()[0]}")
        on_target = {rid for rid, (_, w) in streams.items() if w is target}
        assert on_target, "round-robin put no stream on the host to cut"
        traffic = Traffic([frontend])
        async with trio.open_nursery() as traffic_nursery:
            await traffic_nursery.start(traffic.run)
            await trio.sleep(0.5)
            cut_at = trio.current_time()
            cut(deploy, target.host, how)

            # Its in-flight streams fail, with an error the client can see, within the
            # heartbeat bound; the others keep streaming.
            async def target_streams_ended() -> bool:
                return all(streams[rid][0].ended_at is not None for rid in on_target)

            figures["streams failed"] = await until(
                target_streams_ended, within=timings.heartbeat_bound + 2, what="streams failed"
            )
            for rid in on_target:
                result = streams[rid][0]
                assert not result.done and result.error is not None, result

            # The worker's side: it lost the frontend's connection and killed the work.
            async def target_idle() -> bool:
                return await target.inflight() == 0

            figures["worker killed its streams"] = (
                await until(target_idle, within=timings.heartbeat_bound + 2, what="worker idle")
                + figures["streams failed"]
            )
            assert await target.cancelled("transport lost") == len(on_target)

            # Its lease expires: its registration leaves etcd.
            async def deregistered() -> bool:
                return not await trio.to_thread.run_sync(instance_keys, deploy, target)

            figures["lease expired"] = (
                trio.current_time()
                - cut_at
                + await until(deregistered, within=timings.lease_ttl + 10, what="lease expiry")
            )
            # Traffic keeps flowing around it for a while.
            await trio.sleep(1.0)
            requests_before = await target.requests()
            restored_at = trio.current_time()
            restore(deploy, target.host, how)

            # Back: it re-registers (same instance, no restart) and takes traffic again.
            async def registered() -> bool:
                return bool(await trio.to_thread.run_sync(instance_keys, deploy, target))

            figures["re-registered"] = await until(
                registered, within=timings.lease_ttl + 10, what="re-registration"
            )

            async def serving() -> bool:
                return await target.requests() > requests_before

            figures["takes traffic again"] = await until(
                serving, within=timings.lease_ttl + 15, what="traffic back"
            )
            traffic.stop()

        # The streams on the other hosts never noticed.
        for rid, (result, _) in streams.items():
            if rid not in on_target:
                assert result.ended_at is None and result.error is None, result
        streams_nursery.cancel_scope.cancel()

    keys = await trio.to_thread.run_sync(instance_keys, deploy, target)
    assert keys == [f"v1/instances/{deploy.namespace}/mocker/generate/{target.instance_id:x}"]
    assert target.alive and frontend.alive
    # No request was lost silently: every one completed (a live instance always remained),
    # but for one that was streaming from the cut host when it went: that one ended with
    # an error its client saw (moving it elsewhere is request migration, off by default).
    assert traffic.finished(), "no traffic"
    for failed in traffic.failures():
        assert failed.result.error is not None, failed.result
        assert failed.started <= cut_at + timings.heartbeat_bound, failed.result
        assert failed.result.tokens >= 1, failed.result  # it was streaming, not refused
    assert len(traffic.failures()) <= 1, [s.result for s in traffic.failures()]
    figures["slowest request during the cut"] = traffic.slowest(after=cut_at)
    figures["slowest request after the return"] = traffic.slowest(after=restored_at)
    print(f"worker host cut ({how}):", {k: round(v, 2) for k, v in figures.items()})
    assert figures["streams failed"] <= timings.heartbeat_bound + MEASURING
    # The frontend counted a cancellation for each stream the test itself hung up
    # (the survivors, at the end), none for the cut ones, and holds nothing.
    samples = await frontend.metrics()
    hung_up = len(streams) - len(on_target)
    assert metric_sum(samples, "dynamo_frontend_model_cancellation_total") == hung_up
    assert metric_sum(samples, "dynamo_frontend_inflight_requests") == 0


@pytest.mark.parametrize("how", CUTS)
async def test_frontend_host_cut_off(deploy: Deployment, how: str) -> None:
    workers, (frontend, other) = await start_all(deploy, token_ms=TOKEN_MS)
    timings = deploy.timings

    async with trio.open_nursery() as nursery:
        streams = await open_streams(nursery, frontend, workers, 6, f"fecut-{how.split()[0]}")
        survivors = await open_streams(nursery, other, workers, 3, f"fesurvive-{how.split()[0]}")
        assert {w.host for _, w in streams.values()} == {w.host for w in workers}
        before = {w.host: await w.cancelled("transport lost") for w in workers}
        cut(deploy, frontend.host, how)

        # Every worker kills the cut frontend's streams (transport lost) within the
        # heartbeat bound; its in-flight gauge comes down to the other frontend's streams.
        expected = {w.host: 0 for w in workers}
        for _, worker in streams.values():
            expected[worker.host] += 1
        still = {w.host: 0 for w in workers}
        for _, worker in survivors.values():
            still[worker.host] += 1

        async def killed() -> bool:
            for worker in workers:
                if await worker.inflight() != still[worker.host]:
                    return False
            return True

        elapsed = await until(killed, within=timings.heartbeat_bound + 3, what="streams killed")
        for worker in workers:
            assert (
                await worker.cancelled("transport lost") - before[worker.host]
                == expected[worker.host]
            )
        print(f"frontend host cut ({how}): workers killed its streams after {elapsed:.2f}s")
        assert elapsed <= timings.heartbeat_bound + MEASURING
        # The other frontend's streams are untouched.
        for result, _ in survivors.values():
            assert result.ended_at is None and result.error is None, result
        nursery.cancel_scope.cancel()

    restore(deploy, frontend.host, how)

    # Once back, the frontend serves again.
    async def answers() -> bool:
        result = await stream_chat(frontend, 3, request_id="fe-back", give_up_after=10)
        return result.done

    back = await until(answers, within=timings.lease_ttl + 10, what="frontend back")
    print(f"frontend host cut ({how}): serving again {back:.2f}s after its link came back")
    for worker in workers:
        status, text = await worker.bed.inside(worker.host, f"{worker.metrics_base}/health")
        assert status == 200, text
    assert all(w.alive for w in workers) and frontend.alive
