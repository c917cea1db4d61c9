"""A finished request's objects are freed by reference counting, not by the cyclic GC.

Every object left in a reference cycle waits for a collection of the cyclic
garbage collector, and under load those collections were the frontend's
largest single cost (see ``dynamo_trio/_gc.py``).  So a request that ends
normally leaves no cycle behind, on the frontend's side (its context, its
lifecycle, its SSE body) or the worker's (the served stream and its context).

This runs a frontend and a mock worker in this process (over real HTTP and
real TCP), with the collector off, and counts the request objects still
alive once the requests have ended.  Only the normal ending is checked: a
cancelled or failed request carries an exception whose traceback refers to
its frames, a cycle by nature.
"""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING

import pytest
import trio
import trio.testing

from dynamo_trio import Context, DistributedRuntime, FrontendConfig
from dynamo_trio.discovery import MemoryStore
from dynamo_trio.frontend._app import serve_frontend
from dynamo_trio.frontend._body import Reply
from dynamo_trio.frontend._hangup import RequestLifecycle
from dynamo_trio.mocker import MockerSettings
from dynamo_trio.mocker._worker import serve_mocker
from dynamo_trio.request_plane import ClientStream
from dynamo_trio.request_plane._server import ServerStream
from tests._memhttp import http_client
from tests.runtime.conftest import TEST_CONFIG

from .conftest import wait_for_models

if TYPE_CHECKING:
    from collections.abc import Iterator

KINDS = (Context, RequestLifecycle, Reply, ServerStream, ClientStream)


def _alive() -> dict[str, int]:
    """How many objects of each kind exist, garbage in cycles included (no collection)."""
    counts = dict.fromkeys((kind.__name__ for kind in KINDS), 0)
    for obj in gc.get_objects():
        for kind in KINDS:
            if isinstance(obj, kind):
                counts[kind.__name__] += 1
    return counts


@pytest.fixture
def collector_off() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect()


@pytest.mark.usefixtures("collector_off")
async def test_finished_requests_leave_no_cycles() -> None:
    settings = MockerSettings(ttft_ms=0, inter_token_latency_ms=0)
    store = MemoryStore()
    async with (
        DistributedRuntime(TEST_CONFIG, memory_store=store) as worker,
        DistributedRuntime(TEST_CONFIG, memory_store=store) as frontend,
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(lambda: serve_mocker(worker, settings, model_name="mock"))
        stop = trio.Event()
        url: str = await nursery.start(
            lambda task_status: serve_frontend(
                frontend,
                FrontendConfig(host="127.0.0.1", port=0),
                shutdown_trigger=stop.wait,
                shutdown_grace=1.0,
                task_status=task_status,
            )
        )
        async with http_client(url, timeout=10) as http:
            await wait_for_models(url, {"mock"}, within=10)

            async def requests(n: int) -> None:
                for i in range(n):
                    chat = {
                        "model": "mock",
                        "messages": [{"role": "user", "content": f"hello {i}"}],
                        "max_tokens": 8,
                    }
                    async with http.stream(
                        "POST", "/v1/chat/completions", json={**chat, "stream": True}
                    ) as response:
                        assert response.status_code == 200
                        body = b"".join([piece async for piece in response.aiter_bytes()])
                        assert body.endswith(b"data: [DONE]\n\n")
                    unary = await http.post("/v1/chat/completions", json=chat)
                    assert unary.status_code == 200, unary.text
                    completion = await http.post(
                        "/v1/completions",
                        json={"model": "mock", "prompt": "once", "max_tokens": 4, "stream": True},
                    )
                    assert completion.status_code == 200
                    assert completion.text.endswith("data: [DONE]\n\n")
                # The last request's tasks (the worker's handler, the producer) end
                # right after its last bytes are sent.
                await trio.testing.wait_all_tasks_blocked(0.05)

            await requests(3)  # warm up: connections, pools, metric children
            before = _alive()
            await requests(30)
            after = _alive()
        stop.set()
        nursery.cancel_scope.cancel()
    grown = {kind: after[kind] - before[kind] for kind in after}
    assert grown == dict.fromkeys(grown, 0), (before, after)
