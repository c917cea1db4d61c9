"""dynamo-trio across machines, on one Linux box: each "machine" a network namespace.

Run as root: ``sudo python examples/multihost/run.py`` (needs ``ip``, ``iptables``
and Debian's ``etcd-server``).  It builds seven hosts behind a router,

    etcd1 etcd2 etcd3   a three-member etcd cluster
    fe1                 python -m dynamo_trio frontend
    w1 w2               python -m dynamo_trio mocker --model-name demo
    client              where the requests below come from

starts the processes, each bound to its own host's address and advertising it,
sends a few requests and one that hangs up, prints where each ran, and tears
everything down.  The namespace plumbing is the multi-host test bed's
(``tests/multihost/_netns.py`` and ``_etcd_cluster.py``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.multihost._etcd_cluster import EtcdCluster  # noqa: E402
from tests.multihost._netns import Network, in_netns  # noqa: E402

MODEL = "demo"
HOSTS = ["etcd1", "etcd2", "etcd3", "fe1", "w1", "w2", "client"]


def environment(network: Network, etcd: EtcdCluster, host: str) -> dict[str, str]:
    """What a process on ``host`` needs: discovery in etcd, its own address everywhere."""
    address = network.host(host).address
    env = {k: v for k, v in os.environ.items() if not k.startswith("DYN_")}
    env.update(
        DYN_DISCOVERY_BACKEND="etcd",
        ETCD_ENDPOINTS=",".join(etcd.endpoints),
        DYN_TCP_RPC_HOST=address,  # the request plane listens here...
        DYN_TCP_RPC_ADVERTISE_HOST=address,  # ...and tells discovery this address
        DYN_TCP_RPC_PORT="7000",
        DYN_HTTP_HOST=address,
        DYN_HTTP_PORT="8000",
        DYN_SYSTEM_HOST=address,
        DYN_SYSTEM_PORT="9100",
        DYN_LEASE_TTL_SECS="3",
        DYN_HEARTBEAT_INTERVAL_SECS="0.5",
        DYN_HEARTBEAT_TIMEOUT_SECS="2.5",
        PYTHONPATH=str(ROOT),
    )
    return env


def metric(http: httpx.Client, url: str, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples (matching ``labels``) at ``url``/metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for family in text_string_to_metric_families(http.get(f"{url}/metrics").text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def main() -> None:
    if os.geteuid() != 0:
        sys.exit("run as root: network namespaces need it")
    binary = shutil.which("etcd")
    if binary is None:
        sys.exit("no etcd on PATH (apt-get install etcd-server)")
    scratch = Path(tempfile.mkdtemp(prefix="dynamo-multihost-"))
    network = Network(HOSTS, tag="ex")
    network.build()
    etcd = EtcdCluster(binary, network, ["etcd1", "etcd2", "etcd3"], scratch / "etcd")
    processes: list[subprocess.Popen[bytes]] = []
    try:
        etcd.start()
        print(f"etcd cluster: {', '.join(etcd.endpoints)}")

        def start(host: str, *argv: str) -> None:
            with open(scratch / f"{host}.log", "ab") as log:
                processes.append(
                    subprocess.Popen(
                        network.exec_argv(host, [sys.executable, "-m", "dynamo_trio", *argv]),
                        env=environment(network, etcd, host),
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                    )
                )

        workers = {host: f"http://{network.host(host).address}:9100" for host in ("w1", "w2")}
        for host in workers:
            start(host, "mocker", "--model-name", MODEL, "--inter-token-latency-ms", "20")
        frontend = f"http://{network.host('fe1').address}:8000"
        start("fe1", "frontend")

        # From here on, this process is on the client host: every request crosses the router.
        with in_netns(network.host("client").namespace), httpx.Client(timeout=30) as http:
            for _ in range(300):  # up to 30 s
                try:
                    models = http.get(f"{frontend}/v1/models").json()["data"]
                    if {m["id"] for m in models} == {MODEL} and all(
                        http.get(f"{url}/health").status_code == 200 for url in workers.values()
                    ):
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)
            else:
                sys.exit(f"the frontend did not list {MODEL}; logs in {scratch}")
            print(f"frontend on fe1 at {frontend}; workers on {', '.join(workers)}\n")

            for n in range(4):
                before = {
                    h: metric(http, u, "dynamo_component_requests_total")
                    for h, u in workers.items()
                }
                reply = http.post(
                    f"{frontend}/v1/chat/completions",
                    json={
                        "model": MODEL,
                        "messages": [{"role": "user", "content": f"question {n}"}],
                        "max_tokens": 5,
                    },
                ).json()
                ran_on = [
                    h
                    for h, u in workers.items()
                    if metric(http, u, "dynamo_component_requests_total") > before[h]
                ]
                text = reply["choices"][0]["message"]["content"]
                print(f"request {n}: {text!r:40.40} ran on {', '.join(ran_on)}")

            # A hang-up: read three tokens of a long stream, then close the socket.
            body = json.dumps(
                {
                    "model": MODEL,
                    "messages": [{"role": "user", "content": "a long answer, please"}],
                    "max_tokens": 5000,
                    "stream": True,
                }
            ).encode()
            address = network.host("fe1").address
            sock = socket.create_connection((address, 8000))
            sock.sendall(
                f"POST /v1/chat/completions HTTP/1.1\r\nHost: {address}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                f"x-request-id: hang-up-demo\r\n\r\n".encode()
                + body
            )
            sock.settimeout(10)
            received = b""
            while received.count(b"data: ") < 3:
                chunk = sock.recv(65536)
                if not chunk:
                    sys.exit(f"the frontend closed the stream: {received!r}")
                received += chunk
            holder = next(
                h
                for h, u in workers.items()
                if any(r["id"] == "hang-up-demo" for r in http.get(f"{u}/debug/requests").json())
            )
            sock.close()
            hung_up = time.monotonic()
            name = "dynamo_component_cancelled_requests_total"
            deadline = hung_up + 10
            while metric(http, workers[holder], name, reason="client disconnect") < 1:
                if time.monotonic() > deadline:
                    sys.exit(f"{holder} did not count the hang-up; logs in {scratch}")
                time.sleep(0.005)
            print(
                f"\nhang-up at the client: the request on {holder} was killed "
                f"(reason 'client disconnect') within {(time.monotonic() - hung_up) * 1000:.0f} ms"
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
