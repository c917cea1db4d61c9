"""Serving the mock engine as a worker: its endpoints and the models it registers."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import trio

from ._engine import MockEngine
from ._media import MediaEngine
from ._tensor import echo_tensor, tensor_model_config

if TYPE_CHECKING:
    from ..discovery import ModelType
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
    image_model_name: str | None = None,
    video_model_name: str | None = None,
    speech_model_name: str | None = None,
    namespace: str = "dynamo",
    component: str = "mocker",
) -> None:
    """Serve the mock engine until the runtime shuts down.

    ``model_name`` is registered as a chat and a completions model on
    ``{namespace}/{component}/generate``; ``embedding_model_name`` as an
    embeddings model on ``{namespace}/{component}/embed``; ``tensor_model_name``
    as a tensor model (``OUTPUT0 = INPUT0``, see :mod:`._tensor`) on
    ``{namespace}/{component}/infer``; ``image_model_name``, ``video_model_name`` and
    ``speech_model_name`` as ``images``, ``videos`` and ``audios`` models (see
    :mod:`._media`) on ``{namespace}/{component}/images``, ``videos``, ``speech``.  The cards carry
    the settings' ``context_length`` (and ``max_output_tokens`` for text), so
    the frontend refuses requests over them before calling the worker; the
    text cards say the engine accepts continuations (request migration).
    """
    media: list[tuple[str | None, str, ModelType]] = [
        (image_model_name, "images", "images"),
        (video_model_name, "videos", "videos"),
        (speech_model_name, "speech", "audios"),
    ]
    names = (model_name, embedding_model_name, tensor_model_name, *(m for m, _, _ in media))
    if all(name is None for name in names):
        raise ValueError("give the name of at least one model to serve")
    engine = MockEngine(settings)
    media_engine = MediaEngine(settings)
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
        for name, endpoint_name, model_type in media:
            if name is None:
                continue
            endpoint = service.endpoint(endpoint_name)
            await nursery.start(endpoint.serve_endpoint, getattr(media_engine, endpoint_name))
            await endpoint.register_model(name, model_type)
            _log.info("serving %s (%s) at %s", name, model_type, endpoint.path)
