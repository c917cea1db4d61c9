"""A three-member etcd cluster, one member per namespace host (Debian's ``etcd-server``).

Each member listens on its own host's address (client port 2379, peer port
2380) and keeps its data in its own directory, so a member can be killed and
restarted with its data, like a machine that crashed and came back, and the
whole cluster can be stopped and started again.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from typing import TYPE_CHECKING, Final

import httpx

from tests._memhttp import TLS

from ._netns import in_netns

if TYPE_CHECKING:
    from pathlib import Path

    from ._netns import Network

__all__ = ["EtcdCluster"]

_START_TIMEOUT: Final = 30.0
CLIENT_PORT: Final = 2379
PEER_PORT: Final = 2380


class EtcdCluster:
    """etcd members on ``hosts`` of ``network``.

    Args:
        binary: The etcd executable.
        network: Where the member hosts are.
        hosts: One member per host name.
        data_dir: Each member keeps its data and log under ``data_dir/<host>``.
    """

    def __init__(self, binary: str, network: Network, hosts: list[str], data_dir: Path) -> None:
        self.binary = binary
        self.network = network
        self.hosts = hosts
        self.data_dir = data_dir
        self._processes: dict[str, subprocess.Popen[bytes]] = {}
        self._initial_cluster = ",".join(
            f"{host}=http://{network.host(host).address}:{PEER_PORT}" for host in hosts
        )

    @property
    def endpoints(self) -> list[str]:
        return [self.url(host) for host in self.hosts]

    def url(self, host: str) -> str:
        return f"http://{self.network.host(host).address}:{CLIENT_PORT}"

    def start(self) -> None:
        """Start every member that is not running and wait until each is healthy."""
        for host in self.hosts:
            if host not in self._processes:
                self.start_member(host, wait=False)
        for host in self.hosts:
            self.wait_healthy(host)

    def start_member(self, host: str, *, wait: bool = True) -> None:
        """Start (or restart, with its data) the member on ``host``."""
        address = self.network.host(host).address
        member_dir = self.data_dir / host
        member_dir.mkdir(parents=True, exist_ok=True)
        new = not (member_dir / "data").exists()
        with open(member_dir / "etcd.log", "ab") as log:
            self._processes[host] = subprocess.Popen(
                self.network.exec_argv(
                    host,
                    [
                        self.binary,
                        f"--name={host}",
                        f"--data-dir={member_dir / 'data'}",
                        f"--listen-client-urls=http://{address}:{CLIENT_PORT}",
                        f"--advertise-client-urls=http://{address}:{CLIENT_PORT}",
                        f"--listen-peer-urls=http://{address}:{PEER_PORT}",
                        f"--initial-advertise-peer-urls=http://{address}:{PEER_PORT}",
                        f"--initial-cluster={self._initial_cluster}",
                        f"--initial-cluster-state={'new' if new else 'existing'}",
                        "--initial-cluster-token=dynamo-trio-multihost",
                        "--log-level=warn",
                    ],
                ),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        if wait:
            self.wait_healthy(host)

    def kill_member(self, host: str) -> None:
        """SIGKILL the member on ``host`` (its data stays)."""
        process = self._processes.pop(host, None)
        if process is not None:
            process.kill()
            process.wait(timeout=10)

    def running(self, host: str) -> bool:
        process = self._processes.get(host)
        return process is not None and process.poll() is None

    def wait_healthy(self, host: str, timeout: float = _START_TIMEOUT) -> None:
        """Wait until the member answers ``/health`` with ``true`` (it has a leader)."""
        url = f"{self.url(host)}/health"
        deadline = time.monotonic() + timeout
        # From inside the member's own host: its health, whatever the links do.
        with (
            in_netns(self.network.host(host).namespace),
            httpx.Client(verify=TLS, trust_env=False, timeout=1.0) as client,
        ):
            while time.monotonic() < deadline:
                process = self._processes.get(host)
                if process is None or process.poll() is not None:
                    break
                with contextlib.suppress(httpx.HTTPError, ValueError):
                    if client.get(url).json().get("health") == "true":
                        return
                time.sleep(0.1)
        log = (self.data_dir / host / "etcd.log").read_text(errors="replace")[-2000:]
        raise RuntimeError(f"etcd member {host} is not healthy at {url}; its log ends:\n{log}")

    def stop(self) -> None:
        """Kill every member (the fixture's teardown)."""
        for host in list(self._processes):
            self.kill_member(host)
