"""``examples/multihost/run.py`` runs as its README says (it builds namespaces of its own)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import trio

from ._bed import ROOT, Bed

pytestmark = [pytest.mark.slow, pytest.mark.multihost]


async def test_the_multihost_example_runs(bed: Bed) -> None:
    del bed  # only for its checks (root, ip, iptables, etcd): the example builds its own hosts
    result = await trio.run_process(
        [sys.executable, str(ROOT / "examples" / "multihost" / "run.py")],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
    )
    out = result.stdout.decode()
    assert result.returncode == 0, out + result.stderr.decode()[-3000:]
    ran_on = [line.rsplit(" ran on ", 1)[1] for line in out.splitlines() if " ran on " in line]
    assert len(ran_on) == 4 and set(ran_on) == {"w1", "w2"}, out
    assert "killed (reason 'client disconnect')" in out, out
