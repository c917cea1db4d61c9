"""A frontend and a worker in one process: quart's test client in front of the real
pipeline, a worker runtime behind it on a memory store (the request plane is real TCP).

For what a worker can do to the frontend (hostile or broken workers): each test
serves its own handler as model ``m`` and reads the frontend's answers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import trio

from dynamo_trio._config import FrontendConfig
from dynamo_trio.discovery import MemoryStore
from dynamo_trio.frontend._app import build_app
from dynamo_trio.frontend._pipeline import Pipeline
from dynamo_trio.runtime import DistributedRuntime
from tests.request_plane._harness import wait_until
from tests.runtime.conftest import TEST_CONFIG

if TYPE_CHECKING:
    from collections.abc import Callable

    from quart_trio import QuartTrio

    from dynamo_trio.discovery import ModelType

MODEL = "m"
CHAT = "/v1/chat/completions"


async def _hold(opened: Any, *, task_status: trio.TaskStatus[Any]) -> None:
    async with opened as value:
        task_status.started(value)
        await trio.sleep_forever()


async def frontend_with_worker(
    nursery: trio.Nursery,
    handler: Callable[..., Any],
    *,
    config: FrontendConfig | None = None,
    instances: int = 1,
    model_type: ModelType = "chat",
) -> QuartTrio:
    """The frontend's app, once it lists model ``m`` served by ``handler`` in
    ``instances`` worker runtimes (each accepts continuations), as a ``model_type`` model."""
    app, _ = await frontend_and_pipeline(
        nursery, handler, config=config, instances=instances, model_type=model_type
    )
    return app


async def frontend_and_pipeline(
    nursery: trio.Nursery,
    handler: Callable[..., Any],
    *,
    config: FrontendConfig | None = None,
    instances: int = 1,
    model_type: ModelType = "chat",
) -> tuple[QuartTrio, Pipeline]:
    """:func:`frontend_with_worker`'s app, and the pipeline behind it."""
    store = MemoryStore()
    for _ in range(instances):
        worker: DistributedRuntime = await nursery.start(
            _hold, DistributedRuntime(TEST_CONFIG, memory_store=store)
        )
        endpoint = worker.namespace("dynamo").component("backend").endpoint("generate")
        await nursery.start(endpoint.serve_endpoint, handler)
        await endpoint.register_model(MODEL, model_type, accepts_continuation=True)
    frontend: DistributedRuntime = await nursery.start(
        _hold, DistributedRuntime(TEST_CONFIG, memory_store=store)
    )
    pipeline = Pipeline(frontend, config or FrontendConfig(), nursery)
    pipeline.turns.install()  # as serve_frontend does: without it, a waiting stream spins
    await pipeline.start()
    await wait_until(lambda: len(pipeline.models.cards(MODEL, model_type)) >= instances, 5)
    return build_app(pipeline), pipeline


def chat(stream: bool = False, max_tokens: int = 10) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": max_tokens,
        "stream": stream,
    }
