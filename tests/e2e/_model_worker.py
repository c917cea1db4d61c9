"""A model worker for the frontend tests: the mock engine, plus models that never answer.

Run as ``python tests/e2e/_model_worker.py [--inter-token-latency-ms N]``.
Registers, in namespace ``dynamo``:

* ``mock`` (chat, completions) and ``mock-embed`` (embeddings): the mock engine;
* ``prefill`` (chat, completions): a "prefill" that never ends: no token, ever;
* ``slow-embed`` (embeddings): an embedding that never comes.

Every handler reports ``start`` (with the context's trace fields) and ``exit``
(with the context's final state and reason, and how the generator ended) as
JSON lines on stdout.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

import trio

from dynamo_trio.mocker import MockEngine, MockerSettings
from dynamo_trio.runtime import DistributedRuntime, dynamo_worker

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from dynamo_trio import Context


def report(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def reporting(name: str, handler: Callable[..., AsyncIterator[Any]]) -> Callable[..., Any]:
    async def wrapped(request: Any, context: Context) -> AsyncIterator[Any]:
        report(
            "start",
            id=context.id(),
            model=name,
            trace_id=context.trace_id,
            span_id=context.span_id,
            parent_span_id=context.parent_span_id,
        )
        how, items = "returned", 0
        last: Any = None
        try:
            async for item in handler(request, context):
                items += 1
                last = item
                yield item
        except BaseException as exc:
            how = type(exc).__name__
            raise
        finally:
            report(
                "exit",
                id=context.id(),
                model=name,
                state=context.state.name,
                reason=context.reason.value if context.reason else None,
                how=how,
                items=items,
                last=last if isinstance(last, dict) else None,
            )

    return wrapped


async def never_answers(request: Any, context: Context) -> AsyncIterator[Any]:
    await trio.sleep_forever()
    yield None  # unreachable


@dynamo_worker()
async def main(runtime: DistributedRuntime, inter_token_latency_ms: float) -> None:
    engine = MockEngine(MockerSettings(inter_token_latency_ms=inter_token_latency_ms))
    namespace = runtime.namespace("dynamo")
    served: list[tuple[str, str, Callable[..., Any], tuple[str, ...]]] = [
        ("mock", "generate", engine.generate, ("chat", "completions")),
        ("mock-embed", "embed", engine.embed, ("embeddings",)),
        ("prefill", "generate", never_answers, ("chat", "completions")),
        ("slow-embed", "embed", never_answers, ("embeddings",)),
    ]
    async with trio.open_nursery() as nursery:
        for model, endpoint_name, handler, types in served:
            endpoint = namespace.component(model).endpoint(endpoint_name)
            await nursery.start(endpoint.serve_endpoint, reporting(model, handler))
            for model_type in types:
                await endpoint.register_model(model, model_type)  # type: ignore[arg-type]
        report("ready", status_url=runtime.status_url)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--inter-token-latency-ms", type=float, default=20.0)
    trio.run(main, parser.parse_args().inter_token_latency_ms)
