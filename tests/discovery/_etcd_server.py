"""Start and stop a throwaway single-node etcd for the tests (blocking helpers)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from typing import TYPE_CHECKING, Final

import httpx

from tests._memhttp import TLS

if TYPE_CHECKING:
    from pathlib import Path

__all__ = ["EtcdServer", "etcd_binary", "free_port"]

_START_TIMEOUT: Final = 15.0


def etcd_binary() -> str | None:
    """The etcd executable on PATH, if any."""
    return shutil.which("etcd")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class EtcdServer:
    """One etcd process on loopback, with its data in ``data_dir``.

    Args:
        binary: The etcd executable.
        data_dir: Where etcd keeps its data (and its log, ``etcd.log``).
        client_port: The client port (0 picks a free one).
    """

    def __init__(self, binary: str, data_dir: Path, client_port: int = 0) -> None:
        self.binary = binary
        self.data_dir = data_dir
        self.client_port = client_port or free_port()
        self.peer_port = free_port()
        self.url = f"http://127.0.0.1:{self.client_port}"
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start etcd and wait until it answers ``/health``.

        Raises:
            RuntimeError: with the tail of etcd's log, if it does not come up.
        """
        self.data_dir.mkdir(parents=True, exist_ok=True)
        peer = f"http://127.0.0.1:{self.peer_port}"
        log_path = self.data_dir / "etcd.log"
        with open(log_path, "ab") as log:
            self._process = subprocess.Popen(
                [
                    self.binary,
                    "--name=default",
                    f"--data-dir={self.data_dir / 'data'}",
                    f"--listen-client-urls={self.url}",
                    f"--advertise-client-urls={self.url}",
                    f"--listen-peer-urls={peer}",
                    f"--initial-advertise-peer-urls={peer}",
                    f"--initial-cluster=default={peer}",
                    "--log-level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + _START_TIMEOUT
        with httpx.Client(verify=TLS, trust_env=False, timeout=1.0) as client:
            while time.monotonic() < deadline:
                if self._process.poll() is not None:
                    break
                try:
                    if client.get(f"{self.url}/health").json().get("health") == "true":
                        return
                except (httpx.HTTPError, ValueError):
                    pass
                time.sleep(0.05)
        self.stop()
        tail = log_path.read_text(errors="replace")[-2000:]
        raise RuntimeError(f"etcd did not start at {self.url}; its log ends with:\n{tail}")

    def stop(self) -> None:
        """Stop etcd (SIGTERM, then SIGKILL) and reap it."""
        process, self._process = self._process, None
        if process is None:
            return
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
