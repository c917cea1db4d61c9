"""Serving a test ASGI app behind the edge on hypercorn, on 127.0.0.1."""

from __future__ import annotations

from functools import partial
from typing import Any

import trio
from hypercorn.config import Config as HypercornConfig

from dynamo_trio.edge import Edge, listen_sockets, serve_http


async def answer_lifespan(receive: Any, send: Any) -> None:
    """A test app's whole lifespan protocol: start-up and shutdown both succeed."""
    while (await receive())["type"] != "lifespan.shutdown":
        await send({"type": "lifespan.startup.complete"})
    await send({"type": "lifespan.shutdown.complete"})


async def _serve(app: Any, *, task_status: trio.TaskStatus[list[str]], **options: Any) -> None:
    config = HypercornConfig()
    config.accesslog = None
    config.graceful_timeout = 1
    await serve_http(
        app,
        config,
        trio.sleep_forever,
        sockets=listen_sockets(["127.0.0.1:0"]),
        task_status=task_status,
        **options,
    )


async def served_bare(nursery: trio.Nursery, app: Any, **options: Any) -> str:
    """``app`` (any ASGI app: an :class:`Edge` or not) served in ``nursery``; its URL.
    ``options``: :func:`serve_http`'s keyword arguments."""
    binds: list[str] = await nursery.start(partial(_serve, app, **options))
    return binds[0]


async def served(nursery: trio.Nursery, app: Any, **edge: Any) -> str:
    """``app`` behind an :class:`Edge` (``edge``: its keyword arguments), served in
    ``nursery``; its URL."""
    return await served_bare(nursery, Edge([], app, **edge))
