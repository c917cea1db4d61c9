"""Clients whose network goes silent are found out within ``DYN_HTTP_DEAD_CLIENT_SECS``.

The clients run in a private network namespace in which an nftables rule drops
every packet to and from them once their request is under way: no FIN, no
RST, exactly what a pulled cable or a vanished laptop looks like
(``_dead_client_driver.py``).  With the bound set, each is found out in about
that time (TCP keepalive while nothing is being sent: the long prefill;
``TCP_USER_TIMEOUT`` while data is unacknowledged: mid-stream) and its worker
handler killed with reason ``client disconnect``, counted once.  With it off,
the same client stays "connected" for as long as we care to wait: the test
can fail.

Needs a network namespace and nftables (root, or an unprivileged user
namespace): skipped where there is neither.
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
BOUND = 3.0
"""``DYN_HTTP_DEAD_CLIENT_SECS`` for the test: short, so the test is too."""


def _namespace_command() -> list[str] | None:
    """How to run a command in a fresh network namespace here, if we can."""
    if shutil.which("unshare") is None or shutil.which("nft") is None:
        return None
    for argv in (["unshare", "-n"], ["unshare", "-rn"]):
        probe = subprocess.run(
            [*argv, "sh", "-c", "ip link set lo up && nft list tables"],
            capture_output=True,
            check=False,
        )
        if probe.returncode == 0:
            return argv
    return None


NAMESPACE = _namespace_command()


async def _run_driver(tmp_path: Path, seconds: float, *control: str) -> dict[str, object]:
    assert NAMESPACE is not None
    out = tmp_path / f"result-{seconds}.json"
    env = {**os.environ, "DT_IN_NAMESPACE": "1"}
    with trio.fail_after(240):
        done = await trio.run_process(
            [*NAMESPACE, sys.executable, str(DRIVER), str(out), str(seconds), *control],
            env=env,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-4000:]
    result: dict[str, object] = json.loads(out.read_text())
    return result


@pytest.mark.skipif(NAMESPACE is None, reason="needs unshare -n and nftables")
async def test_a_silent_client_is_found_out_and_its_work_killed(tmp_path: Path) -> None:
    result = await _run_driver(tmp_path, BOUND)
    print("dead clients:", json.dumps(result))
    scenarios = result["scenarios"]
    assert isinstance(scenarios, dict)
    assert set(scenarios) == {"unary prefill", "stream prefill", "mid-stream"}
    for name, outcome in scenarios.items():
        assert (outcome["state"], outcome["reason"]) == ("KILLED", "client disconnect"), name
        # Keepalive probes start a third of the bound after the last packet, so
        # detection comes at about the bound; a second or two of scheduling slack.
        assert outcome["detected_after"] <= BOUND + 3, (name, outcome)
    assert result["frontend_cancellations"] == 3
    assert result["worker_cancellations"] == 3
    assert result["frontend_inflight"] == 0


@pytest.mark.skipif(NAMESPACE is None, reason="needs unshare -n and nftables")
async def test_without_the_bound_a_silent_client_is_never_found_out(tmp_path: Path) -> None:
    """The control: the cut is silent, so only the socket options find it."""
    result = await _run_driver(tmp_path, 0, str(3 * BOUND))
    scenarios = result["scenarios"]
    assert scenarios == {"unary prefill": {"detected_after": None}}, scenarios
