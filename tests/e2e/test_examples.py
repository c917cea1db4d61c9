"""The examples run as their README says, each program its own process."""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING, Any

import pytest
import trio

from .conftest import ROOT

if TYPE_CHECKING:
    from collections.abc import Callable

    from .conftest import Proc

pytestmark = pytest.mark.slow

EXAMPLES = ROOT / "examples" / "cancellation"


async def wait_for_line(proc: Proc, text: str, within: float = 10.0) -> None:
    with trio.fail_after(within):
        while not any(text in line for line in proc.stdout_lines):
            if proc.stdout_closed:
                raise AssertionError(
                    f"{proc.name} ended without printing {text!r}:\n"
                    + "\n".join(proc.stdout_lines)
                    + proc.stderr.decode(errors="replace")[-2000:]
                )
            await proc._changed.wait()


async def run_client(spawn: Callable[..., Any], env: dict[str, str], *flags: str) -> Proc:
    client: Proc = await spawn(str(EXAMPLES / "client.py"), *flags, env=env, name="client")
    assert await client.wait_exit(within=10) == 0
    await wait_for_line(client, "Client: Stream ended")
    return client


async def test_cancellation_example_direct(spawn: Callable[..., Any], env: dict[str, str]) -> None:
    server = await spawn(str(EXAMPLES / "server.py"), env=env, name="server")
    await wait_for_line(server, "Server: serving")
    client = await run_client(spawn, env)
    await wait_for_line(client, "Client: Cancelling after 3 responses...")
    assert any(line.endswith("(stopped)") for line in client.stdout_lines)
    await wait_for_line(server, "Server: Cancelled at iteration")
    await wait_for_line(server, "(stop requested)")

    client = await run_client(spawn, env, "--kill")
    await wait_for_line(client, "Client: Stream ended after 3 responses (killed)")
    # Where the kill lands (its sleep, or its yield) and so the iteration it names depend
    # on the machine's timing; the reason is what the test is about.
    await wait_for_line(server, "(kill requested)")
    killed = [line for line in server.stdout_lines if "Server: Killed at iteration" in line]
    assert len(killed) == 1 and killed[0].endswith("(kill requested)"), killed

    server.signal(signal.SIGINT)
    assert await server.wait_exit() == 0


async def test_cancellation_example_through_the_middle(
    spawn: Callable[..., Any], env: dict[str, str]
) -> None:
    server = await spawn(str(EXAMPLES / "server.py"), env=env, name="server")
    await wait_for_line(server, "Server: serving")
    middle = await spawn(str(EXAMPLES / "middle_server.py"), env=env, name="middle")
    await wait_for_line(middle, "Middle server: serving")
    await run_client(spawn, env, "--middle")
    await wait_for_line(middle, "Middle server: Forwarding response 2")
    await wait_for_line(middle, "Middle server: backend stream ended (stopped)")
    await wait_for_line(server, "Server: Cancelled at iteration")
    for proc in (middle, server):
        proc.signal(signal.SIGTERM)
        assert await proc.wait_exit() == 0


async def test_context_tree_example(spawn: Callable[..., Any], env: dict[str, str]) -> None:
    example = await spawn(str(ROOT / "examples" / "context_tree.py"), env=env, name="tree")
    assert await example.wait_exit() == 0
    await wait_for_line(example, "tree 1: done: request stopped")
    await wait_for_line(example, "sub-2: cancelled mid-await")
    await wait_for_line(example, "tree 2: done: request killed (client disconnect)")
