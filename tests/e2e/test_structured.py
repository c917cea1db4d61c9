"""Structured cancellation across real processes: each of its rules, checked as a user would.

1. A handler raising ``asyncio.CancelledError`` after a stop (the seed's own
   handler), or ``GeneratorExit``, took its whole worker down.  Now it ends its
   request only: other streams on the worker flow on, it stays in discovery.
2. An enclosing trio timeout around ``parent.scope()`` left ``parent`` live and
   the remote handler running until the garbage collector dropped the stream.
3. Leaving ``parent.scope()`` normally did not end the remote work linked in it.
4. Through a middle hop, both reach the end of the chain.

The backend and the middle worker are processes the module's tests share (none
signals them): each test counts what it adds to their counters, and starts once
nothing is in flight on them.  Each test's callers are its own processes.

Dynamo's own cancellation demo, ported, is ``test_dynamo_example.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import trio

from dynamo_trio import Context, EngineShutdown
from dynamo_trio.discovery._file_store import FileLayout
from dynamo_trio.runtime import DistributedRuntime
from tests._procs import SharedProcesses, shared_processes, until_idle

from .conftest import scrape as metric

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from dynamo_trio import Config
    from tests._procs import Output

pytestmark = pytest.mark.slow

PROCS = Path(__file__).with_name("_structured_procs.py")


INFLIGHT = "dynamo_component_inflight_requests"


WORKERS = ("backend", "middle")


@dataclass
class Workers:
    """The shared workers: their ``ready`` events by name."""

    processes: SharedProcesses
    ready: dict[str, dict[str, Any]]


@dataclass
class Running:
    """The shared workers seen from a test's trio loop: their output from its start."""

    workers: Workers
    output: dict[str, Output]

    def alive(self, name: str) -> bool:
        return self.workers.processes.returncode(name) is None


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workers]:
    """``_structured_procs.py worker backend`` and ``... worker middle``, for the module
    (each xdist worker its own)."""
    programs = {name: (str(PROCS), "worker", name) for name in WORKERS}
    with shared_processes(tmp_path_factory.mktemp("structured"), programs) as processes:
        yield Workers(processes, trio.run(_ready, processes))


async def _ready(processes: SharedProcesses) -> dict[str, dict[str, Any]]:
    async with trio.open_nursery() as nursery:
        output = processes.follow(nursery, from_start=True)
        ready = {name: await output[name].wait_for("ready", within=30) for name in WORKERS}
        nursery.cancel_scope.cancel()
    return ready


@pytest.fixture
def env(workers: Workers) -> dict[str, str]:
    """The shared workers' environment: the test's callers and runtime find them with it."""
    return workers.processes.env


@pytest.fixture
async def running(workers: Workers, nursery: trio.Nursery) -> Running:
    """The shared workers, once nothing an earlier test sent is in flight on them."""
    await until_idle(*((ready["status_url"], INFLIGHT) for ready in workers.ready.values()))
    return Running(workers, workers.processes.follow(nursery))


async def backend_client(runtime: DistributedRuntime) -> Any:
    client = await runtime.namespace("dynamo").component("backend").endpoint("generate").client()
    with trio.fail_after(10):
        await client.wait_for_instances()
    return client


async def lease_renewals(file_kv: Path, lease_id: int, count: int) -> None:
    """Wait until the owner of ``lease_id`` (file discovery) has renewed it ``count`` more
    times: its keepalive touches the lease file every third of a TTL."""
    path = FileLayout(file_kv).lease_path(lease_id)
    last, seen = _mtime(path), 0
    with trio.fail_after(60):  # a hang guard only
        while seen < count:
            await trio.sleep(0.05)  # polls another process's file
            now = _mtime(path)
            seen, last = seen + (now is not None and now != last), now


def _mtime(path: Path) -> int | None:
    """The lease file's mtime; ``None`` while it is briefly away: another process's scanner
    moves a lease it judges stale aside and back (a worker starved by a busy machine)."""
    try:
        return path.stat().st_mtime_ns
    except FileNotFoundError:
        return None


async def assert_still_serving(running: Running, client: Any, other: Any, file_kv: Path) -> None:
    """The worker lives, streams other than the failed one flow, and it stays registered."""
    ready = running.workers.ready["backend"]
    with trio.fail_after(30):  # a hang guard only
        await other.__anext__()
    # Renewed a lease's worth of times since: its keepalive outlived the failure.
    await lease_renewals(file_kv, ready["instance_id"], 4)
    assert running.alive("backend")
    assert ready["instance_id"] in client.instance_ids()
    with trio.fail_after(30):  # a hang guard only
        await other.__anext__()


# ---------------------------------------------------------------------------- finding 1


async def test_the_seed_handler_raising_cancelled_error_ends_only_its_request(
    running: Running, config: Config
) -> None:
    worker = running.output["backend"]
    status = running.workers.ready["backend"]["status_url"]
    cancelled = await metric(status, "dynamo_component_cancellation_total")
    errors = await metric(status, "dynamo_component_errors_total")
    async with DistributedRuntime(config) as runtime:
        client = await backend_client(runtime)
        other = await client.generate({"mode": "seed"}, context=Context("other"))
        await other.__anext__()

        ctx = Context("seed")
        stream = await client.generate({"mode": "seed"}, context=ctx)
        received = []
        with trio.fail_after(30):  # a hang guard only
            async for item in stream:
                received.append(item.data())
                if len(received) == 3:
                    ctx.stop_generating()
        assert stream.outcome == "stopped"  # an explicit terminal frame, not a crash
        exit_event = await worker.wait_for("exit", id="seed")
        assert (exit_event["state"], exit_event["how"]) == ("STOPPED", "CancelledError")

        await assert_still_serving(running, client, other, config.discovery.file_kv)
        await other.aclose()
        await worker.wait_for("exit", id="other")
    await until_idle((status, INFLIGHT))
    assert (
        await metric(status, "dynamo_component_cancellation_total") == cancelled + 2
    )  # stop, close
    assert await metric(status, "dynamo_component_errors_total") == errors


@pytest.mark.parametrize(
    ("exception", "error"), [("GeneratorExit", EngineShutdown), ("KeyError", Exception)]
)
async def test_a_handler_raising_ends_only_its_request(
    running: Running, config: Config, exception: str, error: type[Exception]
) -> None:
    worker = running.output["backend"]
    async with DistributedRuntime(config) as runtime:
        client = await backend_client(runtime)
        other = await client.generate({"mode": "seed"}, context=Context("other"))
        await other.__anext__()
        stream = await client.generate(
            {"mode": "raise", "exception": exception}, context=Context("raiser")
        )
        assert (await stream.__anext__()).data() == "first"
        with pytest.raises(error) as raised:
            await stream.__anext__()
        assert getattr(raised.value, "caused_by", None) == exception
        exit_event = await worker.wait_for("exit", id="raiser")
        assert exit_event["how"] == exception
        await assert_still_serving(running, client, other, config.discovery.file_kv)
        await other.aclose()


# ---------------------------------------------------------------------------- findings 2, 3


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [("enclosing_timeout", "scope timeout"), ("scope_exit", "parent finished")],
)
async def test_a_callers_scope_ends_the_remote_work_at_once(
    running: Running, spawn: Callable[..., Any], env: dict[str, str], pattern: str, reason: str
) -> None:
    worker = running.output["backend"]
    status = running.workers.ready["backend"]["status_url"]
    cancelled = await metric(status, "dynamo_component_cancellation_total")
    for_reason = await metric(status, "dynamo_component_cancelled_requests_total", reason=reason)
    caller = await spawn(str(PROCS), "caller", pattern, "backend", env=env, name="caller")
    sent = await caller.wait_for("sent", within=15)
    await worker.wait_for("start", id=sent["id"])
    left = await caller.wait_for("left scope", within=30)
    # The caller's context says why, and the caller still holds the stream object.
    assert left["stream_alive"]
    if pattern == "enclosing_timeout":
        assert (left["state"], left["reason"]) == ("KILLED", "scope timeout")
    else:
        assert (left["state"], left["reason"]) == ("LIVE", None)
    exit_event = await worker.wait_for("exit", id=sent["id"], within=30)
    assert (exit_event["state"], exit_event["reason"]) == ("KILLED", reason)
    assert exit_event["how"] == "Cancelled"  # the handler's scope was cancelled mid-await
    # At once, by the kill frame: its reason is the scope's, while the caller still holds
    # the stream object (the garbage collector never closes it: "stream closed") and its
    # connection lives (heartbeats flow: no "transport lost").
    assert caller.process.returncode is None  # not a dying process's doing either
    await until_idle((status, INFLIGHT))
    assert await metric(status, "dynamo_component_cancellation_total") == cancelled + 1
    after = await metric(status, "dynamo_component_cancelled_requests_total", reason=reason)
    assert after == for_reason + 1


# ---------------------------------------------------------------------------- finding 4: chains


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [("enclosing_timeout", "scope timeout"), ("scope_exit", "parent finished")],
)
async def test_a_callers_scope_reaches_the_end_of_a_chain(
    running: Running, spawn: Callable[..., Any], env: dict[str, str], pattern: str, reason: str
) -> None:
    backend, middle = running.output["backend"], running.output["middle"]
    status = running.workers.ready["backend"]["status_url"]
    cancelled = await metric(status, "dynamo_component_cancellation_total")
    caller = await spawn(str(PROCS), "caller", pattern, "middle", env=env, name="caller")
    sent = await caller.wait_for("sent", within=15)
    left = await caller.wait_for("left scope", within=30)
    assert left["stream_alive"]  # so ended by the kill frame, as its reason says
    middle_exit = await middle.wait_for("exit", id=sent["id"], within=30)
    backend_exit = await backend.wait_for("exit", id=sent["id"], within=30)
    # One id end to end; the reason travels with the kill, hop by hop.
    assert (middle_exit["state"], middle_exit["reason"]) == ("KILLED", reason)
    assert (backend_exit["state"], backend_exit["reason"]) == ("KILLED", reason)
    await until_idle((status, INFLIGHT))
    assert await metric(status, "dynamo_component_cancellation_total") == cancelled + 1
