"""A split: one frontend cannot reach one worker, though both still reach etcd.

Discovery keeps listing the worker (its lease is alive), so only the
frontend itself can keep it out of rotation.  It must route around it: once
it has found the worker unreachable, no request waits for a connection to it
again, and none fails; the other frontend keeps using the worker; and when
the split heals, the worker takes the first frontend's traffic again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import trio

from ._bed import until
from ._traffic import Traffic
from .test_across_hosts import start_all

if TYPE_CHECKING:
    from ._bed import Deployment

pytestmark = [pytest.mark.slow, pytest.mark.multihost]


async def test_frontend_routes_around_workers_it_cannot_reach(deploy: Deployment) -> None:
    workers, (split_frontend, other_frontend) = await start_all(deploy)
    timings = deploy.timings
    unreachable = workers[2]
    network = deploy.bed.network

    split_traffic = Traffic([split_frontend])
    other_traffic = Traffic([other_frontend])
    async with trio.open_nursery() as nursery:
        await nursery.start(split_traffic.run)
        async with trio.open_nursery() as other_nursery:
            await other_nursery.start(other_traffic.run)
            await trio.sleep(1.0)  # connections to every worker are open
            split_at = trio.current_time()
            served_before = await unreachable.requests()
            network.partition(split_frontend.host, unreachable.host)
            # Long enough for several rounds of whatever brings an instance back into rotation.
            await trio.sleep(timings.heartbeat_bound + 4 * timings.connect_timeout)
            other_traffic.stop()
        served_during_split = await unreachable.requests()
        # The other frontend kept using the worker all along.
        assert served_during_split > served_before + 10
        healed_at = trio.current_time()
        network.heal()

        async def back() -> bool:  # only the split frontend sends now
            return await unreachable.requests() > served_during_split

        returned = await until(back, within=30, what="traffic back after the split")
        split_traffic.stop()

    # Once the frontend knew (a heartbeat bound after the split), no request of its
    # waited for a connection to the unreachable worker.
    detected = split_at + timings.heartbeat_bound + 0.5
    # Nothing failed on either side of the split, but a stream sent to the unreachable
    # worker before the frontend could know (on the open connection, which looks healthy
    # until the heartbeat bound): it fails with a clear error; moving it elsewhere is
    # request migration's job (off by default).
    for sent in split_traffic.failures():
        assert sent.started < detected and sent.result.error, sent.result
        assert "heartbeat timeout" in sent.result.error, sent.result
    assert not other_traffic.failures(), [s.result for s in other_traffic.failures()]
    during = [s for s in split_traffic.finished() if detected <= s.started < healed_at]
    assert during, "no traffic during the split"
    slow = [round(s.latency, 2) for s in during if s.latency >= timings.connect_timeout / 2]
    print(
        f"split: {len(during)} requests through the split frontend after detection, "
        f"slowest {max(s.latency for s in during):.2f}s (slow: {slow}); "
        f"first request while undetected took {split_traffic.slowest(after=split_at):.2f}s; "
        f"traffic back {returned:.2f}s after healing"
    )
    assert not slow, f"requests waited for the unreachable worker: {slow}"
    assert all(w.alive for w in workers)
