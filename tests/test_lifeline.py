"""A child holding a lifeline lives while its supervisor's end is open, and hears the
end once it closes (as the kernel closes it when the supervisor dies, however)."""

from __future__ import annotations

import os
import subprocess
import sys

import trio

from dynamo_trio._lifeline import LIFELINE_ENV, lifeline, take_lifeline

CHILD = """
import sys, trio
from dynamo_trio._lifeline import parent_gone, take_lifeline
fd = take_lifeline()
print("holding" if fd is not None else "none", flush=True)
if fd is not None:
    trio.run(parent_gone, fd)
    print("gone", flush=True)
"""


async def read_line(stream: trio.abc.ReceiveStream) -> bytes:
    line = b""
    while not line.endswith(b"\n"):
        chunk = await stream.receive_some()
        if not chunk:
            break
        line += chunk
    return line


async def test_the_child_hears_its_supervisors_end_only_when_it_closes() -> None:
    with lifeline(os.environ) as options:
        process = await trio.lowlevel.open_process(
            [sys.executable, "-c", CHILD], stdout=subprocess.PIPE, **options
        )
        assert process.stdout is not None
        with trio.fail_after(30):
            assert await read_line(process.stdout) == b"holding\n"
        with trio.move_on_after(0.2):
            await process.wait()
        assert process.returncode is None  # still held
    with trio.fail_after(30):
        assert await process.wait() == 0
        assert await read_line(process.stdout) == b"gone\n"
        await process.stdout.aclose()


def test_no_lifeline_without_the_variable_or_with_one_that_is_not_a_pipe(monkeypatch) -> None:
    monkeypatch.delenv(LIFELINE_ENV, raising=False)
    assert take_lifeline() is None
    with open(os.devnull) as not_a_pipe:
        monkeypatch.setenv(LIFELINE_ENV, str(not_a_pipe.fileno()))
        assert take_lifeline() is None
    monkeypatch.setenv(LIFELINE_ENV, "junk")
    assert take_lifeline() is None
    assert LIFELINE_ENV not in os.environ  # taken, so its own children never see it
