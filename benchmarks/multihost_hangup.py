"""Hang-up -> worker-killed latency across hosts, with 0 ms and 5 ms of added link delay.

Run as root: ``python benchmarks/multihost_hangup.py [--hangups 20]``

Builds four network-namespace hosts behind a router (the multi-host test bed,
``tests/multihost/_netns.py``): ``etcd1`` (one etcd member), ``fe1`` (a frontend),
``w1`` (a mocker) and ``client``.  For each delay, every host's link delays
each packet by that much in each direction (an NFQUEUE delayer: the kernel
here has no netem), so one hop between two hosts adds twice the delay one
way.  A hang-up crosses two hops: client -> frontend (the FIN) and
frontend -> worker (the ``kill`` frame): with 5 ms per link, 20 ms of the
latency is the network's.

Each hang-up: stream a long chat completion from ``client``, read three
tokens, see the request in flight on the worker, close the socket, then poll
the worker's ``/debug/requests`` from inside its own host (a keep-alive
connection, about 1-3 ms a poll) until the request is gone.  Prints
p50/p90/max per delay; the poll interval bounds the resolution.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.multihost._etcd_cluster import EtcdCluster  # noqa: E402
from tests.multihost._netns import Network, in_netns  # noqa: E402

MODEL = "bench"


def start(
    network: Network, etcd: EtcdCluster, host: str, log: Path, *argv: str
) -> subprocess.Popen[bytes]:
    address = network.host(host).address
    env = {k: v for k, v in os.environ.items() if not k.startswith("DYN_")}
    env.update(
        DYN_DISCOVERY_BACKEND="etcd",
        ETCD_ENDPOINTS=",".join(etcd.endpoints),
        DYN_TCP_RPC_HOST=address,
        DYN_TCP_RPC_ADVERTISE_HOST=address,
        DYN_HTTP_HOST=address,
        DYN_HTTP_PORT="8000",
        DYN_SYSTEM_HOST=address,
        DYN_SYSTEM_PORT="9100",
        DYN_LOG="warning",
        PYTHONPATH=str(ROOT),
    )
    with open(log, "ab") as out:
        return subprocess.Popen(
            network.exec_argv(host, [sys.executable, "-m", "dynamo_trio", *argv]),
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )


def hang_up_once(network: Network, poll: httpx.Client, worker: str, serial: int) -> float:
    """One hang-up; seconds from closing the socket to the worker no longer running it."""
    request_id = f"bench-{serial}"
    body = json.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 5000,
            "stream": True,
        }
    ).encode()
    address = network.host("fe1").address
    with in_netns(network.host("client").namespace):
        sock = socket.create_connection((address, 8000), timeout=10)
    sock.sendall(
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {address}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        f"x-request-id: {request_id}\r\n\r\n".encode()
        + body
    )
    received = b""
    while received.count(b"data: ") < 3:
        chunk = sock.recv(65536)
        if not chunk:
            raise RuntimeError(f"the frontend ended the stream: {received!r}")
        received += chunk

    def running() -> bool:
        return any(r["id"] == request_id for r in poll.get(f"{worker}/debug/requests").json())

    deadline = time.monotonic() + 10
    while not running():
        if time.monotonic() > deadline:
            raise RuntimeError("the request never showed up on the worker")
    sock.close()
    hung_up = time.monotonic()
    while running():
        if time.monotonic() > hung_up + 10:
            raise RuntimeError("the worker did not kill the request within 10 s")
    return time.monotonic() - hung_up


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hangups", type=int, default=20, help="hang-ups per delay")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: network namespaces need it")
    binary = shutil.which("etcd")
    if binary is None:
        sys.exit("no etcd on PATH (apt-get install etcd-server)")
    scratch = Path(tempfile.mkdtemp(prefix="dynamo-bench-multihost-"))
    network = Network(["etcd1", "fe1", "w1", "client"], tag="bench")
    network.build()
    etcd = EtcdCluster(binary, network, ["etcd1"], scratch / "etcd")
    processes = []
    try:
        etcd.start()
        processes.append(
            start(
                network,
                etcd,
                "w1",
                scratch / "w1.log",
                "mocker",
                "--model-name",
                MODEL,
                "--inter-token-latency-ms",
                "10",
            )
        )
        processes.append(start(network, etcd, "fe1", scratch / "fe1.log", "frontend"))
        worker = f"http://{network.host('w1').address}:9100"
        frontend = f"http://{network.host('fe1').address}:8000"
        with in_netns(network.host("client").namespace), httpx.Client(trust_env=False) as http:
            for _ in range(300):
                try:
                    if MODEL in {m["id"] for m in http.get(f"{frontend}/v1/models").json()["data"]}:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)
            else:
                sys.exit(f"the frontend never listed {MODEL}; logs in {scratch}")
        print(f"hang-up -> worker no longer running the request, {args.hangups} hang-ups each")
        serial = 0
        for delay_ms in (0.0, 5.0):
            for host in ("fe1", "w1", "client"):
                network.set_faults(host, delay_ms=delay_ms)
            latencies = []
            # The poll connection is made inside the worker's host: no link delay on it.
            with in_netns(network.host("w1").namespace), httpx.Client(trust_env=False) as poll:
                for _ in range(args.hangups):
                    serial += 1
                    latencies.append(hang_up_once(network, poll, worker, serial))
            latencies.sort()
            p50 = statistics.median(latencies) * 1000
            p90 = latencies[int(0.9 * (len(latencies) - 1))] * 1000
            print(
                f"  {delay_ms:3.0f} ms per link ({4 * delay_ms:.0f} ms of it on the path): "
                f"p50 {p50:6.1f} ms  p90 {p90:6.1f} ms  max {latencies[-1] * 1000:6.1f} ms"
            )
    finally:
        for process in processes:
            process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
        etcd.stop()
        network.destroy()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
