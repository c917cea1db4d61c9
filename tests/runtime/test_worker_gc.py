"""A ``@dynamo_worker()`` process tunes its garbage collector as the other serving
processes do (``DYN_GC_THRESHOLD``; :mod:`dynamo_trio._gc`), in a process of its own."""

from __future__ import annotations

import subprocess
import sys

import pytest

from dynamo_trio._gc import DEFAULT_GEN0_THRESHOLD

_WORKER = """
import gc, trio
from dynamo_trio.runtime import dynamo_worker

@dynamo_worker(handle_signals=False)
async def main(runtime):
    print(gc.get_threshold()[0], gc.get_freeze_count() > 0)

trio.run(main)
"""


def _run(*code: str, threshold: str | None = None) -> str:
    env = {"PATH": "/usr/bin:/bin", "DYN_DISCOVERY_BACKEND": "mem", "DYN_LOG": "warning"}
    if threshold is not None:
        env["DYN_GC_THRESHOLD"] = threshold
    done = subprocess.run(
        [sys.executable, "-c", *code], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("threshold", [None, "1234", "0"])
def test_a_worker_process_applies_the_setting_before_it_serves(threshold: str | None) -> None:
    got = _run(_WORKER, threshold=threshold).split()
    if threshold == "0":
        pythons_own = _run("import gc; print(gc.get_threshold()[0])").split()[0]
        assert got == [pythons_own, "False"]
    else:
        expected = DEFAULT_GEN0_THRESHOLD if threshold is None else int(threshold)
        assert got == [str(expected), "True"]
