"""``dynamo-trio mocker`` (``python -m dynamo_trio.mocker``): one mock worker process; its flags
are the settings' (``add_flags``), the models to serve, and one per MockerSettings field."""

from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING, Final

from .._config import add_flags, config_from_args
from .._gc import tune_memory
from .._startup import run_command
from ..runtime._runtime import dynamo_worker
from ._settings import MockerSettings
from ._worker import serve_mocker

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..runtime import DistributedRuntime

MODELS: Final = (
    ("model_name", "mock-model", "the chat/completions model to serve"),
    ("embedding_model_name", "mock-embedding", "an embeddings model to serve"),
    ("tensor_model_name", "mock-tensor", "a tensor model to serve (OUTPUT0 = INPUT0; KServe gRPC)"),
    ("image_model_name", "mock-image", "an images model to serve (PNG or JPEG pictures)"),
    ("video_model_name", "mock-video", "a videos model to serve (JPEG frames)"),
    ("speech_model_name", "mock-speech", "an audio speech model to serve (a WAV or PCM tone)"),
)
"""Each model a mock worker may serve: its argument, ``run``'s name for it, and what it is."""
_ENGINE_FIELDS: Final = dataclasses.fields(MockerSettings)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_mocker_flags(parser: argparse.ArgumentParser, *, named: bool) -> None:
    """The model names (``named``: defaulting to ``run``'s) and the engine's settings."""
    for name, model, doc in MODELS:
        parser.add_argument(_flag(name), default=model if named else None, help=doc)
    group = parser.add_argument_group("mock engine settings (MockerSettings)")
    for item in _ENGINE_FIELDS:
        help_text = f"MockerSettings.{item.name} (default {item.default})"
        group.add_argument(
            _flag(item.name), type=type(item.default), default=item.default, help=help_text
        )


def mocker_argv(args: argparse.Namespace, models: Sequence[str]) -> list[str]:
    """The flags of a mocker serving ``models`` with the engine settings in ``args``."""
    argv: list[str] = []
    for name in (*models, *(item.name for item in _ENGINE_FIELDS)):
        argv += [_flag(name), str(getattr(args, name))]
    return argv


def main(argv: Sequence[str] | None = None) -> None:
    """``dynamo-trio mocker --model-name NAME [flags]``."""
    parser = argparse.ArgumentParser(
        prog="dynamo-trio mocker",
        description="A mock LLM worker: deterministic tokens at a configurable rate.",
    )
    parser.add_argument("--component", default="mocker", help="the component to serve")
    add_mocker_flags(parser, named=False)
    add_flags(parser)
    args = parser.parse_args(argv)
    names = {name: getattr(args, name) for name, _, _ in MODELS}
    if not any(names.values()):
        parser.error(f"give one of {', '.join(_flag(name) for name, _, _ in MODELS)}")
    try:
        config = config_from_args(args)
        engine = MockerSettings(**{item.name: getattr(args, item.name) for item in _ENGINE_FIELDS})
    except ValueError as exc:
        parser.error(str(exc))
    tune_memory(config.gc_threshold)

    @dynamo_worker(config)
    async def worker(runtime: DistributedRuntime) -> None:
        await serve_mocker(
            runtime, engine, **names, namespace=config.frontend.namespace, component=args.component
        )

    run_command(parser.prog, worker)
