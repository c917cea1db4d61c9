"""A model worker for the frontend tests: the mock engine, plus models that never answer.

Run as ``python tests/e2e/_model_worker.py [--inter-token-latency-ms N] [--ttft-ms N]``,
or in the test's process through :func:`serve_models` (``tests/_serving.py``).
Registers, in namespace ``dynamo``:

* ``mock`` (chat, completions) and ``mock-embed`` (embeddings): the mock engine
  (its text cards accept continuations, so requests can migrate to it);
* ``prefill`` (chat, completions): a "prefill" that never ends: no token, ever;
* ``stall`` (chat, completions): three tokens, then silence for ever (a stuck engine);
* ``slow-embed`` (embeddings): an embedding that never comes;
* ``mock-image``, ``mock-video``, ``mock-speech`` (images, videos, audios): the mock
  media engine, a step every ``--media-step-ms``; ``prefill`` is also an images,
  videos and audios model whose answer never comes.

Every handler reports ``start`` (with the context's trace fields, the length of
a continuation it was given, and the seconds left before the request's
deadline) and ``exit`` (with the context's final state and reason, and how the
generator ended) as JSON lines on stdout.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, cast

import trio

from dynamo_trio.mocker import MediaEngine, MockEngine, MockerSettings
from dynamo_trio.runtime import DistributedRuntime, dynamo_worker

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator

    from dynamo_trio import Context


def report(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


Report = Callable[..., None]
"""``report(event, **fields)``: where the handlers' ``start`` and ``exit`` events go."""


def reporting(
    name: str, handler: Callable[..., AsyncIterator[Any]], report: Report = report
) -> Callable[..., Any]:
    async def wrapped(request: Any, context: Context) -> AsyncIterator[Any]:
        continuation = request.get("continuation") if isinstance(request, dict) else None
        continued = len(continuation.get("token_ids", ())) if continuation else None
        report(
            "start",
            id=context.id(),
            model=name,
            trace_id=context.trace_id,
            span_id=context.span_id,
            parent_span_id=context.parent_span_id,
            continued=continued,
            remaining=context.time_remaining(),
        )
        how, items = "returned", 0
        last: Any = None
        produced = cast("AsyncGenerator[Any, None]", handler(request, context))
        try:
            async for item in produced:
                items += 1
                last = item
                yield item
        except BaseException as exc:
            how = type(exc).__name__
            raise
        finally:
            try:  # closed here, not by the garbage collector, however this generator ends
                await produced.aclose()
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


async def stalls(request: Any, context: Context) -> AsyncIterator[Any]:
    for token_id in range(3):
        yield {"text": f" t{token_id}", "token_ids": [token_id]}
    await trio.sleep_forever()


async def serve_models(
    runtime: DistributedRuntime,
    settings: MockerSettings,
    report: Report = report,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve and register every model above on ``runtime``, until cancelled."""
    engine = MockEngine(settings)
    media = MediaEngine(settings)
    namespace = runtime.namespace("dynamo")
    served: list[tuple[str, str, Callable[..., Any], tuple[str, ...]]] = [
        ("mock", "generate", engine.generate, ("chat", "completions")),
        ("mock-embed", "embed", engine.embed, ("embeddings",)),
        ("prefill", "generate", never_answers, ("chat", "completions")),
        ("stall", "generate", stalls, ("chat", "completions")),
        ("slow-embed", "embed", never_answers, ("embeddings",)),
        ("prefill", "media", never_answers, ("images", "videos", "audios")),
        ("mock-image", "images", media.images, ("images",)),
        ("mock-video", "videos", media.videos, ("videos",)),
        ("mock-speech", "speech", media.speech, ("audios",)),
    ]
    async with trio.open_nursery() as nursery:
        for model, endpoint_name, handler, types in served:
            endpoint = namespace.component(model).endpoint(endpoint_name)
            await nursery.start(endpoint.serve_endpoint, reporting(model, handler, report))
            for model_type in types:
                await endpoint.register_model(
                    model,
                    model_type,  # type: ignore[arg-type]
                    accepts_continuation=model == "mock" and model_type != "embeddings",
                )
        task_status.started()


@dynamo_worker()
async def main(
    runtime: DistributedRuntime, inter_token_latency_ms: float, ttft_ms: float, media_step_ms: float
) -> None:
    settings = MockerSettings(
        inter_token_latency_ms=inter_token_latency_ms, ttft_ms=ttft_ms, media_step_ms=media_step_ms
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_models, runtime, settings)
        report("ready", status_url=runtime.status_url, instance_id=runtime.instance_id)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--inter-token-latency-ms", type=float, default=20.0)
    parser.add_argument("--ttft-ms", type=float, default=0.0)
    parser.add_argument("--media-step-ms", type=float, default=20.0)
    args = parser.parse_args()
    trio.run(main, args.inter_token_latency_ms, args.ttft_ms, args.media_step_ms)
