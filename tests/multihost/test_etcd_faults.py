"""etcd faults under load: one member killed, then the whole cluster restarted.

Throughout, requests keep flowing (the request plane does not need etcd),
no worker's registration is missing from etcd for longer than the lease TTL,
no instance appears twice, and after each fault the frontends still follow
discovery: a worker replaced after the fault (its old instance deregistered,
a new one registered) takes traffic from both, which they can only know
from watches that resumed where they left off.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pytest
import trio

from ._bed import stream_chat, until
from ._traffic import Traffic
from .test_across_hosts import start_all

if TYPE_CHECKING:
    from ._bed import Deployment, Frontend, Worker

pytestmark = [pytest.mark.slow, pytest.mark.multihost]

PAUSE = 0.2
"""Between one client's requests: a few a second per frontend, all through each fault."""


@dataclass
class Presence:
    """Polls etcd for the workers' instance keys and records how long each was missing.

    A gap runs from the first read that misses a key to the next read that
    finds it: reads that fail (no member answers) or are slow (a member
    without a leader holds a read until it times out) do not count as gaps.
    """

    deploy: Deployment
    expected: set[str] = field(default_factory=set)
    missing_since: dict[str, float] = field(default_factory=dict)
    longest_gap: dict[str, float] = field(default_factory=dict)
    unreadable: float = 0.0
    duplicates: list[list[str]] = field(default_factory=list)
    interval: float = 0.25
    """Between reads: a small part of a lease TTL."""

    def _key(self, worker: Worker) -> str:
        return f"v1/instances/{self.deploy.namespace}/mocker/generate/{worker.instance_id:x}"

    def expect(self, worker: Worker) -> None:
        self.expected.add(self._key(worker))
        self.longest_gap.setdefault(self._key(worker), 0.0)

    def forget(self, worker: Worker) -> None:
        self.expected.discard(self._key(worker))
        self.missing_since.pop(self._key(worker), None)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        prefix = f"v1/instances/{self.deploy.namespace}/"
        while True:
            asked = trio.current_time()
            try:
                keys = await trio.to_thread.run_sync(self.deploy.bed.etcd_keys, prefix)
            except AssertionError:  # no member answers: the whole cluster is down
                self.unreadable += trio.current_time() - asked
                await trio.sleep(self.interval)
                continue
            answered = trio.current_time()
            addresses = [json.loads(value)["address"] for value in keys.values()]
            if len(set(addresses)) != len(addresses):
                self.duplicates.append(sorted(keys))
            for key in self.expected:
                if key not in keys:
                    self.missing_since.setdefault(key, asked)
                elif key in self.missing_since:
                    gap = answered - self.missing_since.pop(key)
                    self.longest_gap[key] = max(self.longest_gap[key], gap)
            await trio.sleep(self.interval)

    def gaps(self) -> dict[str, float]:
        """The longest gap of each key (one still missing counts until now)."""
        now = trio.current_time()
        gaps = dict(self.longest_gap)
        for key, since in self.missing_since.items():
            gaps[key] = max(gaps[key], now - since)
        return gaps


async def replace_worker(deploy: Deployment, old: Worker, frontends: list[Frontend]) -> Worker:
    """Stop ``old`` gracefully, start a new worker on its host; return once every
    frontend sends it requests (so each has seen the departure and the arrival)."""
    assert await deploy.stop_worker(old) == 0, old.log_tail()
    new = await deploy.start_worker(old.host)
    for frontend in frontends:
        before = await new.requests()

        async def reaches(frontend: Frontend = frontend, before: float = before) -> bool:
            for n in range(3):
                result = await stream_chat(frontend, 3, request_id=f"probe-{n}", give_up_after=10)
                assert result.done, result
            return await new.requests() > before

        await until(reaches, within=15, what=f"{frontend.host} routes to the new worker")
    return new


async def test_etcd_member_killed_then_whole_cluster_restarted(deploy: Deployment) -> None:
    workers, frontends = await start_all(deploy)
    etcd = deploy.bed.etcd
    ttl = deploy.timings.lease_ttl
    presence = Presence(deploy)
    for worker in workers:
        presence.expect(worker)
    traffic = Traffic(frontends, pause=PAUSE)

    async with trio.open_nursery() as monitor:
        await monitor.start(presence.run)
        async with trio.open_nursery() as nursery:
            await nursery.start(traffic.run)
            # Every client starts on the first endpoint: kill that member.
            etcd.kill_member("etcd1")
            await trio.sleep(2 * ttl)
            traffic.stop()
        # Discovery still follows changes: a worker replaced now is seen by both frontends.
        presence.forget(workers[2])
        workers[2] = await replace_worker(deploy, workers[2], frontends)
        presence.expect(workers[2])
        await trio.to_thread.run_sync(etcd.start_member, "etcd1")

        # The whole cluster goes down (longer than a lease TTL) and comes back.
        traffic_2 = Traffic(frontends, pause=PAUSE)
        async with trio.open_nursery() as nursery:
            await nursery.start(traffic_2.run)
            for host in etcd.hosts:
                etcd.kill_member(host)
            await trio.sleep(2 * ttl)
            down_for = 2 * ttl
            await trio.to_thread.run_sync(etcd.start)
            await trio.sleep(ttl)
            traffic_2.stop()
        presence.forget(workers[1])
        workers[1] = await replace_worker(deploy, workers[1], frontends)
        presence.expect(workers[1])
        await trio.sleep(ttl)
        monitor.cancel_scope.cancel()

    # No request failed, though etcd was partly, then wholly, down.
    for sent in (traffic, traffic_2):
        assert sent.finished(), "no traffic"
        assert not sent.failures(), [s.result for s in sent.failures()]
    # No registration was missing for longer than a TTL (while etcd could be read).
    measured = presence.gaps()
    gaps = {key.rsplit("/", 1)[1]: round(gap, 2) for key, gap in measured.items()}
    print(
        f"etcd faults: longest registration gap per instance {gaps} "
        f"(cluster down {down_for:.0f}s, unreadable for {presence.unreadable:.1f}s); "
        f"{len(traffic.finished()) + len(traffic_2.finished())} requests, none failed"
    )
    assert all(gap <= ttl for gap in measured.values()), gaps
    assert not presence.duplicates, presence.duplicates
    # Exactly the live workers are registered, each once, with its models.
    keys = await trio.to_thread.run_sync(deploy.bed.etcd_keys, f"v1/instances/{deploy.namespace}/")
    assert sorted(keys) == sorted(
        f"v1/instances/{deploy.namespace}/mocker/generate/{w.instance_id:x}" for w in workers
    )
    cards = await trio.to_thread.run_sync(deploy.bed.etcd_keys, f"v1/models/{deploy.namespace}/")
    assert len(cards) == 2 * len(workers)
    assert all(w.alive for w in workers) and all(f.alive for f in frontends)


async def test_etcd_member_host_cut_off(deploy: Deployment) -> None:
    """The first member's host vanishes from the network (no reset, no FIN): every
    process's connections to it hang.  Leases must move to another member before
    they expire, and watches must leave the dead member (they never error)."""
    workers, frontends = await start_all(deploy)
    network = deploy.bed.network
    ttl = deploy.timings.lease_ttl
    presence = Presence(deploy)
    for worker in workers:
        presence.expect(worker)
    traffic = Traffic(frontends, pause=PAUSE)

    async with trio.open_nursery() as monitor:
        await monitor.start(presence.run)
        async with trio.open_nursery() as nursery:
            await nursery.start(traffic.run)
            network.link_down("etcd1")  # every client starts on the first endpoint
            await trio.sleep(2 * ttl)
            traffic.stop()
        # While it is still cut off, discovery follows changes: the frontends' watches
        # moved to a live member.
        presence.forget(workers[0])
        started = trio.current_time()
        workers[0] = await replace_worker(deploy, workers[0], frontends)
        followed = trio.current_time() - started
        presence.expect(workers[0])
        network.link_up("etcd1")
        await trio.sleep(ttl)
        monitor.cancel_scope.cancel()

    assert not traffic.failures(), [s.result for s in traffic.failures()]
    measured = presence.gaps()
    gaps = {key.rsplit("/", 1)[1]: round(gap, 2) for key, gap in measured.items()}
    print(
        f"etcd member host cut: longest registration gap per instance {gaps}; "
        f"a replaced worker took both frontends' traffic {followed:.2f}s after its predecessor "
        f"was stopped; {len(traffic.finished())} requests, none failed"
    )
    assert all(gap <= ttl for gap in measured.values()), gaps
    assert not presence.duplicates, presence.duplicates
    assert all(w.alive for w in workers) and all(f.alive for f in frontends)


async def test_first_requests_need_no_etcd(deploy: Deployment) -> None:
    """A frontend that has seen the models serves its very first request for them with
    etcd entirely down: the request plane does not need etcd, and neither does routing."""
    workers, frontends = await start_all(deploy)
    await trio.sleep(0.5)  # the frontends have opened their instance watches
    for host in deploy.bed.etcd.hosts:
        deploy.bed.etcd.kill_member(host)
    for frontend in frontends:
        for n in range(3):
            result = await stream_chat(frontend, 3, request_id=f"{frontend.host}-first-{n}")
            assert result.done and result.tokens == 3, result
    assert [await w.requests() for w in workers] == [2, 2, 2]
