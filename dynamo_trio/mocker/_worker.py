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
    """Serve each named model on its own endpoint of ``{namespace}/{component}`` until the
    runtime shuts down; the cards carry the settings' limits, so the frontend enforces them."""
    limits: dict[str, Any] = {"context_length": settings.context_length}
    tensor_card: dict[str, Any] = {}
    if tensor_model_name is not None:
        tensor_card["tensor_model_config"] = tensor_model_config(tensor_model_name)
    engine = MockEngine(settings)
    media_engine = MediaEngine(settings)
    served: list[tuple[str | None, str, Any, tuple[ModelType, ...], dict[str, Any]]] = [
        (model_name, "generate", engine.generate, ("chat", "completions"),
         {**limits, "max_output_tokens": settings.max_output_tokens, "accepts_continuation": True}),
        (embedding_model_name, "embed", engine.embed, ("embeddings",), limits),
        (tensor_model_name, "infer", echo_tensor, ("tensor",), tensor_card),
        (image_model_name, "images", media_engine.images, ("images",), {}),
        (video_model_name, "videos", media_engine.videos, ("videos",), {}),
        (speech_model_name, "speech", media_engine.speech, ("audios",), {}),
    ]  # fmt: skip
    if all(name is None for name, *_ in served):
        raise ValueError("give the name of at least one model to serve")
    service = runtime.namespace(namespace).component(component)
    async with trio.open_nursery() as nursery:
        for name, endpoint_name, handler, model_types, card in served:
            if name is None:
                continue
            endpoint = service.endpoint(endpoint_name)
            await nursery.start(endpoint.serve_endpoint, handler)
            for model_type in model_types:
                await endpoint.register_model(name, model_type, **card)
            _log.info("serving %s (%s) at %s", name, ", ".join(model_types), endpoint.path)
