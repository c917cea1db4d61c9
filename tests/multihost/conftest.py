"""Fixtures for the multi-host tests: namespace hosts, a 3-member etcd cluster, processes.

The bed (network and etcd cluster) is built once for the package and torn
down after its last test.  Without root, ``ip``, ``iptables`` or an etcd
binary the tests are skipped, unless ``DYNAMO_REQUIRE_NETNS=1`` (set by CI),
which makes them fail with the reason.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest
import trio

from ..discovery._etcd_server import etcd_binary
from ._bed import Bed, Deployment, Timings
from ._etcd_cluster import EtcdCluster
from ._netns import Network, NetworkUnavailable, process_sits_in

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

HOSTS = ["etcd1", "etcd2", "etcd3", "fe1", "fe2", "w1", "w2", "w3", "client"]
ETCD_HOSTS = ["etcd1", "etcd2", "etcd3"]


def _unavailable(reason: str) -> None:
    if os.environ.get("DYNAMO_REQUIRE_NETNS") == "1":
        pytest.fail(f"DYNAMO_REQUIRE_NETNS=1 but the multi-host bed cannot run: {reason}")
    pytest.skip(f"multi-host bed unavailable: {reason}")


@pytest.fixture(scope="package")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bed]:
    """The hosts and the etcd cluster; the test process sits on the ``client`` host."""
    binary = etcd_binary()
    if binary is None:
        _unavailable("no etcd binary on PATH (apt-get install etcd-server)")
    assert binary is not None
    try:
        Network.check_available()
    except NetworkUnavailable as exc:
        _unavailable(str(exc))
    network = Network(HOSTS)
    scratch = tmp_path_factory.mktemp("multihost")
    try:
        network.build()
    except NetworkUnavailable as exc:
        _unavailable(str(exc))
    etcd = EtcdCluster(binary, network, ETCD_HOSTS, scratch / "etcd")
    try:
        etcd.start()
        with process_sits_in(network.host("client").namespace):
            yield Bed(network, etcd, scratch)
    finally:
        etcd.stop()
        network.destroy()


@pytest.fixture
async def deploy(bed: Bed, nursery: trio.Nursery) -> AsyncIterator[Deployment]:
    """Processes of this test's own, in a discovery namespace of their own.

    Afterwards every process is killed, the network healed and every etcd
    member running again, for the next test.
    """
    bed.runs += 1
    deployment = Deployment(bed, nursery, Timings(), f"mh{bed.runs}")
    try:
        yield deployment
    finally:
        await deployment.stop()
        print(deployment.logs())  # pytest shows it only if the test failed
        bed.network.heal()
        await trio.to_thread.run_sync(bed.etcd.start)
