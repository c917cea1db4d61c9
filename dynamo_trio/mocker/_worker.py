"""Serving the mock engine as a worker: its endpoints and the models it registers."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import trio

from ._engine import MockEngine
from ._tensor import echo_tensor, tensor_model_config

if TYPE_CHECKING:
    from ..runtime import DistributedRuntime
    from ._settings import MockerSettings

__all__ = ["serve_mocker"]

_log = logging.getLogger("dynamo_trio.mocker")


async def serve_mocker(
    runtime: DistributedRuntime,
    settings: MockerSettings,
    *,
    model_name: str | None,
    embedding_model_name: str | None = None,
    tensor_model_name: str | None = None,
    namespace: str = "dynamo",
    component: str = "mocker",
) -> None:
    """Serve the mock engine until the runtime shuts down.

    ``model_name`` is registered as a chat and a completions model on
    ``{namespace}/{component}/generate``; ``embedding_model_name`` as an
    embeddings model on ``{namespace}/{component}/embed``; ``tensor_model_name``
    as a tensor model (``OUTPUT0 = INPUT0``, see :mod:`._tensor`) on
    ``{namespace}/{component}/infer``.  The cards carry
    the settings' ``context_length`` (and ``max_output_tokens`` for text), so
    the frontend refuses requests over them before calling the worker; the
    text cards say the engine accepts continuations (request migration).
    """
    if model_name is None and embedding_model_name is None and tensor_model_name is None:
        raise ValueError("give a model name, an embedding model name, a tensor model name")
    engine = MockEngine(settings)
    service = runtime.namespace(namespace).component(component)
    async with trio.open_nursery() as nursery:
        if model_name is not None:
            generate = service.endpoint("generate")
            await nursery.start(generate.serve_endpoint, engine.generate)
            card: dict[str, Any] = {
                "context_length": settings.context_length,
                "max_output_tokens": settings.max_output_tokens,
                "accepts_continuation": True,
            }
            await generate.register_model(model_name, "chat", **card)
            await generate.register_model(model_name, "completions", **card)
            _log.info("serving %s (chat, completions) at %s", model_name, generate.path)
        if embedding_model_name is not None:
            embed = service.endpoint("embed")
            await nursery.start(embed.serve_endpoint, engine.embed)
            await embed.register_model(
                embedding_model_name, "embeddings", context_length=settings.context_length
            )
            _log.info("serving %s (embeddings) at %s", embedding_model_name, embed.path)
        if tensor_model_name is not None:
            infer = service.endpoint("infer")
            await nursery.start(infer.serve_endpoint, echo_tensor)
            await infer.register_model(
                tensor_model_name,
                "tensor",
                tensor_model_config=tensor_model_config(tensor_model_name),
            )
            _log.info("serving %s (tensor) at %s", tensor_model_name, infer.path)
