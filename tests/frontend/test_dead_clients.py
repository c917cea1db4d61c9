"""Clients whose network goes silent are found out within ``DYN_HTTP_DEAD_CLIENT_SECS``.

The clients run in a private network namespace in which iptables rules drop
every packet to and from them once their requests are under way: no FIN, no
RST, exactly what a pulled cable or a vanished laptop looks like
(``_dead_client_driver.py``).  With the bound set, each is found out in about
that time (TCP keepalive while nothing is being sent: the long prefill;
``TCP_USER_TIMEOUT`` while data is unacknowledged: mid-stream) and its worker
handler killed with reason ``client disconnect``, counted once.  The control, a
frontend with the bound off, serves the same clients at the same time, and both are
watched for the same window, twice the bound: the bounded frontend has found out every
client in it, the control none, so the cut itself tells nothing.

Needs root (a network namespace, iptables): skipped where there is neither,
unless ``DYNAMO_REQUIRE_NETNS=1`` (CI), which makes that a failure.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import trio

pytestmark = pytest.mark.slow

DRIVER = Path(__file__).with_name("_dead_client_driver.py")
BOUND = 2.0
"""``DYN_HTTP_DEAD_CLIENT_SECS`` for the test: short, so the test is too."""


def _namespace_command() -> tuple[list[str] | None, str]:
    """How to run a command in a fresh network namespace with iptables here, or why not."""
    for tool in ("unshare", "ip", "iptables"):
        if shutil.which(tool) is None:
            return None, f"{tool} is not installed"
    # Its own network and process namespaces: when the driver ends, however it ends,
    # every process it started ends with it.
    command = ["unshare", "--net", "--pid", "--fork", "--kill-child"]
    probe = subprocess.run(
        [*command, "sh", "-c", "ip link set lo up && iptables -L INPUT -n"],
        capture_output=True,
        check=False,
    )
    if probe.returncode != 0:
        return None, f"cannot use a network namespace: {probe.stderr.decode(errors='replace')}"
    return command, ""


NAMESPACE, WHY_NOT = _namespace_command()


@pytest.fixture
def namespace() -> list[str]:
    if NAMESPACE is None:
        if os.environ.get("DYNAMO_REQUIRE_NETNS") == "1":
            pytest.fail(f"DYNAMO_REQUIRE_NETNS=1 but {WHY_NOT}")
        pytest.skip(WHY_NOT)
    return NAMESPACE


async def test_a_silent_client_is_found_out_and_its_work_killed(
    namespace: list[str], tmp_path: Path
) -> None:
    out = tmp_path / "result.json"
    env = {**os.environ, "DT_IN_NAMESPACE": "1"}
    with trio.fail_after(120):
        done = await trio.run_process(
            [*namespace, sys.executable, str(DRIVER), str(out), str(BOUND), str(2 * BOUND)],
            env=env,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-4000:]
    result = json.loads(out.read_text())
    print("dead clients:", json.dumps(result))

    bounded = result["bounded"]
    assert set(bounded) == {"unary prefill", "stream prefill", "mid-stream"}
    for name, outcome in bounded.items():
        assert (outcome["state"], outcome["reason"]) == ("KILLED", "client disconnect"), name
    assert result["bounded_cancellations"] == 3
    assert result["bounded_inflight"] == 0

    # Without the socket options, the same silent clients are still being served.
    assert result["control"] == {
        "unary prefill": {"detected_after": None},
        "mid-stream": {"detected_after": None},
    }
    assert result["control_cancellations"] == 0
    assert result["worker_cancellations"] == 3
