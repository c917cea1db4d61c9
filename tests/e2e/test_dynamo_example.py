"""Dynamo's cancellation demo, ported by changing imports, as three processes.

The programs are in ``dynamo_cancellation/`` (see its README for the exact
changes).  The server raises ``asyncio.CancelledError`` when it sees the stop,
which used to take the whole worker down; here it ends that one request, and
the same server then serves the next client, directly and through the middle.
The checks are those of Dynamo's own ``test_example.py``.
"""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING, Any

import pytest

from .conftest import ROOT, scrape as metric
from .test_examples import wait_for_line

if TYPE_CHECKING:
    from collections.abc import Callable

    from .conftest import Proc

pytestmark = pytest.mark.slow

DEMO = ROOT / "tests" / "e2e" / "dynamo_cancellation"


async def run_client(spawn: Callable[..., Any], env: dict[str, str], *flags: str) -> Proc:
    client: Proc = await spawn(str(DEMO / "client.py"), *flags, env=env, name="client")
    assert await client.wait_exit(within=15) == 0, client.stderr.decode(errors="replace")
    await wait_for_line(client, "Client: Cancelling after 3 responses...")
    await wait_for_line(client, "Client: Stream stopped")
    return client


async def test_dynamo_cancellation_demo_runs_as_written(
    spawn: Callable[..., Any], env: dict[str, str]
) -> None:
    server = await spawn(str(DEMO / "server.py"), env=env, name="server")
    await wait_for_line(server, "Demo server started")
    middle = await spawn(str(DEMO / "middle_server.py"), env=env, name="middle")
    await wait_for_line(middle, "Middle server started")

    # Direct, twice: the first CancelledError must not have taken the server down.
    for run in (1, 2):
        await run_client(spawn, env)
        with_cancel = [line for line in server.stdout_lines if "Cancelled at iteration" in line]
        await wait_for_line(server, "Server: Cancelled at iteration")
        assert len(with_cancel) <= run

    await run_client(spawn, env, "--middle")
    await wait_for_line(middle, "Middle server: Forwarding response 2")
    await wait_for_line(middle, "Middle server: Backend stream ended")
    cancels = [line for line in server.stdout_lines if "Server: Cancelled at iteration" in line]
    assert len(cancels) == 3
    assert server.process.returncode is None and middle.process.returncode is None
    assert "Traceback" not in server.stderr.decode(errors="replace")

    for proc in (middle, server):
        proc.signal(signal.SIGTERM)
        assert await proc.wait_exit() == 0


async def test_the_demo_server_counts_each_stop_once(
    spawn: Callable[..., Any], env: dict[str, str]
) -> None:
    server = await spawn(str(DEMO / "server.py"), env=env, name="server")
    await wait_for_line(server, "Demo server started")
    for _ in range(3):
        await run_client(spawn, env)
    status = await _status_url(server)
    assert await metric(status, "dynamo_component_cancellation_total") == 3
    assert await metric(status, "dynamo_component_errors_total") == 0
    assert await metric(status, "dynamo_component_inflight_requests") == 0


async def _status_url(server: Proc) -> str:
    # The status server logs its address (DYN_SYSTEM_PORT=0 picks a free port).
    await wait_for_line_in_stderr(server, "status server listening on")
    line = next(
        line
        for line in server.stderr.decode(errors="replace").splitlines()
        if "status server listening on" in line
    )
    return line.rsplit(" ", 1)[1]


async def wait_for_line_in_stderr(proc: Proc, text: str) -> None:
    import trio

    with trio.fail_after(10):
        while text not in proc.stderr.decode(errors="replace"):  # noqa: ASYNC110 - a pipe
            await trio.sleep(0.02)
