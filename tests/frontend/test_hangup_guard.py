"""The hang-up guard hears a connection end from the edge's reading task (in memory)."""

from __future__ import annotations

import weakref
from typing import Any

import trio
from prometheus_client import CollectorRegistry

from dynamo_trio import Context
from dynamo_trio._context import CancelReason
from dynamo_trio.edge import CONNECTION_GONE, ConnectionGone
from dynamo_trio.frontend._hangup import HangUpGuard, RequestLifecycle, bind_to_request
from dynamo_trio.metrics import FrontendMetrics


def scope(gone: ConnectionGone) -> Any:
    return {"type": "http", "state": {CONNECTION_GONE: gone}}


async def never(*_: Any) -> Any:
    await trio.sleep_forever()


async def run_guarded(gone: ConnectionGone, *, finish_first: bool) -> RequestLifecycle:
    """A request under the guard whose connection ends while its work runs (after its
    work completed, with ``finish_first``); the request's receiving task never runs."""
    tracker = FrontendMetrics(CollectorRegistry()).start_request("m", "chat_completions", "stream")
    lifecycle = RequestLifecycle(Context(), tracker, policy="kill", request_kind="chat")

    async def app(scope: Any, receive: Any, send: Any) -> None:
        bind_to_request(lifecycle)
        if finish_first:
            lifecycle.completed()
        gone.fire()  # what the edge's reading task does when it reads the EOF

    await HangUpGuard(app)(scope(gone), never, never)
    return lifecycle


async def test_the_connection_ending_kills_the_request_at_once() -> None:
    lifecycle = await run_guarded(ConnectionGone(), finish_first=False)
    assert lifecycle.client_is_gone
    assert lifecycle.context.is_killed()
    assert lifecycle.context.reason is CancelReason.CLIENT_DISCONNECT


async def test_a_completed_request_is_not_cancelled_by_the_connection_ending() -> None:
    lifecycle = await run_guarded(ConnectionGone(), finish_first=True)
    assert not lifecycle.client_is_gone
    assert not lifecycle.context.is_stopped()


async def test_a_keep_alive_connection_holds_no_ended_request() -> None:
    """The guard takes its callback back when the request ends: a connection that
    carries many requests keeps none of them alive."""
    gone = ConnectionGone()

    async def one_request() -> weakref.ref[Context]:
        tracker = FrontendMetrics(CollectorRegistry()).start_request(
            "m", "chat_completions", "stream"
        )
        lifecycle = RequestLifecycle(Context(), tracker, policy="kill", request_kind="chat")

        async def app(scope: Any, receive: Any, send: Any) -> None:
            bind_to_request(lifecycle)
            lifecycle.completed()

        await HangUpGuard(app)(scope(gone), never, never)
        return weakref.ref(lifecycle.context)  # (what the lifecycle holds)

    ended = await one_request()
    assert ended() is None  # freed by reference counting: nothing in `gone` holds it
    assert not gone.gone
