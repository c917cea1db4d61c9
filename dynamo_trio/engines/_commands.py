"""``dynamo-trio transformers`` and ``dynamo-trio vllm``: a worker serving a checkpoint.

Dynamo's ``python -m dynamo.vllm --model ...``, in trio.  The engine library
is imported once the worker starts; the flags of the settings are every command's
(:func:`~dynamo_trio._config.add_flags`).
"""

from __future__ import annotations

import argparse
import importlib.util
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from .._config import add_flags, config_from_args
from .._startup import run_command

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..runtime import DistributedRuntime


def _common_flags(parser: argparse.ArgumentParser, engine: str) -> None:
    parser.add_argument(
        "--model", required=True, type=Path, help="the checkpoint directory (local files only)"
    )
    parser.add_argument(
        "--served-model-name", help="the model's name for clients (default: the directory's name)"
    )
    parser.add_argument(
        "--endpoint",
        default=f"dynamo.{engine}.generate",
        help=f"namespace.component.endpoint to serve (default dynamo.{engine}.generate)",
    )
    add_flags(parser)


def _parse(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None, *, needs: tuple[str, ...]
) -> argparse.Namespace:
    args = parser.parse_args(argv)
    if not args.model.is_dir():
        parser.error(f"--model {args.model}: not a directory")
    missing = [name for name in needs if importlib.util.find_spec(name) is None]
    if missing:
        parser.error(
            f"this worker needs {', '.join(missing)}: not installed here "
            "(docs/engines.md has the install line)"
        )
    if args.served_model_name is None:
        args.served_model_name = args.model.resolve().name
    try:
        args.config = config_from_args(args)
    except ValueError as exc:  # an invalid DYN_* value or combination of settings
        parser.error(str(exc))
    return args


def transformers_main(argv: Sequence[str] | None = None) -> None:
    """``python -m dynamo_trio transformers --model DIR``."""
    parser = argparse.ArgumentParser(
        prog="dynamo-trio transformers",
        description=(
            "A worker serving a Hugging Face transformers checkpoint "
            "(chat, completions, embeddings)."
        ),
    )
    _common_flags(parser, "transformers")
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16", "float16"],
        help="the weights' dtype (default: the checkpoint's)",
    )
    parser.add_argument(
        "--max-concurrency", type=int, default=1, help="requests generated at once (default 1)"
    )
    parser.add_argument(
        "--default-max-tokens",
        type=int,
        default=512,
        help="tokens generated for a request that names no max_tokens (default 512)",
    )
    args = _parse(parser, argv, needs=("torch", "transformers"))
    from ..runtime._runtime import dynamo_worker
    from ._transformers import serve_transformers

    @dynamo_worker(args.config)
    async def worker(runtime: DistributedRuntime) -> None:
        await serve_transformers(
            runtime,
            args.model,
            model_name=args.served_model_name,
            endpoint=args.endpoint,
            dtype=args.dtype,
            max_concurrency=args.max_concurrency,
            default_max_tokens=args.default_max_tokens,
        )

    run_command(parser.prog, worker)


def vllm_main(argv: Sequence[str] | None = None) -> None:
    """``python -m dynamo_trio vllm --model DIR``."""
    parser = argparse.ArgumentParser(
        prog="dynamo-trio vllm",
        description="A worker serving a checkpoint with vLLM's AsyncLLM (chat, completions).",
    )
    _common_flags(parser, "vllm")
    parser.add_argument("--dtype", help="vLLM's dtype (default: auto; float32 on CPU is safest)")
    parser.add_argument("--max-model-len", type=int, help="vLLM's max_model_len")
    parser.add_argument(
        "--gpu-memory-utilization",
        type=float,
        help="vLLM's gpu_memory_utilization (on CPU: the share of memory for the KV cache)",
    )
    args = _parse(parser, argv, needs=("torch", "transformers", "vllm"))
    from ._vllm import run_vllm_worker

    run_command(
        parser.prog,
        partial(
            run_vllm_worker,
            args.config,
            args.model,
            model_name=args.served_model_name,
            endpoint=args.endpoint,
            dtype=args.dtype,
            max_model_len=args.max_model_len,
            gpu_memory_utilization=args.gpu_memory_utilization,
        ),
    )
