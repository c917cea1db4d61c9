"""Processes for the structured-cancellation tests (``test_structured.py``).

``python tests/e2e/_structured_procs.py worker backend`` serves
``dynamo/backend/generate``; ``... worker middle`` serves ``dynamo/middle/generate``
and forwards every request to the backend with its incoming context, as the
seed's snippet does (``yield response``).  Both report JSON lines on stdout,
with ``time.monotonic()`` stamps (one clock for every process on this host).

The backend's ``mode`` (in the request):

* ``silent``: yield once, then wait for ever (a long prefill);
* ``seed``: the seed's handler, ``if context.is_stopped(): raise asyncio.CancelledError``;
* ``raise``: yield once, then raise the exception named by ``exception``.

``... caller PATTERN`` opens one call and cancels it the way ``PATTERN`` says,
keeping the stream object referenced throughout (so the garbage collector can
never be what ends the remote work):

* ``enclosing_timeout``: the call runs in ``parent.scope()`` under a
  ``trio.move_on_after``; the deadline strikes while the caller awaits
  something else;
* ``scope_exit``: the caller leaves ``parent.scope()`` normally with the call open.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import TYPE_CHECKING, Any

import trio

from dynamo_trio import Context, DistributedRuntime, dynamo_worker

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

_EXCEPTIONS: dict[str, type[BaseException]] = {
    "CancelledError": asyncio.CancelledError,
    "GeneratorExit": GeneratorExit,
    "KeyError": KeyError,
}


def report(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, "t": time.monotonic(), **fields}), flush=True)


async def backend(request: dict[str, Any], context: Context) -> AsyncIterator[Any]:
    report("start", id=context.id(), mode=request["mode"])
    how = "returned"
    try:
        if request["mode"] == "seed":
            for i in range(1000):
                if context.is_stopped():
                    raise asyncio.CancelledError
                await trio.sleep(0.02)
                yield i
        elif request["mode"] == "raise":
            yield "first"
            raise _EXCEPTIONS[request["exception"]]()
        else:
            yield "first"
            await trio.sleep_forever()
    except BaseException as exc:
        how = type(exc).__name__
        raise
    finally:
        report(
            "exit",
            id=context.id(),
            state=context.state.name,
            reason=context.reason.value if context.reason else None,
            how=how,
        )


@dynamo_worker()
async def worker(runtime: DistributedRuntime, component: str) -> None:
    endpoint = runtime.namespace("dynamo").component(component).endpoint("generate")
    if component == "backend":
        handler = backend
    else:
        client = (
            await runtime.namespace("dynamo").component("backend").endpoint("generate").client()
        )
        await client.wait_for_instances()

        async def handler(request: Any, context: Context) -> AsyncIterator[Any]:
            report("start", id=context.id(), mode="middle")
            try:
                stream = await client.generate(request, context=context)
                async for response in stream:
                    yield response
            finally:
                report(
                    "exit",
                    id=context.id(),
                    state=context.state.name,
                    reason=context.reason.value if context.reason else None,
                )

    async with trio.open_nursery() as nursery:
        nursery.start_soon(endpoint.serve_endpoint, handler)
        own = await endpoint.client()
        await own.wait_for_instances()
        report("ready", instance_id=runtime.instance_id, status_url=runtime.status_url)


@dynamo_worker()
async def caller(runtime: DistributedRuntime, pattern: str, component: str) -> None:
    client = await runtime.namespace("dynamo").component(component).endpoint("generate").client()
    await client.wait_for_instances()
    parent = Context()
    keep: list[Any] = []
    with trio.CancelScope() as enclosing:  # a timeout, once the remote work has begun
        async with parent.scope():
            stream = await client.generate({"mode": "silent"}, context=parent)
            keep.append(stream)
            report("sent", id=parent.id())
            await stream.__anext__()
            report("first item", id=parent.id())
            if pattern == "enclosing_timeout":
                enclosing.deadline = trio.current_time()
                await trio.sleep_forever()  # something else: the deadline strikes here
    report(
        "left scope",
        id=parent.id(),
        state=parent.state.name,
        reason=parent.reason.value if parent.reason else None,
        stream_alive=bool(keep),
    )
    await trio.sleep_forever()  # still holding the stream: only the scope ended its work


if __name__ == "__main__":
    if sys.argv[1] == "worker":
        trio.run(worker, sys.argv[2])
    else:
        trio.run(caller, sys.argv[2], sys.argv[3])
