"""Cancellation across real processes: callers and workers that die, hang, or shut down."""

from __future__ import annotations

import signal
import struct
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import trio

from dynamo_trio import CannotConnect, Config, Context, Disconnected
from dynamo_trio.request_plane import parse_address
from dynamo_trio.runtime import DistributedRuntime
from tests._memhttp import TLS

from .._streams import drain_cut_by_shutdown
from .conftest import PROCS, e2e_environment, scrape, start_worker

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path


pytestmark = pytest.mark.slow


async def client_for(runtime: DistributedRuntime) -> Any:
    client = await runtime.namespace("dynamo").component("backend").endpoint("generate").client()
    with trio.fail_after(10):
        await client.wait_for_instances()
    return client


@pytest.mark.parametrize("mode", ["count", "silent"])
async def test_a_killed_caller_process_kills_the_work(
    spawn: Callable[..., Any], env: dict[str, str], mode: str
) -> None:
    # Heartbeats would find the dead caller out only after 30 s: a loss seen within the
    # wait below was seen from the connection's EOF, not at a heartbeat or the next item.
    worker, ready = await start_worker(spawn, {**env, "DYN_HEARTBEAT_TIMEOUT_SECS": "30"})
    caller = await spawn(str(PROCS), "caller", mode, env=env, name="caller")
    sent = await caller.wait_for("sent")
    await worker.wait_for("start", id=sent["id"])
    if mode == "count":
        await caller.wait_for("item")
    caller.signal(signal.SIGKILL)
    exit_event = await worker.wait_for("exit", id=sent["id"], within=5)
    assert exit_event["state"] == "KILLED"
    assert exit_event["reason"] == "transport lost"
    # Ended at once: its scope cancelled at an await, or (counting) closed at a yield
    # whose item was waiting to be sent.
    assert exit_event["how"] in (
        ("Cancelled", "GeneratorExit") if mode == "count" else ("Cancelled",)
    )
    status = ready["status_url"]
    assert await scrape(status, "dynamo_component_cancellation_total") == 1
    assert await scrape(status, "dynamo_component_inflight_requests") == 0
    async with httpx.AsyncClient(verify=TLS) as http:
        assert (await http.get(f"{status}/debug/requests")).json() == []


async def test_a_half_open_caller_is_caught_by_heartbeats(
    spawn: Callable[..., Any], env: dict[str, str]
) -> None:
    worker, _ = await start_worker(spawn, env)
    caller = await spawn(str(PROCS), "caller", "silent", env=env, name="caller")
    sent = await caller.wait_for("sent")
    await worker.wait_for("start", id=sent["id"])
    caller.signal(signal.SIGSTOP)  # its kernel still ACKs; its process says nothing
    stopped_at = trio.current_time()
    # No EOF ever comes from a stopped process: only the heartbeat timeout can end it.
    exit_event = await worker.wait_for("exit", id=sent["id"], within=30)  # a hang guard only
    elapsed = trio.current_time() - stopped_at
    assert exit_event["reason"] == "transport lost"
    timeout = float(env["DYN_HEARTBEAT_TIMEOUT_SECS"])
    interval = float(env["DYN_HEARTBEAT_INTERVAL_SECS"])
    # Not before the peer had been silent for the timeout (a busy machine only delays it).
    assert elapsed >= timeout - interval


async def test_a_killed_worker_raises_disconnected_and_leaves_rotation(
    spawn: Callable[..., Any], env: dict[str, str]
) -> None:
    worker, ready = await start_worker(spawn, env)
    # This caller's heartbeats would find the dead worker out only after 60 s, longer than
    # the hang guard below: a loss seen at all was seen from the connection's EOF.
    patient = Config.from_env({**env, "DYN_HEARTBEAT_TIMEOUT_SECS": "60"})
    async with DistributedRuntime(patient) as runtime:
        client = await client_for(runtime)
        stream = await client.generate({"mode": "count"})
        await stream.__anext__()
        worker.signal(signal.SIGKILL)
        with (
            trio.fail_after(30),  # a hang guard only
            pytest.raises(Disconnected, match="before generation completed") as lost,
        ):
            async for _ in stream:
                pass
        reason = str(lost.value)
        assert "heartbeat" not in reason
        assert "the peer closed the connection" in reason or "connection lost" in reason
        assert ready["instance_id"] not in client.live_instance_ids()
        # Its discovery entry goes when its lease expires (a killed worker deletes nothing).
        with trio.fail_after(60):  # a hang guard only
            await client._view.wait_until(lambda instances: not instances)


async def test_a_worker_dying_after_the_caller_cancelled_ends_quietly(
    spawn: Callable[..., Any], env: dict[str, str], config: Config
) -> None:
    worker, _ = await start_worker(spawn, env)
    async with DistributedRuntime(config) as runtime:
        client = await client_for(runtime)
        ctx = Context()
        stream = await client.generate({"mode": "silent"}, context=ctx)
        await worker.wait_for("start", id=ctx.id())
        ctx.stop()  # the silent handler ignores it
        worker.signal(signal.SIGKILL)
        with trio.fail_after(30):  # a hang guard only
            assert [item async for item in stream] == []


async def test_sigterm_drains_deregisters_and_exits_zero(
    spawn: Callable[..., Any], env: dict[str, str], config: Config
) -> None:
    # Its lease would expire only after 60 s, longer than the hang guard below: an entry
    # gone within it was deleted by the worker on its way out.
    worker, _ = await start_worker(spawn, {**env, "DYN_LEASE_TTL_SECS": "60"})
    async with DistributedRuntime(config) as runtime:
        client = await client_for(runtime)
        ctx = Context()
        stream = await client.generate({"mode": "count", "period": 0.05}, context=ctx)
        await stream.__anext__()
        worker.signal(signal.SIGTERM)
        items = await drain_cut_by_shutdown(stream)
        assert items[-1] == {"final": True}  # the handler drained on the way out
        assert stream.outcome == "stopped"
        exit_event = await worker.wait_for("exit", id=ctx.id())
        assert (exit_event["state"], exit_event["reason"]) == ("STOPPED", "shutdown")
        assert await worker.wait_exit() == 0
        await worker.wait_for("shut down")
        # Deregistered on the way out, not left to expire.
        with trio.fail_after(30):  # a hang guard only
            await client._view.wait_until(lambda instances: not instances)


async def test_garbage_closes_one_connection_and_the_worker_serves_on(
    spawn: Callable[..., Any], env: dict[str, str], config: Config
) -> None:
    worker, ready = await start_worker(spawn, env)
    host, port = parse_address(ready["address"])
    for garbage in (
        b"\x00\x00\x00\x05hello",  # a body that is not msgpack
        struct.pack(">I", 1 << 30),  # announces a 1 GiB frame
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",  # the wrong protocol entirely
    ):
        stream = await trio.open_tcp_stream(host, port)
        await stream.send_all(garbage)
        with trio.fail_after(30):  # a hang guard only
            while await stream.receive_some(65536):
                pass  # read the worker's close frame, then EOF
        await stream.aclose()
    with trio.fail_after(30):  # a hang guard only
        while worker.stderr.count(b"protocol error") < 3:
            await worker.changed()
    async with DistributedRuntime(config) as runtime:
        client = await client_for(runtime)
        assert [i.data() async for i in await client.generate({"mode": "echo"})] == [
            {"mode": "echo"}
        ]


async def test_a_shared_token_authenticates_connections(
    spawn: Callable[..., Any], tmp_path: Path
) -> None:
    env = e2e_environment(tmp_path, DYN_REQUEST_PLANE_TOKEN="s3cret")
    await start_worker(spawn, env)
    wrong = Config.from_env({**env, "DYN_REQUEST_PLANE_TOKEN": "guess"})
    async with DistributedRuntime(wrong) as runtime:
        client = await client_for(runtime)
        with pytest.raises(CannotConnect, match="unauthenticated"):
            await client.generate({"mode": "echo"})
    async with DistributedRuntime(Config.from_env(env)) as runtime:
        client = await client_for(runtime)
        assert len([i async for i in await client.generate({"mode": "echo"})]) == 1


async def test_a_second_sigterm_exits_at_once_whatever_the_handlers_do(
    spawn: Callable[..., Any], env: dict[str, str], config: Config
) -> None:
    """A handler stuck in a thread that cannot be cancelled holds the graceful shutdown
    (its grace is long here); a second signal ends the process all the same."""
    worker, _ = await start_worker(spawn, {**env, "DYN_SHUTDOWN_GRACE_SECS": "600"})
    async with DistributedRuntime(config) as runtime:
        client = await client_for(runtime)
        ctx = Context()
        stream = await client.generate({"mode": "thread"}, context=ctx)
        await worker.wait_for("start", id=ctx.id())
        worker.signal(signal.SIGTERM)
        await worker.wait_for_log("shutting down gracefully")
        worker.signal(signal.SIGTERM)
        assert await worker.wait_exit() == 128 + signal.SIGTERM
        with pytest.raises(Disconnected):
            async for _ in stream:
                pass
